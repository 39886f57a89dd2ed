"""`sowviz.show` in a real IPython kernel: the widget is displayed before the work
starts, its status goes through the phases over the comm while the cell still runs,
the model arrives last, and the cell's own result does not draw it a second time;
then mode "all", compiled in the background meanwhile, is switched to without a compile."""

from __future__ import annotations

import os
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

CELL = """
import jax.numpy as jnp
import sowviz

def squares(x):
    return jnp.sum(jnp.tanh(x) ** 2)

w = sowviz.show(squares, jnp.ones(3))
w
"""


# The widget's switch to mode "all", as the front end's select would ask for it.
SWITCH = """
import jax
compiles = []
assert w._wait_warm("all", 120)  # (its compiles are over: only the switch's are counted)
jax.monitoring.register_event_duration_secs_listener(
    lambda e, s, **kw: compiles.append(kw.get("fun_name")) if e.endswith("backend_compile_duration") else None
)
w.mode = "all"
switched = f"SWITCHED {w.model['mode']} {w.phase} compiles={len(compiles)} {compiles}"
"""


def _evaluate(kc, code: str, expression: str) -> str:
    """Run `code` in the kernel, then the text of `expression`, read from the execute
    reply (the shell channel: a cell's printed output can be lost on IOPub, see
    test_notebooks), or the error the cell raised."""
    msg_id = kc.execute(code, user_expressions={"out": expression})
    while True:
        reply = kc.get_shell_msg(timeout=180)
        if reply["parent_header"].get("msg_id") == msg_id:
            break
    content = reply["content"]
    if content["status"] != "ok":
        return f"{content.get('ename')}: {content.get('evalue')}"
    out = content["user_expressions"]["out"]
    return out.get("data", {}).get("text/plain", str(out))


@pytest.mark.slow
def test_show_displays_once_and_streams_its_status(tmp_path):
    manager = pytest.importorskip("jupyter_client.manager")
    from lab_session import install_kernelspec

    install_kernelspec(tmp_path)
    env = {**os.environ, "JUPYTER_PATH": str(tmp_path / "share" / "jupyter")}
    env.pop("XLA_FLAGS", None)
    km, kc = manager.start_new_kernel(kernel_name="python3", cwd=str(ROOT), env=env)
    events = []
    try:
        msg_id = kc.execute(CELL)
        while True:
            m = kc.get_iopub_msg(timeout=120)
            kind, content = m["msg_type"], m["content"]
            if kind == "comm_msg" and content["data"]["method"] == "update":
                data = content["data"]
                if "phase" in data["state"]:
                    events.append(("phase", data["state"]["phase"]))
                if ["model"] in data["buffer_paths"]:
                    events.append(("model", len(m["buffers"][0])))
            elif kind in ("display_data", "execute_result", "error"):
                events.append((kind, content.get("ename")))
            if (
                kind == "status"
                and content["execution_state"] == "idle"
                and m["parent_header"].get("msg_id") == msg_id
            ):
                break
        switched = _evaluate(kc, SWITCH, "switched")
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    # mode "all" compiled in the kernel's background once the picture was drawn (the
    # default `warm`): the switch to it ran the program without compiling anything
    assert "SWITCHED all ready compiles=0" in switched, switched
    kinds = [k for k, _ in events]
    # drawn once, before anything is computed; the result line `w` draws nothing more
    assert kinds.count("display_data") == 1 and "execute_result" not in kinds
    assert "error" not in kinds, events
    shown = kinds.index("display_data")
    phases = [v for k, v in events[shown:] if k == "phase"]
    assert phases == ["compiling", "running", "ready"]
    assert ("phase", "tracing") in events[:shown]  # the state it was displayed in
    model_at = kinds.index("model")
    assert shown < model_at < events.index(("phase", "ready"))
    assert events[model_at][1] > 100  # gzipped JSON, a real model
