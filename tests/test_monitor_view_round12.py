"""A Monitor's widget as JupyterLab showed it (round 12): made before the first step
(`mon` as a cell's last expression) it showed a false error ("cannot run its program
again in mode 'grad' … Choose '?' again") for the whole run; and a loop that ended left
its last steps in the outbox, the widget reading an old step as the latest until
`mon.flush()`."""

from __future__ import annotations

import gzip
import json
import time

import jax
import jax.numpy as jnp
import pytest

import sowviz


def loss(w, x):
    return jnp.mean(jnp.tanh(x @ w) ** 2)


W = jnp.ones((4, 3)) / 4
X = jax.random.normal(jax.random.key(0), (8, 4))


def test_a_monitor_view_made_before_the_first_step_is_ready_in_its_mode():
    mon = sowviz.Monitor(loss)
    view = mon.view()
    assert (view.phase, view.status, view.mode) == ("ready", "", "grad")
    mon.step(W, X)
    mon.flush()
    assert (view.phase, view.model["mode"]) == ("ready", "grad")
    # a switch it cannot make still says so, naming both modes
    view.mode = "jvp"
    assert view.phase == "error" and "'jvp'" in view.status and "'grad'" in view.status
    mon.close()


def test_the_last_steps_of_a_loop_reach_the_view_without_a_flush():
    mon = sowviz.Monitor(loss, throttle=0.2)
    view = mon.view()
    sent: list[int] = []

    def spy(msg, buffers=None):
        sent.extend(e["step"] for e in json.loads(gzip.decompress(bytes(buffers[0]))))

    view.send = spy
    w = W
    for _ in range(30):
        _, g = mon.step(w, X)
        w = w - 0.1 * g
    shown = set(view.model["history"]["steps"]) | set(sent)
    deadline = time.monotonic() + 20.0
    # (the throttle's 0.2 s; on a loaded machine the model can hold step 29 a moment
    # before the sender has emptied its outbox: wait for both)
    while (29 not in shown or len(view._outbox)) and time.monotonic() < deadline:
        time.sleep(0.05)
        shown = set(view.model["history"]["steps"]) | set(sent)
    assert shown == set(range(30))
    assert len(view._outbox) == 0
    mon.close()


@pytest.mark.browser
def test_a_failed_show_keeps_its_mode_and_draws_no_empty_canvas(monkeypatch, browser):
    from tests.test_widget_browser import Bridge, shown_by_show

    bridge = Bridge(browser)
    try:
        shown_by_show(monkeypatch, bridge)

        def broken(w, x):
            return jnp.sum(x @ w[:3])  # (16,) @ (15,)-like: a shape error

        with pytest.raises(TypeError):
            sowviz.show(broken, jnp.ones((4, 2)), jnp.ones((5, 4)), mode="jvp")
        bridge.deliver()
        pg = bridge.page
        assert pg.locator('[data-role="error"]').is_visible()
        assert pg.locator('[data-role="mode"]').input_value() == "jvp"
        assert pg.locator('[data-role="empty"]').inner_text().startswith("Nothing to draw")
        assert pg.locator(".sowviz").first.bounding_box()["height"] <= 200
        assert bridge.p.errors == []
    finally:
        bridge.close()
