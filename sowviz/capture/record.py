"""What the interpreter collects: captured sites and their values.

A `Site` is static (known at trace time): which `sow` produced the values, which
derivative they are, and how enclosing constructs reshaped them. A `Capture`
pairs a site with the traced values. Rules for higher-order primitives move
captures across a sub-program boundary with `Recorder.flat` (values out as
extra outputs) and `Recorder.lift` (values back in, possibly stacked).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from .._compat import SourceLocation

LoopPolicy = Literal["last"] | int


@dataclass(frozen=True)
class Site:
    """One tagged point as the engine saw it."""

    name: str
    tag: str
    mode: str  # capture key: "primal", "tangent", "cotangent", "cotangent.tangent", ...
    treedef: Any  # PyTreeDef of the sown value
    leaves: tuple[int, ...]  # which leaves of `treedef` are carried (float0 tangents are not)
    call: int  # serial number of the `sow` call: equal for the primal and derivatives of one call
    location: SourceLocation | None
    axes: tuple[str, ...] = ()  # leading axes added by enclosing constructs, outermost first
    # the vmaps that batched the value, outermost first (`primitive.sow_p`'s `vmapped`)
    vmapped: tuple[str, ...] = ()
    # the differentiated evaluation of the `sow` call the values come from (its primal
    # and derivatives share it; `primitive._jvp`), 0 for one never differentiated
    evaluation: int = 0


@dataclass
class Capture:
    site: Site
    values: list[Any]
    # Per-capture metadata arrays that travel with the values: "iterations"
    # (while loops), "taken" (a name sown in only some branches of a cond).
    meta: dict[str, Any] = field(default_factory=dict)

    def flat(self) -> list[Any]:
        return [*self.values, *(self.meta[k] for k in sorted(self.meta))]

    def rebuilt(self, flat: Sequence[Any], axis: str | None) -> Capture:
        n = len(self.values)
        keys = sorted(self.meta)
        site = self.site if axis is None else replace(self.site, axes=(axis, *self.site.axes))
        return Capture(site, list(flat[:n]), dict(zip(keys, flat[n : n + len(keys)], strict=True)))


@dataclass
class Options:
    tags: frozenset[str]
    loops: LoopPolicy = "last"
    strict: bool = True


@dataclass
class Recorder:
    """Collects captures while a (sub-)program is evaluated."""

    options: Options
    captures: list[Capture] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: Sow names a note already reports as not captured (a primitive with no rule).
    dropped: set[str] = field(default_factory=set)
    #: Whether a loop here carries its small captures in one buffer per dtype
    #: (`packing.Carried`): where its cuts reach a loop that packs them again, a `jit`
    #: that passes the buffer whole (`packing.Passed`) or the summaries. Not in a
    #: `cond`'s branch or a `shard_map`, whose outputs are the cuts one by one: a slice
    #: each, at an offset of its own, so an XLA kernel each (a while loop in a branch:
    #: 17 kernels unpacked, 168 packed).
    packs: bool = True

    def child(self, packs: bool | None = None) -> Recorder:
        packs = self.packs if packs is None else packs
        return Recorder(self.options, notes=self.notes, dropped=self.dropped, packs=packs)

    def reset(self) -> None:
        # A body may be traced more than once (e.g. while JAX settles carry types).
        self.captures = []

    def add(self, site: Site, values: Sequence[Any]) -> None:
        self.captures.append(Capture(site, list(values)))

    def flat(self) -> list[Any]:
        """Every captured array, in a fixed order, to return from a sub-program."""
        return [x for c in self.captures for x in c.flat()]

    def lift(self, template: Recorder, flat: Sequence[Any], axis: str | None = None) -> None:
        """Add `template`'s captures with values replaced by `flat` (outputs of the outer
        equation), recording `axis` as a new leading axis when the construct stacks them."""
        pos = 0
        for c in template.captures:
            n = len(c.flat())
            self.captures.append(c.rebuilt(flat[pos : pos + n], axis))
            pos += n
        if pos != len(flat):  # an engine bug, never a user error: say so loudly
            raise RuntimeError(
                f"sowviz internal error: {len(flat)} captured values for {pos} slots; "
                "please report this with the program that triggered it."
            )
