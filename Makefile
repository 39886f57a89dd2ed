# Two entry points for a fresh clone: `make demo` and `make test`.
# Each does its own set-up: a virtual environment, Python packages, Node
# packages and Debian's chromium (for the browser tests) as needed.

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
NODE_STAMP := js/node_modules/.installed-stamp
CHROMIUM := /usr/bin/chromium

.PHONY: demo test test-py test-js lint js chromium bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[test]"
	touch $(STAMP)

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

demo: $(STAMP)
	$(PY) -m sowviz demo -o report.html

lint: $(STAMP)
	$(VENV)/bin/ruff check sowviz tests benchmarks
	$(VENV)/bin/ruff format --check sowviz tests benchmarks

test-js: $(NODE_STAMP)
	cd js && npm test

test-py: $(STAMP) chromium
	$(PY) -m pytest -q -p no:cacheprovider

test: lint js test-js test-py

bench: $(STAMP)
	for b in benchmarks/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) js/node_modules
