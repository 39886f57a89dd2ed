"""The typed record of where non-finite values (NaN/Inf) were born.

`sowviz.nonfinite.find` makes an `Origins` from one step's summaries;
`sowviz.nonfinite_locate.locate` fills in each pass's `Equation`. They stay typed
until the model is serialised (`to_dict`: the model's `"nonfinite"` field,
docs/model.md). `NonFinite` is the Monitor's handle on its first non-finite step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Equation:
    """One equation inside an origin stage, found by re-running with every equation probed."""

    node: str  # its node id in the graph (same ids whatever the capture)
    primitive: str
    source: Any  # SourceLocation | None
    reaching: str | None = None  # backward: the equation whose cotangent it made non-finite
    label: str = ""  # the node's label when it differs (a custom rule's function name)
    # inside the custom function `node` calls: what holds it ("the backward rule of
    # `my_log`"); `primitive` and `source` are then that equation's (`nonfinite_custom`)
    within: str = ""
    #: the JAX function the user's line called that bound it (`gelu` for the `integer_pow`
    #: of `jax.nn.gelu`), when no box is named by it: the line called no `integer_pow`
    call: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "primitive": self.primitive,
            "label": self.label or self.primitive,
            "source": None if self.source is None else self.source.to_dict(),
            "reaching": self.reaching,
        }


@dataclass(frozen=True)
class Origin:
    """Where one pass first made a non-finite value."""

    pass_: str  # "forward" | "backward"
    node: str | None  # forward: the producer; backward: the stage whose backward rule made it
    reaching: str | None = None  # backward: the node whose cotangent first became non-finite
    candidates: tuple[str, ...] = ()  # backward: every consumer that may have made it
    equation: Equation | None = None
    message: str = ""
    path: tuple[str, ...] = ()  # labels of the stages from the top level down to `node`
    # In a loop (a scan over layers): the iteration, per loop holding the equation or
    # stage the message names, the outermost first, counted from 0 as the loop's stacked
    # values are indexed (forward: the first holding NaN/Inf; backward: the one whose
    # cotangent it first made non-finite). () outside loops or where it is unknown.
    iteration: tuple[int, ...] = ()
    # backward: `node`'s own forward values are non-finite, so its backward only passes
    # the forward pass's NaN on ("follows from the forward pass"): no backward origin,
    # and the picture marks none
    follows_forward: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "path": list(self.path),
            "iteration": list(self.iteration),
            "reaching": self.reaching,
            "candidates": list(self.candidates),
            "equation": None if self.equation is None else self.equation.to_dict(),
            "follows_forward": self.follows_forward,
            "message": self.message,
        }


@dataclass(frozen=True)
class Origins:
    """The answer of the rule for one step: the model's `"nonfinite"` field."""

    step: int | None
    forward: Origin | None
    backward: Origin | None
    propagators: tuple[str, ...] = ()
    expected: tuple[str, ...] = ()
    removed: bool = False  # non-finite values that never reached a result
    alarm: bool = True  # False when only expected or removed values are non-finite
    message: str = ""
    nodes: tuple[str, ...] = field(default=(), repr=False)  # every non-finite node
    located: bool = False  # True once `locate` re-ran the step down to the equation
    # True when `locate` re-ran the step and found no alarm where the step raised one:
    # this is the step's own record, kept (`nonfinite_locate.kept_record`); locating
    # again would say no more
    not_reproduced: bool = False
    # the sentence on a library's loop-carried fill values (a finite run's +Inf buffer),
    # which are listed in `expected`: said in `message`, no origin of anything
    fill: str = field(default="", repr=False)
    # The arguments' leaves whose gradients hold NaN/Inf in this run, by path as the
    # message names them (`parameters/blocks[0]/down/bias`), in program order: those
    # the backward origin reaches, and those `OTHER_ORIGIN_GRADS` says another origin
    # made. `locate` keeps the step's own (`nonfinite_messages.with_step_grads`): its
    # re-run may round otherwise and break, or spare, another leaf.
    grads: tuple[str, ...] = field(default=(), repr=False)
    other_grads: tuple[str, ...] = field(default=(), repr=False)
    # only gradients are non-finite, and `expect_nonfinite=("gradients",)` declared them
    # expected (a guarded update skips the step: `nonfinite_expect`): no alarm
    skipped: bool = False
    # only loop fill values (`fill`), every one written over inside the loop that carried
    # them (a healthy diffrax solve's +Inf output buffer, every row saved): no value
    # holding them left the loop, and the report says nothing of them (no banner)
    overwritten: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "forward": None if self.forward is None else self.forward.to_dict(),
            "backward": None if self.backward is None else self.backward.to_dict(),
            "propagators": list(self.propagators),
            "expected": list(self.expected),
            "removed": self.removed,
            "alarm": self.alarm,
            "located": self.located,
            "not_reproduced": self.not_reproduced,
            "skipped": self.skipped,
            "overwritten": self.overwritten,
            "message": self.message,
        }


@dataclass(frozen=True)
class NonFinite:
    """The Monitor's record of its first non-finite step (`mon.nonfinite`)."""

    step: int
    # Node ids at the Monitor's granularity: stages (with capture="all", equations).
    forward: str | None  # the forward producer
    backward: str | None  # what made the NaN backward (else the node it reached)
    origins: Origins | None = None

    @property
    def message(self) -> str:
        """Where the non-finite values were born, in words (as `Inspection.nonfinite`'s)."""
        if self.origins is not None and self.origins.message:
            return self.origins.message
        parts = [
            f"{p} pass: node {n}"
            for p, n in (("forward", self.forward), ("backward", self.backward))
            if n is not None
        ]
        return f"step {self.step}: " + ("; ".join(parts) or "non-finite values")

    def to_dict(self) -> dict[str, Any]:
        if self.origins is not None:
            return self.origins.to_dict()
        return {"step": self.step, "forward": self.forward, "backward": self.backward}
