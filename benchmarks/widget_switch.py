"""The widget's first switch to mode "all" after `show()` (issue 15: ≤ 1 s).

For each model of `inspect_compile` (a new function each, nothing compiled): `show()`
in mode grad, then the switch to "all" as the front end's select asks for it
(`widget.mode = "all"`). Once with the default `warm=("all",)`, the switch timed after
the background compile is over (a user looks at the picture first; how long that
compile ran after `show()` returned is printed beside), and once with `warm=()` (the
switch compiles). Then the switch back to grad (a cache lookup).
Needs the notebook extras (anywidget); without them it says so and measures nothing.
Run: `python benchmarks/widget_switch.py [--quick]`.
"""

from __future__ import annotations

import time

import _bench
from inspect_compile import _cases

import sowviz


def _switch(widget, mode: str) -> float:
    t0 = time.perf_counter()
    widget.mode = mode
    took = time.perf_counter() - t0
    if widget.phase != "ready" or widget.model.get("mode") != mode:
        raise RuntimeError(f"the switch to {mode} did not draw it: {widget.status}")
    return took


def measure(name: str, loss, args) -> list[_bench.Row]:
    def warmed(*a):  # new functions: each compiles from nothing
        return loss(*a) * 1.0

    def cold(*a):
        return loss(*a) * 1.0

    w = sowviz.show(warmed, *args, mode="grad")
    t0 = time.perf_counter()
    if not w._wait_warm("all", timeout=600):
        raise RuntimeError("the background compile of mode all did not end in 600 s")
    background = time.perf_counter() - t0
    ahead = _switch(w, "all")
    back = _switch(w, "grad")
    c = sowviz.show(cold, *args, mode="grad", warm=())
    compiled = _switch(c, "all")
    rows: list[_bench.Row] = []
    _bench.emit(
        rows,
        _bench.Row(
            "widget_switch",
            f"first switch grad -> all after show(), compiled ahead, {name}",
            ahead,
            "s",
            target="≤ 1 s",
            detail=f"(not compiled ahead, warm=(): {compiled:.2f} s; the background "
            f"compile ran {background:.2f} s after show() returned; back to grad: "
            f"{back:.3f} s)",
        ),
    )
    return rows


def main(quick: bool = False) -> list[_bench.Row]:
    print(_bench.platform())
    try:
        import anywidget  # noqa: F401
    except ImportError:
        print("widget_switch | needs the notebook extras (anywidget): not measured")
        return []
    rows: list[_bench.Row] = []
    for make in _cases(quick).values():
        name, loss, args = make()
        rows += measure(name, loss, args)
    return rows


if __name__ == "__main__":
    main(_bench.args(__doc__).quick)
