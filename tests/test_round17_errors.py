"""Errors users see (round 17): nothing differentiable in modes jvp/vjp/all is refused as
in grad, and a Python number in a differentiated pytree is named in a note; `inspect`
inside a transformation on a function closing over a traced value says so; a `tag` of
the wrong type is named; every public entry ends a bad input's traceback at the user's
call; `save_intermediates` whose tag matches no sow says which tags were sown."""

from __future__ import annotations

import pathlib
import traceback

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sowviz

SOWVIZ_DIR = str(pathlib.Path(sowviz.__file__).parent)


def _sowviz_frames(err: BaseException) -> list[str]:
    """sowviz's frames in `err`'s traceback and in those of the errors it chains."""
    out, seen, link = [], set(), err
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        out += [f.filename for f in traceback.extract_tb(link.__traceback__)]
        link = link.__cause__ or (None if link.__suppress_context__ else link.__context__)
    return [f for f in out if f.startswith(SOWVIZ_DIR)]


# -- finding 4: nothing to differentiate ---------------------------------------------


def _sum_of_list(p):
    return p[0] ** 2 + p[1]


@pytest.mark.parametrize("mode", ["jvp", "vjp", "all"])
def test_no_floating_array_anywhere_is_refused_in_every_differentiating_mode(mode):
    with pytest.raises(TypeError, match="none has a floating-point array leaf") as got:
        sowviz.inspect(_sum_of_list, [1.0, 2.0], mode=mode)
    msg = str(got.value)
    assert f"mode '{mode}'" in msg and "jnp.asarray" in msg and "argument 0: float, float" in msg


def test_floating_arrays_still_differentiate_as_jax_does():
    p = [jnp.asarray(1.0), jnp.asarray(2.0)]
    ins = sowviz.inspect(_sum_of_list, p, mode="vjp")
    want = jax.grad(_sum_of_list)(p)
    (got,) = ins.result[1]
    np.testing.assert_allclose(np.asarray(got), np.asarray(want))
    # a function of no argument keeps working in mode jvp, as `jax.jvp(f, (), ())`
    assert float(sowviz.inspect(lambda: jnp.float32(3.0), mode="jvp").result[0]) == 3.0


def _scaled(p):
    return jnp.sum(p["w"] * p["log_scale"])


def test_a_python_float_in_the_differentiated_pytree_is_named_in_a_note():
    p = {"w": jnp.arange(3.0), "log_scale": 0.5}
    ins = sowviz.inspect(_scaled, p)
    value, grads = ins.result
    np.testing.assert_allclose(float(value), float(_scaled(p)))
    np.testing.assert_allclose(np.asarray(grads["w"]), np.asarray(jax.grad(_scaled)(p)["w"]))
    assert grads["log_scale"] is None  # static, as documented
    (note,) = [n["message"] for n in ins.notes if "log_scale" in n["message"]]
    assert "`p['log_scale']`" in note and "jnp.asarray(0.5)" in note and "None" in note
    # the report shows it among its notes
    assert any("log_scale" in n["message"] for n in ins.to_dict()["notes"])


def test_no_note_when_the_number_is_not_differentiated():
    def loss(w, cfg):
        return jnp.sum(w * cfg["scale"])

    ins = sowviz.inspect(loss, jnp.ones(3), {"scale": 2.0})  # grad: argument 0 alone
    assert not [n for n in ins.notes if "Python number" in n["message"]]
    ins = sowviz.inspect(loss, jnp.ones(3), {"scale": 2.0}, mode="primal")
    assert not [n for n in ins.notes if "Python number" in n["message"]]


# -- finding 5: inspect inside a transformation, closing over a tracer --------------


_ONES = np.ones(3, np.float32)  # (made outside: under `jax.jit` a new array is a tracer)


def _per_example(s):
    return sowviz.inspect(lambda w: jnp.sum((w * s) ** 2), _ONES).result[0]


@pytest.mark.parametrize("transform", ["jit", "vmap", "grad"])
def test_a_closed_over_tracer_gets_sowvizs_message(transform):
    run = {
        "jit": lambda: jax.jit(_per_example)(jnp.float32(2.0)),
        "vmap": lambda: jax.vmap(_per_example)(jnp.ones(2)),
        "grad": lambda: jax.grad(_per_example)(jnp.float32(2.0)),
    }[transform]
    with pytest.raises(TypeError, match="a value your function closes over is traced") as got:
        run()
    assert "lowered and compiled" not in str(got.value)
    assert "call it outside the transformation" in str(got.value)


def test_the_same_function_outside_the_transformation_is_right():
    s = jnp.float32(2.0)
    got = sowviz.inspect(lambda w: jnp.sum((w * s) ** 2), jnp.ones(3)).result[1]
    np.testing.assert_allclose(np.asarray(got), np.asarray(jnp.full(3, 8.0)))


# -- finding 6: a tag of the wrong type -----------------------------------------------


def test_a_tag_that_is_not_a_string_is_named():
    with pytest.raises(TypeError, match=r"sowviz.sow: `tag` must be a non-empty string, got 3"):
        sowviz.sow(jnp.ones(3), "h", tag=3)
    with pytest.raises(TypeError, match=r"save_intermediates: `tag` must be .* got 3 \(int\)"):
        sowviz.save_intermediates(lambda x: x, tag=3)
    # a tuple (or list) of tags is still taken
    f = sowviz.save_intermediates(lambda x: sowviz.sow(x, "h", tag="b") * 2, tag=["a", "b"])
    _, inter = f(jnp.ones(2))
    np.testing.assert_allclose(np.asarray(inter["h"]["primal"]), np.ones(2))


# -- finding 8: no sowviz frame in the traceback of a bad input -----------------------


def _loss(w, x):
    return jnp.mean((x @ w) ** 2)


def _dup(x):
    a = sowviz.sow(x, "h")
    return jnp.sum(sowviz.sow(a * 2, "h"))


_W, _X = jnp.ones((3, 2)), jnp.ones((4, 3))

BAD_CALLS = {
    "Monitor(every=0)": lambda tmp: sowviz.Monitor(_loss, every=0),
    "mon.step missing x": lambda tmp: sowviz.Monitor(_loss).step(_W),
    "sow(x, 3)": lambda tmp: sowviz.sow(_X, 3),
    "save_intermediates(tag=3)": lambda tmp: sowviz.save_intermediates(_loss, tag=3),
    "save_intermediates dup": lambda tmp: sowviz.save_intermediates(_dup)(_X),
    "Inspection.save_html": lambda tmp: sowviz.inspect(_loss, _W, _X).save_html(
        tmp / "missing" / "r.html"
    ),
    "load missing": lambda tmp: sowviz.load(tmp / "no_run"),
}


@pytest.mark.parametrize("name", list(BAD_CALLS))
def test_every_public_entry_ends_a_bad_inputs_traceback_at_the_users_call(name, tmp_path):
    with pytest.raises(Exception) as got:
        BAD_CALLS[name](tmp_path)
    assert _sowviz_frames(got.value) == []
    assert traceback.extract_tb(got.value.__traceback__)[-1].filename == __file__


def test_monitor_save_flush_close_end_at_the_users_call(tmp_path):
    mon = sowviz.Monitor(_loss)
    mon.step(_W, _X)
    mon.flush()
    with pytest.raises(OSError) as got:
        mon.save_html(tmp_path / "missing" / "r.html")
    assert _sowviz_frames(got.value) == []
    assert isinstance(got.value.__cause__, FileNotFoundError)  # the cause stays chained
    mon.close()


def test_an_error_in_the_users_function_keeps_the_users_frame():
    def bad(x):
        return jnp.sum(jnp.dot(x, jnp.ones((5, 5))))  # (4, 3) . (5, 5)

    for call in (
        lambda: sowviz.save_intermediates(bad)(_X),
        lambda: sowviz.Monitor(bad).step(_X),
    ):
        with pytest.raises(TypeError, match="dot_general") as got:
            call()
        frames = traceback.extract_tb(got.value.__traceback__)
        assert any(f.name == "bad" and f.filename == __file__ for f in frames)
        assert _sowviz_frames(got.value) == []


# -- finding 9: save_intermediates whose tag matches no sow ---------------------------


def _tagged(x):
    h = sowviz.sow(jnp.tanh(x), "hidden", tag="debug")
    return jnp.sum(h**2)


def test_a_tag_that_matches_no_sow_warns_with_the_tags_sown():
    wrapped = sowviz.save_intermediates(jax.grad(_tagged))
    with pytest.warns(UserWarning, match=r"no sow has the tag 'intermediates'") as got:
        g, inter = wrapped(jnp.ones(3))
    assert inter == {}
    msg = str(got[0].message)
    assert "tag 'debug': 'hidden'" in msg and "tag='debug'" in msg
    assert got[0].filename == __file__
    np.testing.assert_allclose(np.asarray(g), np.asarray(jax.grad(_tagged)(jnp.ones(3))))
    assert any("no sow has the tag" in n for n in wrapped.notes)
    # the fix it names captures the sow
    _, inter2 = sowviz.save_intermediates(jax.grad(_tagged), tag="debug")(jnp.ones(3))
    np.testing.assert_allclose(np.asarray(inter2["hidden"]["primal"]), np.tanh(np.ones(3)))
