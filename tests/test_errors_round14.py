"""Errors users see (round 14): a bad input to `show`/`inspect` ends its traceback at the
user's call, not in sowviz's internals, in a script and in IPython; a model that is not a
pytree, or a function given as the differentiated argument, is told how to fix it; a
probe's summary reads alike for a while loop's sow (a row of a stack) and a scan's."""

from __future__ import annotations

import pathlib
import re
import traceback

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sowviz
from sowviz import _compat

SOWVIZ_DIR = str(pathlib.Path(sowviz.__file__).parent)


def predictions(w, x):  # not a loss: its output is (4, 2), not a scalar
    return jnp.tanh(x @ w)


def _frames(err: BaseException) -> list[str]:
    return [
        f"{f.f_code.co_filename}:{f.f_code.co_name}"
        for f, _ in traceback.walk_tb(err.__traceback__)
    ]


def _sowviz_frames(err: BaseException) -> list[str]:
    return [f for f in _frames(err) if f.startswith(SOWVIZ_DIR)]


@pytest.fixture
def traceback_filtering():
    """Set JAX's `jax_traceback_filtering` (which sowviz's entries follow) for one test."""
    before = jax.config.jax_traceback_filtering

    def set_mode(mode: str) -> None:
        jax.config.update("jax_traceback_filtering", mode)

    yield set_mode
    jax.config.update("jax_traceback_filtering", before)


# -- finding 1: the traceback of a bad input ends at the user's call -------------------


@pytest.mark.parametrize("entry", ["show", "inspect"])
def test_a_bad_input_has_no_sowviz_frame_in_its_traceback(entry, monkeypatch):
    shown = []
    monkeypatch.setattr(sowviz.widget, "display_now", shown.append)
    call = getattr(sowviz, entry)
    with pytest.raises(TypeError, match="Gradient only defined for scalar-output") as got:
        call(predictions, jnp.ones((3, 2)), jnp.ones((4, 3)), mode="grad")
    assert _sowviz_frames(got.value) == []
    # the traceback starts at this test's call and holds nothing but it
    assert _frames(got.value) == [
        f"{__file__}:{test_a_bad_input_has_no_sowviz_frame_in_its_traceback.__name__}"
    ]
    if entry == "show":  # the widget still says it, in red
        (w,) = shown
        assert w.phase == "error" and w.status.startswith("TypeError: Gradient only defined")


def test_a_wrong_mode_name_fails_at_the_call():
    with pytest.raises(ValueError, match="unknown `mode` 'gradient'") as got:
        sowviz.show(predictions, jnp.ones((3, 2)), jnp.ones((4, 3)), mode="gradient")
    assert _sowviz_frames(got.value) == []


def test_the_users_own_failing_line_stays_in_the_traceback():
    def loss(w, x):
        return jnp.sum(jnp.dot(w, x))  # (3, 2) . (4, 3): a shape error in the user's code

    with pytest.raises(TypeError, match="dot_general requires contracting dimensions") as got:
        sowviz.inspect(loss, jnp.ones((3, 2)), jnp.ones((4, 3)))
    assert f"{__file__}:loss" in _frames(got.value)
    assert _sowviz_frames(got.value) == []


def test_filtering_off_keeps_every_frame(traceback_filtering):
    traceback_filtering("off")
    with pytest.raises(TypeError, match="scalar-output") as got:
        sowviz.inspect(predictions, jnp.ones((3, 2)), jnp.ones((4, 3)))
    assert any(f.endswith(":_check_scalar") for f in _sowviz_frames(got.value))


def _as_ipython_shows(err: BaseException) -> str:
    """`err`'s traceback as an IPython cell shows it (its `InteractiveTB`), without colour."""
    ultratb = pytest.importorskip("IPython.core.ultratb")
    text = ultratb.AutoFormattedTB(mode="Context").text(type(err), err, err.__traceback__)
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def _shown_files(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.lstrip().startswith("File ")]


def test_in_ipython_the_traceback_is_the_users_call_and_the_message_once(traceback_filtering):
    traceback_filtering("tracebackhide")  # JAX's mode under IPython: frames hidden, not cut
    with pytest.raises(TypeError, match="scalar-output") as got:
        sowviz.inspect(predictions, jnp.ones((3, 2)), jnp.ones((4, 3)))
    text = _as_ipython_shows(got.value)
    assert [f for f in _shown_files(text) if SOWVIZ_DIR in f] == [], text
    assert text.count("Gradient only defined for scalar-output functions") == 1, text
    assert "sowviz.inspect(predictions" in text  # the user's line is what it shows


def test_in_ipython_an_error_raised_by_sowviz_below_the_users_line_ends_there(
    traceback_filtering,
):
    """IPython shows the innermost frame even when it is hidden: sowviz's `raise` line
    ended the traceback of a bad `sow` in the user's function."""
    traceback_filtering("tracebackhide")

    def loss(w):
        return jnp.sum(sowviz.sow(w, "") ** 2)  # an empty name: sowviz refuses it

    with pytest.raises(TypeError, match="`name` must be a non-empty string") as got:
        sowviz.inspect(loss, jnp.ones(3))
    text = _as_ipython_shows(got.value)
    files = _shown_files(text)
    assert [f for f in files if SOWVIZ_DIR in f] == [], text
    assert files[-1].startswith(f"File {__file__}") and ".loss(w)" in files[-1], text
    assert "skipping hidden" in text  # JAX's and sowviz's frames between: hidden, and said


def test_a_chained_cause_is_filtered_too():
    @jax.custom_vjp
    def f(x):
        return jnp.sin(x)

    f.defvjp(lambda x: (jnp.sin(x), x), lambda r, g: (g * jnp.cos(r),))
    with pytest.raises(TypeError, match=r"calls a `jax\.custom_vjp` function") as got:
        sowviz.inspect(lambda x: jnp.sum(f(x)), jnp.ones(3), mode="jvp")
    link: BaseException | None = got.value
    while link is not None:  # sowviz's message, then JAX's error it chains
        assert _sowviz_frames(link) == []
        link = link.__cause__


def test_entries_keep_their_signature_and_docs():
    import inspect

    assert "mode" in inspect.signature(sowviz.inspect).parameters
    assert "warm" in inspect.signature(sowviz.show).parameters
    assert sowviz.inspect.__doc__.startswith("Run `fn(*args)` under `mode`")
    assert sowviz.show.__module__ == "sowviz.widget"


# -- finding 2: a model that is not a pytree, a function as the argument ---------------


class PlainModel:  # a plain class: JAX sees one opaque leaf
    def __init__(self):
        self.w = jnp.linspace(-1.0, 1.0, 8).reshape(8, 1)

    def __call__(self, x):
        return x @ self.w


class Outer:  # its arrays one attribute deeper
    def __init__(self):
        self.layer = PlainModel()

    def __call__(self, x):
        return self.layer(x)


def _loss(model, x):
    return jnp.mean(model(x) ** 2)


X = jnp.linspace(-1.0, 1.0, 32).reshape(4, 8)


@pytest.mark.parametrize("model", [PlainModel(), Outer()], ids=["arrays", "nested"])
@pytest.mark.parametrize("mode", ["grad", "vjp"])
def test_a_plain_class_is_told_to_become_a_pytree(model, mode):
    argnums = {"argnums": 0} if mode == "vjp" else {}
    name = type(model).__name__
    with pytest.raises(TypeError, match=rf"`{name}` is not a pytree") as got:
        sowviz.inspect(_loss, model, X, mode=mode, **argnums)
    msg = str(got.value)
    for fix in (
        "equinox.Module",
        "flax.nnx.Module",
        "register_pytree_node_class",
        "register_dataclass",
    ):
        assert fix in msg
    assert "jnp.asarray" not in msg  # the old advice: its arrays already are arrays


def test_the_advice_works_a_registered_class_is_differentiated():
    @jax.tree_util.register_pytree_node_class
    class Model(PlainModel):
        def tree_flatten(self):
            return (self.w,), None

        @classmethod
        def tree_unflatten(cls, aux, children):
            out = object.__new__(cls)
            out.w = children[0]
            return out

    model = Model()
    ins = sowviz.inspect(_loss, model, X)
    want = jax.grad(_loss)(model, X)
    (value, grads) = ins.result
    np.testing.assert_allclose(value, _loss(model, X), rtol=1e-6)
    np.testing.assert_allclose(grads.w, want.w, rtol=1e-6)


def test_a_function_is_no_differentiable_input():
    with pytest.raises(TypeError, match=r"argument 0, which is a function \(`<lambda>`\)") as got:
        sowviz.inspect(_loss, lambda v: v, X)
    assert "not a differentiable input" in str(got.value)
    with pytest.raises(TypeError, match=r"argument 1, which is a function \(`sin`\)"):
        sowviz.inspect(lambda w, f: jnp.sum(f(w)), jnp.ones(3), jnp.sin, argnums=1, mode="vjp")


def test_other_leaves_keep_the_arrays_advice():
    with pytest.raises(TypeError, match=r"its leaves: str\)\. Pass the parameters as arrays"):
        sowviz.inspect(lambda s, w: jnp.sum(w), "abc", jnp.ones(3))


# -- finding 3: `typed_summaries` read alike for a while loop's sow and a scan's ---------

W = jnp.arange(16.0).reshape(4, 4) / 20 - 0.3
H0 = jnp.arange(8.0).reshape(2, 4) / 8


def _steps(n: int) -> list[np.ndarray]:
    h, out = H0, []
    for _ in range(n):
        h = jnp.tanh(h @ W)
        out.append(np.asarray(h))
    return out


def _with_while(w, x):
    def body(c):
        i, h = c
        return i + 1, sowviz.sow(jnp.tanh(h @ w), "h")

    return jnp.sum(jax.lax.while_loop(lambda c: c[0] < 3, body, (0, x))[1] ** 2)


def _with_scan(w, x):
    def body(h, _):
        return sowviz.sow(jnp.tanh(h @ w), "h"), None

    return jnp.sum(jax.lax.scan(body, x, None, length=3)[0] ** 2)


def test_a_while_loops_summary_has_a_summarys_fields():
    s = sowviz.inspect(_with_while, W, H0, mode="jvp").probe("h").typed_summaries["primal"]
    last = _steps(3)[-1]  # loops="last": the last iteration's value
    assert s.shape == last.shape
    np.testing.assert_allclose(float(s.l2), np.linalg.norm(last), rtol=1e-5)
    np.testing.assert_allclose(float(s.mean), last.mean(), rtol=1e-5)
    np.testing.assert_allclose(float(s.max), last.max(), rtol=1e-6)
    assert int(s.count) == last.size and int(s.nan) == 0
    assert s.bins == 64 and s.per_iteration is None and s.size == last.size
    assert int(np.sum(s.hist_counts)) == last.size
    one = s.summary()
    assert isinstance(one, sowviz.Summary) and one.to_json() == s.to_json()
    with pytest.raises(AttributeError, match="no attribute 'l3'"):
        s.l3  # noqa: B018


def test_a_scans_summary_reads_the_same_fields():
    s = sowviz.inspect(_with_scan, W, H0, mode="jvp").probe("h").typed_summaries["primal"]
    every = np.stack(_steps(3))
    np.testing.assert_allclose(float(s.l2), np.linalg.norm(every), rtol=1e-5)
    np.testing.assert_allclose(float(s.mean), every.mean(), rtol=1e-5)


def test_compat_entry_is_jaxs_boundary():
    """The entry wraps JAX's own `api_boundary` (its setting decides), and returns what
    the function returns."""
    wrapped = _compat.api_boundary(lambda a, b=1: a + b)
    assert wrapped(1, b=2) == 3


def test_an_error_sowviz_says_in_its_own_words_has_no_contextlib_frame():
    """Said anew inside a `@contextmanager` of sowviz's: `contextlib`'s `__exit__`, which
    re-raised it, is no frame of the user's either."""
    import contextlib

    with pytest.raises(ValueError, match="takes `fn` backward") as got:
        sowviz.inspect(_with_while, W, H0, mode="grad")  # a while loop has no reverse mode
    assert [f for f in _frames(got.value) if f.startswith(contextlib.__file__)] == []
    assert _sowviz_frames(got.value) == []
