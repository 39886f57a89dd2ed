"""Round 11 of the graph's names: a PRNG key's wrap is no box, a jit restating its one
equation is one box, a name sown twice is labelled as `probe` names it, and a custom
call's note says where the call is."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sowviz
from sowviz.graph import build_graph


def _graph(fn, *args, capture="stages"):
    closed = jax.make_jaxpr(fn)(*args)
    return build_graph(
        closed,
        in_names=[f"in{i}" for i in range(len(closed.jaxpr.invars))],
        out_names=[f"out{i}" for i in range(len(closed.jaxpr.outvars))],
        capture=capture,
    )


def _top(g):
    return [n.label for n in g.nodes if n.parent == g.root and n.kind not in ("input", "output")]


# --- a raw PRNG key's wrap is an edge, not a box -------------------------------------


def _diffusion_noise(w, x0, key):
    k1, k2 = jax.random.split(key)
    t = jax.random.randint(k1, (x0.shape[0],), 0, 10)
    noise = jax.random.normal(k2, x0.shape)
    xt = x0 + 0.1 * t[:, None] * noise
    return jnp.mean((xt @ w - noise) ** 2)


def _fold_in_noise(w, key):
    k = jax.random.fold_in(key, 3)
    return jnp.sum((w * jax.random.normal(k, (3,))) ** 2)


def test_a_raw_key_draws_one_box_per_random_call():
    w, x0, key = jnp.eye(4), jnp.ones((8, 4)), jax.random.PRNGKey(0)
    ins = sowviz.inspect(_diffusion_noise, w, x0, key)
    labels = [n.label for n in ins.graph.nodes]
    assert not {"random_wrap", "random_unwrap"} & set(labels), labels
    # `random_wrap` (`key<fry>[]`, no data) was drawn before `randint` and `normal`; the
    # draws' lines are named by what they assign (round 13), the draws inside
    assert _top(ins.graph) == ["k1, k2", "t", "noise", "xt", "mean"]
    (normal,) = (n for n in ins.graph.nodes if n.label == "noise")
    (key_in,) = (n for n in ins.graph.nodes if n.label == "key")
    split = next(n for n in ins.graph.nodes if n.label == "k1, k2")
    edges = {(e.source, e.target) for e in ins.graph.edges}
    assert (key_in.id, split.id) in edges and (split.id, normal.id) in edges
    want = jax.random.normal(jax.random.split(key)[1], x0.shape)
    got = ins.probe("noise").summaries["primal"]
    np.testing.assert_allclose(got["mean"], float(want.mean()), rtol=1e-5)
    np.testing.assert_allclose(got["max"], float(want.max()), rtol=1e-6)


@pytest.mark.parametrize("make_key", [jax.random.PRNGKey, jax.random.key])
def test_a_raw_key_and_a_typed_key_draw_alike(make_key):
    # a raw key's `fold_in` line (wrap, `random_fold_in`, unwrap) was a fold `k` around
    # its one drawn equation, where a typed key's is that equation
    g = _graph(_fold_in_noise, jnp.ones(3), make_key(0))
    assert _top(g) == ["random_fold_in", "normal", "mul", "integer_pow", "reduce_sum"]


# --- a jit restating its one equation is one box --------------------------------------


def _spectrum(w, x):
    xf = jax.vmap(lambda r: jnp.fft.rfft(r, axis=0))(x * w)
    return jnp.sum(jnp.fft.irfft(xf * xf, axis=0) ** 2)


def test_an_rfft_is_one_box_plain_and_under_vmap():
    # `vmap` of `rfft`: `rfft` (jit) > `rfft` (jit) > `rfft` (eqn); `irfft`: two levels
    w, x = jnp.linspace(0.5, 1.5, 24).reshape(8, 3), jnp.sin(jnp.arange(96.0)).reshape(4, 8, 3)
    ins = sowviz.inspect(_spectrum, w, x, mode="primal")
    g = ins.graph
    ffts = [n for n in g.nodes if "fft" in n.label and n.kind == "jit"]
    # (round 16: each line is one box with the transposes of its `axis=0`, `xf` and
    # the returned `irfft`, holding the jit)
    (xf,) = (n for n in g.nodes if n.label == "xf")
    (box,) = (n for n in g.nodes if n.label == "irfft" and n.kind != "jit")
    assert [(n.label, n.parent) for n in ffts] == [("rfft", xf.id), ("irfft", box.id)]
    assert xf.parent == box.parent == g.root
    assert not g.children(ffts[0].id) and not g.children(ffts[1].id)
    # the box still counts what it holds: the two jits and the `fft` equation
    assert ffts[0].n_eqns == 3 and ffts[1].n_eqns == 2
    want = jax.vmap(lambda r: jnp.fft.rfft(r, axis=0))(x * w)
    got = ins.probe("xf").summaries["primal"]
    np.testing.assert_allclose(got["l2"], float(jnp.linalg.norm(want)), rtol=1e-5)


def test_a_jit_of_several_equations_keeps_its_level():
    # `jnp.linalg.norm`'s jit holds several equations: it stays a stage one can open
    g = _graph(lambda x: jnp.linalg.norm(x) * 2.0, jnp.arange(4.0))
    (norm,) = (n for n in g.nodes if n.label == "norm")
    assert g.children(norm.id)


# --- a name sown twice is labelled by the names `probe` takes -------------------------


def _sown_twice(w, x):
    h = sowviz.sow(jnp.tanh(x @ w), "dup")
    h2 = sowviz.sow(h + 1, "dup")
    return jnp.mean(h2**2)


def _sown_in_a_loop(w, x):
    for _ in range(3):
        x = sowviz.sow(jnp.tanh(x @ w), "logits")
    return jnp.sum(x**2)


def _sown_in_both_branches(w, x):
    h = jax.lax.cond(
        x[0] > 0,
        lambda h: sowviz.sow(jnp.tanh(h), "h"),
        lambda h: sowviz.sow(jnp.sin(h), "h"),
        x @ w,
    )
    return jnp.sum(h**2)


def _sown_in_two_scopes(w, x):
    with jax.named_scope("enc"):
        h = sowviz.sow(jnp.tanh(x @ w), "h")
    with jax.named_scope("dec"):
        h = sowviz.sow(jnp.sin(h @ w), "h")
    return jnp.sum(h**2)


def _sow_labels(ins):
    return [n.label for n in ins.graph.nodes if n.kind == "sow"]


def test_a_name_sown_twice_is_labelled_as_probe_names_it():
    w = jax.random.normal(jax.random.PRNGKey(0), (4, 4)) / 2
    x = jax.random.normal(jax.random.PRNGKey(1), (3, 4))
    ins = sowviz.inspect(_sown_twice, w, x)
    assert _sow_labels(ins) == ["dup_0", "dup_1"]
    model = ins.to_dict()
    assert [n["label"] for n in model["nodes"] if n["kind"] == "sow"] == ["dup_0", "dup_1"]
    h = np.tanh(np.asarray(x) @ np.asarray(w))
    for name, want in (("dup_0", h), ("dup_1", h + 1)):
        probe = ins.probe(name)
        assert ins.graph.node(probe.node).label == name
        np.testing.assert_allclose(probe.summaries["primal"]["mean"], want.mean(), rtol=1e-5)
        ct = 2 * (h + 1) / h.size  # d mean(h2 ** 2) / d h2, which both carry
        np.testing.assert_allclose(probe.summaries["cotangent"]["max"], ct.max(), rtol=1e-5)


def test_a_sow_in_a_python_loop_is_numbered_and_a_cond_s_is_not():
    w, x = jnp.eye(3) * 0.5, jnp.ones(3)
    looped = sowviz.inspect(_sown_in_a_loop, w, x)
    assert _sow_labels(looped) == ["logits_0", "logits_1", "logits_2"]
    want = np.tanh(np.tanh(np.full(3, 0.5)) * 0.5)
    got = looped.probe("logits_1").summaries["primal"]["mean"]
    np.testing.assert_allclose(got, want.mean(), rtol=1e-6)
    # the branches of one cond are one capture `h`: both stay `h`
    branches = sowviz.inspect(_sown_in_both_branches, w, x)
    assert _sow_labels(branches) == ["h", "h"]
    assert branches.probe("h").name == "h"


def test_sows_of_one_name_in_two_stages_keep_it():
    # their paths tell them apart, and `probe` takes those (`dec/h`): no number needed
    w, x = jnp.eye(3) * 0.5, jnp.ones(3)
    ins = sowviz.inspect(_sown_in_two_scopes, w, x)
    assert _sow_labels(ins) == ["h", "h"]
    want = np.sin(np.tanh(np.full(3, 0.5)) * 0.5)
    got = ins.probe("dec/h").summaries["primal"]["mean"]
    np.testing.assert_allclose(got, want.mean(), rtol=1e-6)


# --- a custom call's note says where the call is --------------------------------------


def _custom(body):
    def fn_wrapper(x):  # (optimistix's name, for both of its custom calls)
        return body(x)

    fn = jax.custom_jvp(fn_wrapper)
    fn.defjvp(lambda p, t: (fn(*p), t[0]))
    return fn


def _solver_body(x):
    # a loop: probed beside the call (primal values only)
    return jax.lax.fori_loop(0, 3, lambda i, c: 0.5 * (c + x / c), x)


def _check_body(x):
    # a small rule's body (a `jit` stage, few equations): probed on the call's outputs
    return jax.jit(lambda v: v * 1.0)(x)


def _two_wrappers(x):
    with jax.named_scope("solve"):
        y = _custom(_solver_body)(x)
    with jax.named_scope("error_if"):
        y = _custom(_check_body)(y)
    return jnp.sum(y)


def test_two_custom_calls_of_one_name_say_where_they_are():
    # optimistix's `fn_wrapper`s, the solver's and `error_if`'s: two notes read alike
    # ("2 call(s) of custom_jvp_call `fn_wrapper`") and said opposite things
    g = _graph(_two_wrappers, jnp.arange(1.0, 4.0))
    msgs = sorted(n.message for n in g.notes if "fn_wrapper" in n.message)
    assert len(msgs) == 2, msgs
    assert msgs[0].startswith("1 call(s) of custom_jvp_call `fn_wrapper` (in `error_if`): ")
    assert "probed on the call's outputs only" in msgs[0]
    assert msgs[1].startswith("1 call(s) of custom_jvp_call `fn_wrapper` (in `solve`): ")
    assert "primal values only" in msgs[1]


@jax.custom_jvp
def relu(x):  # a rule of the user's own: `jax.nn.relu`'s makes no note (round 17)
    return jnp.maximum(x, 0.0)


relu.defjvps(lambda t, ans, x: t * (x > 0))


def test_a_custom_call_at_the_top_level_names_no_place():
    g = _graph(lambda x: jnp.sum(relu(x)), jnp.arange(-1.0, 2.0), capture="all")
    (msg,) = [n.message for n in g.notes if "relu" in n.message]
    assert msg.startswith("1 call(s) of custom_jvp_call `relu`: ")


def test_a_monitor_labels_a_name_sown_twice_as_probe_names_it():
    def f(w):
        a = sowviz.sow(jnp.tanh(w), "dup")
        b = sowviz.sow(a * 2, "dup")
        return jnp.sum(b**2)

    mon = sowviz.Monitor(f)
    mon.step(jnp.ones(3))
    mon.flush()
    assert sorted(n["label"] for n in mon.to_dict()["nodes"] if n["kind"] == "sow") == [
        "dup_0",
        "dup_1",
    ]


def test_a_library_method_that_is_one_cond_is_named_by_the_method():
    """`optax.MultiSteps.update` is one `lax.cond`: its box reads `MultiSteps.update` (a
    bare `cond` did not say it was the optimizer), its branches keep their functions."""
    optax = pytest.importorskip("optax")
    tx = optax.MultiSteps(optax.adam(1e-2), every_k_schedule=3)

    def step(params, opt_state, grads):
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    p = {"w": jnp.ones(3)}
    ins = sowviz.inspect(step, p, tx.init(p), p, mode="primal")
    conds = [n for n in ins.graph.nodes if n.kind == "cond"]
    assert [n.label for n in conds] == ["MultiSteps.update"]
    kids = sorted(n.label for n in ins.graph.nodes if n.parent == conds[0].id)
    assert kids == ["branch 0: _do_update", "branch 1: _skip_update"]
    new_p, _ = ins.result
    want, _ = jax.jit(step)(p, tx.init(p), p)
    np.testing.assert_array_equal(np.asarray(new_p["w"]), np.asarray(want["w"]))


def test_a_users_own_cond_keeps_its_name():
    def f(w):
        return jax.lax.cond(w.sum() > 0, jnp.sin, jnp.cos, w).sum()

    ins = sowviz.inspect(f, jnp.ones(3))
    assert [n.label for n in ins.graph.nodes if n.kind == "cond"] == ["cond"]


def test_a_name_sown_twice_and_stacked_says_nothing_was_missed():
    """`duplicates="stack"` captures both sows of `dup` in one probe: no note that the
    second "was not reached" (it said a custom rule replaced the code around it)."""

    def f(w):
        a = sowviz.sow(jnp.tanh(w), "dup")
        b = sowviz.sow(a * 2, "dup")
        return jnp.sum(b**2)

    w = jnp.arange(3.0)
    ins = sowviz.inspect(f, w, duplicates="stack")
    assert not [n for n in ins.to_dict()["notes"] if "not reached" in str(n)]
    primal = ins.probe("dup").summaries["primal"]
    want = np.stack([np.tanh(np.arange(3.0)), 2 * np.tanh(np.arange(3.0))])
    assert list(primal["shape"]) == [2, 3]
    np.testing.assert_allclose(primal["max"], want.max(), rtol=1e-6)
