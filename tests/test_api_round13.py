"""Round 13: module paths as Haiku and Flax write them, `Inspection.notes`, derivative
notes in mode primal, mode "all"'s error for a diffrax solve, output paths spelled as
inputs are."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sowviz
from sowviz.modes import forward_error


def _path(graph, node):
    nodes = {n.id: n for n in graph.nodes}
    labels = []
    while node.parent is not None:
        labels.append(node.label)
        node = nodes[node.parent]
    return "/".join(reversed(labels))


def _paths(graph, kind):
    return {_path(graph, n) for n in graph.nodes if n.kind == kind}


# -- 1. a module path without sowviz's repeat groups --------------------------------------


def _linen_blocks():
    nn = pytest.importorskip("flax.linen")

    class Block(nn.Module):
        @nn.compact
        def __call__(self, x):
            return x + nn.Dense(4, name="fc")(x)

    class Net(nn.Module):
        @nn.compact
        def __call__(self, x):
            for i in range(2):
                x = Block(name=f"block_{i}")(x)
            return x

    m, x = Net(), jnp.arange(12.0).reshape(3, 4) / 10
    params = m.init(jax.random.PRNGKey(0), x)["params"]
    ins = sowviz.inspect(lambda p, x: jnp.mean(m.apply({"params": p}, x) ** 2), params, x)
    return ins, params, x


def test_a_linen_module_path_finds_its_stage_inside_a_repeat_group():
    ins, params, x = _linen_blocks()
    fc0 = ins.probe("Net/block_0/fc")
    # the stage drawn inside the group `block_0–1 (×2)`, the first block's, not the second's
    assert ins.probe_path(fc0) == "Net/block_0–1 (×2)/block_0/fc"
    assert fc0 is ins.probe("Net/block_0–1 (×2)/block_0/fc")  # the drawn path still works
    p0 = params["block_0"]["fc"]
    want = np.asarray(x) @ np.asarray(p0["kernel"]) + np.asarray(p0["bias"])
    np.testing.assert_allclose(fc0.summaries["primal"]["mean"], want.mean(), rtol=1e-5)
    assert ins.probe_path(ins.probe("Net/block_1")) == "Net/block_0–1 (×2)/block_1"
    assert ins.probe_path(ins.probe("Net/block_1/fc")) == "Net/block_0–1 (×2)/block_1/fc"


def test_a_misspelled_module_path_suggests_its_own_block_first():
    ins, _, _ = _linen_blocks()
    with pytest.raises(KeyError, match=r"did you mean 'Net/block_0/fc'"):
        ins.probe("Net/block_0/fcc")


def test_a_haiku_module_path_finds_its_stage_inside_a_repeat_group():
    hk = pytest.importorskip("haiku")

    class Block(hk.Module):
        def __call__(self, x):
            return x + hk.Linear(4, name="fc")(x)

    class Transformer(hk.Module):
        def __call__(self, x):
            for i in range(2):
                x = Block(name=f"block_{i}")(x)
            return x

    m = hk.without_apply_rng(hk.transform(lambda x: Transformer(name="transformer")(x)))
    x = jnp.arange(8.0).reshape(2, 4) / 10
    params = m.init(jax.random.PRNGKey(1), x)
    ins = sowviz.inspect(lambda p, x: jnp.mean(m.apply(p, x) ** 2), params, x)
    h = np.asarray(x)
    for i in range(2):
        # the path as Haiku names the module (its parameters' key)
        got = ins.probe(f"transformer/block_{i}/fc")
        assert ins.probe_path(got) == f"transformer/block_0–1 (×2)/block_{i}/fc"
        w, b = (np.asarray(params[f"transformer/block_{i}/fc"][k]) for k in "wb")
        fc = h @ w + b
        np.testing.assert_allclose(got.summaries["primal"]["mean"], fc.mean(), rtol=1e-5)
        h = h + fc  # the next block reads this one's output


# -- 2. and 3. notes ------------------------------------------------------------------------


@jax.custom_jvp
def relu(x):  # a rule of the user's own: `jax.nn.relu`'s makes no note (round 17)
    return jnp.maximum(x, 0.0)


relu.defjvps(lambda t, ans, x: t * (x > 0))


def _relu_loss(w, x):
    return jnp.sum(relu(x @ w))


def test_notes_are_what_the_report_shows():
    ins = sowviz.inspect(_relu_loss, jnp.ones((3, 3)), jnp.ones((2, 3)), capture="all")
    assert ins.notes == ins.to_dict()["notes"]
    (note,) = ins.notes
    assert "custom_jvp_call `relu`" in note["message"]
    assert ins.graph.node(note["probe"]).label.startswith("relu")
    # the model's notes are a copy: changing them leaves the inspection's alone
    ins.to_dict()["notes"].clear()
    assert len(ins.notes) == 1


def test_notes_merged_twice_stay_as_merged_once():
    from sowviz.inspection import merged_notes

    notes = [
        {"level": "info", "probe": "n1", "message": "m"},
        {"level": "info", "probe": "n2", "message": "m"},
        {"level": "warning", "probe": None, "message": "w"},
    ]
    once = merged_notes(notes)
    assert once == [
        {"level": "info", "probe": "n1", "message": "m", "nodes": ["n1", "n2"]},
        {"level": "warning", "probe": None, "message": "w"},
    ]
    assert merged_notes(once) == once
    assert merged_notes(notes[:1] + notes[:1]) == notes[:1]  # one node: no `nodes`


def _derivative_notes(notes):
    return [n["message"] for n in notes if "nder differentiation" in n["message"]]


@pytest.mark.parametrize("mode", ["primal", "grad", "jvp"])
def test_notes_about_differentiation_only_where_something_is_differentiated(mode):
    ins = sowviz.inspect(_relu_loss, jnp.ones((3, 3)), jnp.ones((2, 3)), mode=mode, capture="all")
    said = _derivative_notes(ins.to_dict()["notes"])
    assert len(said) == (0 if mode == "primal" else 1), said
    assert ins.notes == ins.to_dict()["notes"]


def test_a_primal_monitor_says_nothing_about_differentiation():
    mon = sowviz.Monitor(_relu_loss, mode="primal")
    out = mon.step(jnp.ones((3, 3)), jnp.ones((2, 3)))
    np.testing.assert_allclose(out, 18.0)  # (2, 3) rows of 3
    assert _derivative_notes(mon.to_dict()["notes"]) == []
    mon.close()


def test_a_primal_diffrax_solve_has_no_derivative_notes():
    dfx = pytest.importorskip("diffrax")

    def solve(w, y0):
        term = dfx.ODETerm(lambda t, y, args: -w * y)
        return dfx.diffeqsolve(term, dfx.Tsit5(), 0.0, 1.0, 0.25, y0).ys[0]

    w, y0 = jnp.array([0.5, 1.0, 2.0]), jnp.ones(3)
    ins = sowviz.inspect(solve, w, y0, mode="primal")
    np.testing.assert_allclose(ins.result, np.exp(-np.asarray(w)), rtol=1e-3)
    assert _derivative_notes(ins.notes) == []
    # the graph still knows them: mode grad says them
    assert any(n.derivatives for n in ins.graph.notes)


# -- 4. mode "all" through a custom_vjp: no library internals in the message -------------


def test_a_forward_refusal_keeps_the_library_error_out_of_its_message():
    inner = TypeError("'type' object is not iterable")
    said = forward_error("all", inner, lambda: True)
    assert isinstance(said, TypeError)
    assert "custom_vjp" in str(said) and "not iterable" not in str(said)
    assert forward_error("grad", inner, lambda: True) is None
    assert forward_error("all", inner, lambda: False) is None


def test_a_backsolve_diffrax_solve_in_mode_all_says_the_fix_alone():
    dfx = pytest.importorskip("diffrax")

    def loss(w, y0):
        term = dfx.ODETerm(lambda t, y, a: -a * y)
        sol = dfx.diffeqsolve(
            term, dfx.Tsit5(), 0.0, 1.0, 0.25, y0, args=w, adjoint=dfx.BacksolveAdjoint()
        )
        return jnp.sum(sol.ys)

    # mode all takes the solve backward too: DirectAdjoint, not ForwardMode (round 15)
    with pytest.raises(TypeError, match=r"adjoint=diffrax\.DirectAdjoint\(\)") as info:
        sowviz.inspect(loss, jnp.ones(3), jnp.ones(3), mode="all")
    msg = str(info.value)
    assert msg.endswith("and mode 'grad' apart."), msg
    assert "raised on the way" not in msg and "not iterable" not in msg
    assert isinstance(info.value.__cause__, TypeError | RuntimeError)  # kept, chained


# -- 5. output paths spelled as input paths -------------------------------------------------


def test_outputs_spell_their_paths_as_inputs_do():
    def step(p, x):
        return jax.tree.map(lambda a: a - 0.1 * jnp.mean(x) * a, p)

    p = {
        "dense": {"kernel": jnp.ones((3, 4)), "bias": jnp.zeros(4)},
        "ln": {"scale": jnp.arange(4.0)},
    }
    x = jnp.array([1.0, 2.0, 3.0])
    ins = sowviz.inspect(step, p, x, mode="primal")
    assert _paths(ins.graph, "input") >= {"p/dense/kernel", "p/dense/bias", "p/ln/scale"}
    assert _paths(ins.graph, "output") == {
        "output/dense/kernel",
        "output/dense/bias",
        "output/ln/scale",
    }
    got = ins.probe("output/ln/scale").summaries["primal"]["mean"]
    np.testing.assert_allclose(got, np.mean(np.arange(4.0) * (1 - 0.1 * 2.0)), rtol=1e-6)


def test_an_optimizer_state_output_spells_its_paths_as_its_input():
    optax = pytest.importorskip("optax")
    p = {"w": {"kernel": jnp.ones((2, 2)), "bias": jnp.zeros(2)}, "ln": {"scale": jnp.ones(2)}}
    tx = optax.MultiSteps(
        optax.inject_hyperparams(optax.scale_by_learning_rate)(learning_rate=0.1), 2
    )

    def step(p, opt_state, x):
        g = jax.tree.map(lambda a: a * jnp.mean(x), p)
        return tx.update(g, opt_state, p)[1]

    ins = sowviz.inspect(step, p, tx.init(p), jnp.ones(3), mode="primal")
    inputs = {q.removeprefix("opt_state/") for q in _paths(ins.graph, "input")}
    outputs = {q.removeprefix("output/") for q in _paths(ins.graph, "output")}
    assert "inner_opt_state/hyperparams/learning_rate" in outputs
    assert "acc_grads/ln/scale" in outputs
    assert outputs <= inputs, outputs - inputs
