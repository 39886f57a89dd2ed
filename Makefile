# Two entry points for a fresh clone: `make demo` and `make test`.
# Each does its own set-up: virtual environments, Python packages, Node
# packages and Debian's chromium (for the browser tests) as needed.
#
# Two Python environments, because users meet two JAX generations:
#   .venv         the newest Python found (3.12/3.13, pyenv's included), where pip
#                 installs the newest JAX (0.12): the whole suite runs here.
#   .venv-oldest  Python 3.11 with the oldest supported JAX (0.10.2): the engine,
#                 summary, graph, inspection and model-zoo tests run here too.
#   .venv-jax011  Python 3.13 (else 3.12) with JAX 0.11.2 (what CUDA images carry):
#                 the engine and summary tests, and so the newest Python too.

SHELL := /bin/bash
PYENV_ROOT ?= $(HOME)/.pyenv

# The first interpreter that exists and runs: a pyenv shim for a version that is
# not selected fails, so pyenv's own interpreters are tried by path first.
find_python = $(firstword $(foreach p,$(1),$(shell p=$(p); [ -x "$$p" ] || p=$$(command -v $(p) 2>/dev/null); [ -n "$$p" ] && "$$p" -c 'import sys' >/dev/null 2>&1 && echo "$$p")))
PYTHON_NEW ?= $(call find_python,$(wildcard $(PYENV_ROOT)/versions/3.12*/bin/python3.12) $(wildcard $(PYENV_ROOT)/versions/3.13*/bin/python3.13) python3.12 python3.13 python3)
# The JAX 0.11 environment takes the newest Python, so that 3.13 is tested too.
PYTHON_MID ?= $(call find_python,$(wildcard $(PYENV_ROOT)/versions/3.13*/bin/python3.13) python3.13 $(PYTHON_NEW))
PYTHON_OLD ?= $(call find_python,$(wildcard $(PYENV_ROOT)/versions/3.11*/bin/python3.11) python3.11 python3)
OLDEST_JAX := jax==0.10.2 jaxlib==0.10.2
MIDDLE_JAX := jax==0.11.2 jaxlib==0.11.2

VENV := .venv
PY := $(VENV)/bin/python
VENV_OLD := .venv-oldest
PY_OLD := $(VENV_OLD)/bin/python
BASE_STAMP := $(VENV)/.base-stamp
TEST_STAMP := $(VENV)/.test-stamp
OLD_STAMP := $(VENV_OLD)/.test-stamp
VENV_MID := .venv-jax011
PY_MID := $(VENV_MID)/bin/python
MID_STAMP := $(VENV_MID)/.test-stamp
NODE_STAMP := js/node_modules/.installed-stamp
CHROMIUM := /usr/bin/chromium
PYTEST := -m pytest -q -p no:cacheprovider
# Tests that depend on the JAX version (engine, summaries, graph, real models);
# the views are the same on every JAX and run once, on the newest.
OLDEST_TESTS := tests/test_calls.py tests/test_names.py tests/test_refs.py tests/test_capture.py tests/test_summary.py tests/test_graph.py tests/test_repeats.py tests/test_inspection.py tests/test_forwarding.py tests/test_liveness.py tests/test_capture_remat_map.py tests/test_nonfinite_custom.py tests/test_graph_shard.py tests/test_names_transforms.py tests/test_names_lines.py tests/test_repeats_loops.py tests/test_haiku.py tests/test_graph_ports.py tests/test_names_round11.py tests/test_nonfinite_solvers.py tests/test_api_inputs.py tests/test_port_names.py tests/test_summary_programs_shared.py tests/test_frameworks_round12.py tests/test_nonfinite_earlier.py tests/test_names_round12.py tests/test_names_round12b.py tests/test_calls_round12.py tests/test_labels_round12.py tests/test_nonfinite_round12.py tests/test_sharding_labels_round12.py tests/test_names_round13.py tests/test_names_round13b.py tests/test_ports_round13.py tests/test_frameworks_round13.py tests/test_capture_round13.py tests/test_api_round13.py tests/test_nonfinite_round13.py tests/test_view_round13.py tests/zoo tests/test_inspection_round14.py tests/test_collectives_round14.py tests/test_nnx_state_round14.py tests/test_lines_round14.py tests/test_transforms_round14.py tests/test_lines_round14b.py tests/test_errors_round14.py tests/test_nonfinite_round14.py tests/test_round15_nonfinite_gnn.py tests/test_round15_nonfinite_fp16.py tests/test_round15_lines.py tests/test_round15_nnx_outputs.py tests/test_round15_carries.py tests/test_round15_old_jax.py tests/test_round15_names.py tests/test_round15_library_names.py tests/test_round16_odeint.py tests/test_round16_nonfinite_messages.py tests/test_round16_calls.py tests/test_round16_nonfinite_origin.py tests/test_round16_outputs.py tests/test_round16_linen.py tests/test_round16_return_names.py tests/test_round16_equinox.py tests/test_round16_call_lines.py tests/test_round17_errors.py tests/test_round17_nested_ad.py tests/test_round17_tesseract.py tests/test_round17_sharded_modes.py tests/test_round17_rl.py tests/test_round17_line_boxes.py tests/test_round17_nnx.py tests/test_round17_backward_jit.py tests/test_round17_calls_by_line.py tests/test_round17_sharded_view.py tests/test_round18_linen.py tests/test_round18_perf.py tests/test_round19_lead.py tests/test_round19_perf.py tests/test_round19_ragged.py tests/test_round19_graphnets.py tests/test_round19_labels.py tests/test_round19_ports.py tests/test_round19_policy.py tests/test_round19_nanstats.py tests/test_round19_masked.py tests/test_round21_tesscot.py tests/test_round21_monperf.py tests/test_round21_nextmodel.py tests/test_round21_small.py tests/test_round21_review.py tests/test_round21_diffrax.py
MIDDLE_TESTS := tests/test_capture.py tests/test_summary.py tests/test_forwarding.py tests/test_liveness.py tests/test_capture_round13.py tests/test_round16_odeint.py tests/test_round19_ragged.py tests/test_round19_nanstats.py tests/test_round21_nextmodel.py

.PHONY: demo test test-py test-oldest test-jax011 test-js lint js chromium bench clean

# What `make demo` needs: the package alone (no test toolchain).
$(BASE_STAMP): pyproject.toml
	@echo "Python for the newest JAX: $(PYTHON_NEW)"
	[ -x $(PY) ] || $(PYTHON_NEW) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e .
	touch $(BASE_STAMP)

$(TEST_STAMP): $(BASE_STAMP) pyproject.toml
	$(PY) -m pip install -q -e ".[test]"
	touch $(TEST_STAMP)

$(OLD_STAMP): pyproject.toml
	@echo "Python for the oldest supported JAX: $(PYTHON_OLD)"
	[ -x $(PY_OLD) ] || $(PYTHON_OLD) -m venv $(VENV_OLD)
	$(PY_OLD) -m pip install -q --upgrade pip
	$(PY_OLD) -m pip install -q -e ".[test]" $(OLDEST_JAX)
	touch $(OLD_STAMP)

$(MID_STAMP): pyproject.toml
	@echo "Python for JAX 0.11: $(PYTHON_MID)"
	[ -x $(PY_MID) ] || $(PYTHON_MID) -m venv $(VENV_MID)
	$(PY_MID) -m pip install -q --upgrade pip
	$(PY_MID) -m pip install -q -e ".[test]" $(MIDDLE_JAX)
	touch $(MID_STAMP)

$(NODE_STAMP): js/package.json js/package-lock.json
	cd js && npm ci --no-audit --no-fund
	touch $(NODE_STAMP)

# Rebuild the front-end bundle shipped inside the package (sowviz/static).
js: $(NODE_STAMP)
	cd js && npm run build

chromium:
	@if [ ! -x $(CHROMIUM) ]; then \
	  echo "Installing Debian's chromium for the browser tests"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q chromium; \
	fi

demo: $(BASE_STAMP)
	$(PY) -m sowviz demo -o report.html

lint: $(TEST_STAMP)
	$(VENV)/bin/ruff check sowviz tests benchmarks
	$(VENV)/bin/ruff format --check sowviz tests benchmarks

test-js: $(NODE_STAMP)
	cd js && npm test

test-py: $(TEST_STAMP) chromium
	$(PY) -c 'import jax, sys; print("newest:", sys.version.split()[0], "jax", jax.__version__)'
	$(PY) $(PYTEST)

test-oldest: $(OLD_STAMP)
	$(PY_OLD) -c 'import jax, sys; print("oldest:", sys.version.split()[0], "jax", jax.__version__)'
	# two processes (the zoo's real models apart): one process compiling every program
	# of the list once crashed inside XLA's CPU compiler (a segfault in a test that
	# passes alone), so neither holds the other's compiled programs
	$(PY_OLD) $(PYTEST) -m "not browser" $(filter-out tests/zoo,$(OLDEST_TESTS))
	$(PY_OLD) $(PYTEST) -m "not browser" tests/zoo

test-jax011: $(MID_STAMP)
	$(PY_MID) -c 'import jax, sys; print("jax 0.11:", sys.version.split()[0], "jax", jax.__version__)'
	$(PY_MID) $(PYTEST) -m "not browser" $(MIDDLE_TESTS)

test: lint js test-js test-py test-oldest test-jax011

bench: $(TEST_STAMP)
	for b in benchmarks/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) $(VENV_OLD) $(VENV_MID) js/node_modules
