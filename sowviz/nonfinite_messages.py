"""The sentences of the non-finite record: what the banner, `NonFiniteError` and the
report say, e.g. "born in the backward of `rsqrt` in `LayerNorm_0` at models.py:112,
reaching `block_0` (models.py:80)".

Pure text from typed nodes (anything with `label`, `kind`, `source`) and the record
(`nonfinite_record`); the rule that decides the origins lives in `nonfinite`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from .nonfinite_record import Equation, Origin, Origins

#: Starts the verdict on a backward origin whose stage already holds non-finite forward
#: values: the gradient is non-finite because the forward pass was, which a first
#: reading must learn before the stage's name (a NaN in an input, not the loss).
FROM_FORWARD = "follows from the forward pass: "


def stage_name(n: Any, label: str | None = None) -> str:
    """ "`label` (file:line)"."""
    at = f" ({n.source.file}:{n.source.line})" if n.source is not None else ""
    return f"{_quoted(n.label if label is None else label)}{at}"


def input_of(call: Any) -> str:
    """ "the input of `norm` (file:line)": what a library call's line passed it."""
    return f"the input of {stage_name(call)}"


def _quoted(label: str) -> str:
    return f"`{label}`"


_KIND_NAMES = {"nan": "NaN", "posinf": "+Inf", "neginf": "-Inf"}


#: How a forward message names a node holding other non-finite kinds before its origin.
EARLIER = "; before it, "
#: ... and, in a loop, the body's nodes after it that may have made it at an earlier
#: iteration (the value it read from the loop's carry)
LOOP_CARRIED = (
    "; unless, at an earlier iteration of its loop, what follows it in the body made it ("
)
#: ... and, at an overflow whose ±Inf became the NaN the results hold, what it held and
#: the node that made the NaN of it
LED_TO = "; it held "
#: ... and a non-finite value made before it that a reader masked (`jnp.where`): it
#: reaches no result, so it is not the origin
MASKED = "; before it, a "
#: Ends a forward message whose maker may be an unprobed equation: the re-run names it.
NAMES_THE_EQUATION = ": `locate_nonfinite()` names the equation"
#: What `locate` says in place of the equation when its re-run, every equation probed,
#: finds no NaN/Inf reaching a result though the step's own program held some (an
#: `nnx.MultiHeadAttention` with weights scaled by 3e4: NaN under `jax.jit`, finite op
#: by op).
NOT_REPRODUCED = (
    "; `locate_nonfinite()` re-ran the step with every equation probed, rounded op by "
    "op and again fused as XLA fused the step, and found no NaN/Inf reaching a result, "
    "so it names no equation: XLA's fusion in the step's own program may skip a "
    "rounding (a `mul` and the `sub` of a softmax's `x - max(x)` fused into one "
    "multiply-add), and values this large overflow on that difference. Scale them down "
    "(or compute that stage in float64) and run again"
)
#: ... and says that only the tangent is non-finite there (mode "jvp")
IN_TANGENT = " (in its tangent: the value is finite)"
#: After `IN_TANGENT` at a Tesseract: where such tangents come from (tesseract-jax's
#: rule, not the program).
TESSERACT_TANGENT = (
    "; tesseract-jax gives a Tesseract's outputs that are not `Differentiable` NaN tangents"
)
#: Ends a backward origin's message: the arguments whose gradients hold NaN/Inf.
NONFINITE_GRADS = "; non-finite gradient of "
#: ... and those whose values never reach the origin: another origin made theirs.
OTHER_ORIGIN_GRADS = "; another origin made the non-finite gradient of "
#: ... said once, after them.
OTHER_ORIGIN_FIX = " (fix this one, then run again to find it)"


def at_iteration(loops: Sequence[Any], iteration: Sequence[int]) -> str:
    """ ", in iteration 3 of `scan(block)`": which pass of the loops holding a node (nested
    loops: the outermost first) the origin is in, counted from 0 as the loop's stacked
    values are (`params["w"][3]` for a scan over layers). "" outside loops."""
    pairs = list(zip(iteration, loops, strict=False))
    if not pairs:
        return ""
    return ", in iteration " + " and ".join(f"{i} of `{loop.label}`" for i, loop in pairs)


def forward_message(
    n: Any,
    path: Sequence[str] = (),
    before: Sequence[Any] = (),
    earlier: tuple[Any, ...] | None = None,
    carried: Sequence[Any] = (),
    unseen: bool = False,
    led_to: tuple[Any, frozenset[str], frozenset[str], frozenset[str]] | None = None,
    masked: tuple[Any, frozenset[str], Any] | None = None,
    at: str = "",
) -> str:
    """Where the forward pass first holds NaN/Inf: node `n`, whose stage labels from the
    top level down are `path`. An input is named by its path (`parameters/block_1/
    Dense_1/kernel`): a model has a `kernel` in every layer. `before`: the unprobed
    equations feeding `n`, which may have made the value `n` is the first probe to
    see; `earlier`: a node holding other non-finite kinds before `n` (+Inf before a
    NaN), those kinds and its stage path; `carried`: in a loop, the body's nodes after `n` that may
    have made, at an earlier iteration, the value `n` read from the loop's carry
    (`unseen`: some are unprobed equations); `led_to`: the node that made the NaN the
    results hold of the ±Inf `n` made (an overflow), and the kinds `n` held, then (a NaN
    `n` made, whose place a fill took) the kinds of that fill node, else none, and the
    kinds the results hold (`_led_to`); `masked`:
    a node whose non-finite values (those kinds) were made before `n` and masked by a
    reader (the third item, or None), so that they reach no result; `at`: in a loop, the
    iteration (`at_iteration`)."""
    if n.kind == "input":
        return f"the input {stage_name(n, input_path(path) or None)} holds non-finite values"
    if before:
        names = ", ".join(stage_name(b) for b in before)
        msg = (
            f"first seen at {stage_name(n)}{at}; made there or by an unprobed equation before "
            f"it ({names}){NAMES_THE_EQUATION}"
        )
    else:
        msg = f"first made by {stage_name(n)}{at}"
    if led_to is not None:
        msg += _led_to(*led_to)
    if carried:
        names = ", ".join(stage_name(c) for c in carried)
        locate = NAMES_THE_EQUATION if unseen and not before else ""
        msg += f"{LOOP_CARRIED}{names}){locate}"
    if earlier is not None:
        node, kinds = earlier[:2]
        # an input by its path, as the origin names one (`the input batch/[0]`, not `[0]`)
        named = (
            f"the input {stage_name(node, input_path(earlier[2]))}"
            if node.kind == "input" and len(earlier) > 2 and earlier[2]
            else stage_name(node)
        )
        msg += f"{EARLIER}{named} held {_held(kinds)}, which may have led to it"
    if masked is not None:
        node, kinds, by = masked
        what = f" by {stage_name(by)}" if by is not None else " afterwards"
        msg += f"{MASKED}{_held(kinds)} in {stage_name(node)} was masked{what} (not the origin)"
    return msg


def _led_to(
    node: Any,
    kinds: frozenset[str],
    fill: frozenset[str] = frozenset(),
    results: frozenset[str] = frozenset(),
) -> str:
    """What an origin holding `kinds` led to: the NaN `node` made of its ±Inf (an
    overflow), or, `fill` being the ±Inf fill value `node` holds, the results' ±Inf
    (`results`: their kinds) put in its place, which no arithmetic makes of a NaN."""
    if not fill:
        return f"{LED_TO}{_held(kinds)}, which led to the NaN first made by {stage_name(node)}"
    what = _held(results - {"nan"}) or _held(fill)
    return (
        f"{LED_TO}{_held(kinds)}; the results' {what} comes from the {_held(fill)} fill value of "
        f"{stage_name(node)}, put in its place (as `jnp.where(jnp.isfinite(x), x, -jnp.inf)` "
        "does), not made of it"
    )


def _held(kinds: frozenset[str]) -> str:
    return "/".join(_KIND_NAMES[k] for k in ("nan", "posinf", "neginf") if k in kinds)


def input_path(path: Sequence[str]) -> str:
    """An argument leaf's path in one notation, `parameters/l2/bias`: the graph draws a
    group holding a single leaf as one box labelled by both (`l1.kernel`), whose dot
    is one more step of the path."""
    return "/".join(part.replace(".", "/") for part in path)


def backward_message(
    made: Any, reach: Any, others: Sequence[Any], from_forward: bool = False, at: str = ""
) -> str:
    """`made`: the consumer whose backward rule made the NaN (None: unknown); `reach`: the
    node whose cotangent it made non-finite; `others`: the other candidates;
    `from_forward`: `made` holds non-finite forward values; `at`: in a loop, the
    iteration of `reach` (`at_iteration`)."""
    if made is None:
        return (
            f"the cotangent of {stage_name(reach)}{at} is non-finite where the backward pass starts"
        )
    names = ", ".join(stage_name(c) for c in others)
    if from_forward:
        alt = f" (unless the backward of {names} made it)" if others else ""
        return backward_sentence(stage_name(made), f", reaching {stage_name(reach)}{at}{alt}", True)
    alt = f" (or of {names})" if others else ""
    return backward_sentence(
        f"{stage_name(made)}{alt}", f", reaching {stage_name(reach)}{at}", False
    )


def backward_sentence(name: str, reach: str, from_forward: bool, in_rule: bool = False) -> str:
    """ "born in the backward of `name`, reaching …", or, when that stage's forward values
    are already non-finite, "follows from the forward pass: `name` holds non-finite
    values, so its backward does too, reaching …"; `in_rule`: `name` is an equation of a
    custom derivative rule, which the backward pass runs as it is ("born in `div` in the
    backward rule of `my_log`")."""
    if from_forward:
        return f"{FROM_FORWARD}{name} holds non-finite values, so its backward does too{reach}"
    return f"born in {name}{reach}" if in_rule else f"born in the backward of {name}{reach}"


def equation_name(stage: Any, eq: Equation) -> str:
    """ "`rsqrt` in `LayerNorm_0` at models.py:112" (`stage`: the node holding it, or None);
    "`integer_pow` in the call of `gelu` in `x#5` at ...": the JAX function the line
    called, when no box is named by it (`Equation.call`)."""
    at = f" at {eq.source.file}:{eq.source.line}" if eq.source is not None else ""
    inside = f" in {_quoted(stage.label)}" if stage is not None and stage.id != eq.node else ""
    if stage is not None and stage.label == eq.primitive and eq.label in ("", eq.primitive):
        inside = ""  # (the box of a `jnp.linalg.eigh` call holding its `eigh`: no "X in X")
    if eq.within:  # an equation of a custom function or its rules: "in the JVP rule of `f`"
        inside = f" in {eq.within}"
    name = f"`{eq.primitive}`"
    if eq.label and eq.label != eq.primitive:
        name = f"`{eq.label}` ({eq.primitive})"
    elif eq.call and not eq.within:
        name += f" in the call of `{eq.call}`"
    return f"{name}{inside}{at}"


def masked_branch_hint(primitive: str) -> str:
    """What to say when the value is finite but the gradient is not, both born at one
    equation: its non-finite value was masked (a `jnp.where`), its backward was not."""
    return (
        f"; the value is finite: what `{primitive}` made was masked later (a `jnp.where`?), "
        f"but its backward still multiplies by it (0 × NaN = NaN). Give `{primitive}` an "
        f"input where it is finite: `jnp.where(ok, x, 1.0)` before it as well as "
        f"`jnp.where(ok, ..., 0.0)` after it (the double-where trick)"
    )


def masked_derivative_hint(primitive: str, where: Any = None, in_norm: bool = False) -> str:
    """What to say when an equation's value is finite but its derivative is not (`sqrt`
    at exactly 0) and a `jnp.where` (`where`: its source location) masks the value: the
    masked branch's cotangent is 0, and 0 × Inf = NaN. `in_norm`: it is
    `jnp.linalg.norm`'s `sqrt` at a zero vector, which the user never wrote: the fix
    replaces the `norm` call (as `zero_derivative_hint` says for an unmasked one)."""
    at = f" at {where.file}:{where.line}" if where is not None else ""
    if in_norm:
        return (
            "; the value of `norm` is finite but its derivative is not at a zero vector (a "
            "distance of 0, as a point's to itself: its `sqrt`'s derivative 0.5 / sqrt(x) is "
            f"infinite at x = 0), and a `jnp.where`{at} masks the value, not its backward "
            f"(0 × Inf = NaN). Fix: {NORM_FIX}, or {DOUBLE_WHERE}"
        )
    return (
        f"; the value of `{primitive}` is finite but its derivative is not (`sqrt`'s at 0, "
        f"`arcsin`'s at 1), and a `jnp.where`{at} masks the value, not its backward "
        f"(0 × Inf = NaN). Give `{primitive}` an input where its derivative is finite: "
        f"`jnp.where(ok, x, 1.0)` before it as well as `jnp.where(ok, ..., 0.0)` after it "
        f"(the double-where trick)"
    )


def derivative_times_zero_hint(maker: str, of: str | None, at: Any, where: Any) -> str:
    """What to say when a forward origin is an infinite derivative (`maker`, the
    equation, computing the derivative of `of` on line `at`; a `jax.grad` inside the
    program: forces as -grad(energy)) that a `jnp.where` (`where`: its source location)
    multiplied by its masked branch's zero: 0 × Inf = NaN."""
    line = f" at {at.file}:{at.line}" if at is not None else ""
    mask = f" at {where.file}:{where.line}" if where is not None else ""
    func = f"`{of}`" if of else "the function"
    return (
        f"; that Inf is a derivative (`{maker}` computes the derivative of {func}{line}, for "
        f"a `jax.grad` or `jax.jvp` inside the program), and a `jnp.where`{mask} masks "
        f"the value, not its derivative (0 × Inf = NaN). Give {func} an input where its "
        f"derivative is finite: `jnp.where(ok, x, 1.0)` before it as well as "
        f"`jnp.where(ok, ..., 0.0)` after it (the double-where trick)"
    )


def fully_masked_row_hint(primitive: str, where: Any = None) -> str:
    """What to say when a softmax made NaN of the -Inf a `jnp.where` (`where`: its source
    location) filled masked scores with: a row whose every entry is masked (a padding
    query, left padding under a causal mask) has max -Inf, and `x - max(x)` is
    -Inf - (-Inf) = NaN (`primitive` "sub"), or, with no max taken, `exp` gives 0 / 0
    ("div"). The fixes the attention code people write uses, each tested to give finite
    values and gradients."""
    why = (
        "-Inf - (-Inf) = NaN in the softmax's `x - max(x)`"
        if primitive == "sub"
        else "`exp` gives 0 / 0 = NaN in the softmax's normalisation"
    )
    at = f" at {where.file}:{where.line}" if where is not None else ""
    return (
        f"; a fully masked row: the `jnp.where`{at} put -Inf in every entry of a row (a "
        f"padding query, or left padding under a causal mask), and {why}. Fix: fill masked "
        "scores with a large finite negative, `jnp.where(mask, s, jnp.finfo(s.dtype).min)`, "
        "not `-jnp.inf` (the row becomes uniform and finite: ignore its output), or pass the "
        "mask to the softmax, `jax.nn.softmax(s, where=mask)`, which gives such a row zeros"
    )


def empty_segment_hint(where: Any = None) -> str:
    """The segment counterpart of `fully_masked_row_hint` (a GAT's segment softmax): a
    node all of whose incoming edges a `jnp.where` (`where`: its source location) masked
    with -Inf (a padding node) gets -Inf from `jax.ops.segment_max`, and
    `s - segment_max(s)[ids]` is -Inf - (-Inf) = NaN. Guarding the max alone leaves
    `exp` 0 / 0 in the normalisation: both fixes named are tested to give finite values
    and gradients equal to plain JAX's."""
    at = f" at {where.file}:{where.line}" if where is not None else ""
    return (
        f"; a node with no unmasked incoming edge: the `jnp.where`{at} put -Inf in every "
        "edge of its segment (a padding node), `jax.ops.segment_max` gave it -Inf, and -Inf "
        "- (-Inf) = NaN in the segment softmax's `s - segment_max(s)[ids]`. Fix: fill masked "
        "edges with a large finite negative, `jnp.where(mask, s, jnp.finfo(s.dtype).min)`, "
        "not `-jnp.inf` (its edges' weights become uniform and finite: ignore its output), or "
        "keep -Inf and guard both the max and the sum, `m = jnp.where(jnp.isfinite(m), m, 0)` "
        "and `den = jnp.where(den > 0, den, 1)`, which gives its edges zeros"
    )


#: The double-where trick, the fix for any input where a derivative is infinite.
DOUBLE_WHERE = (
    "the double-where trick: `jnp.where(ok, x, 1.0)` before it as well as "
    "`jnp.where(ok, ..., 0.0)` after it"
)


#: The fix for `jnp.linalg.norm` at a zero vector: its `sqrt` is the library's, so the
#: user replaces the call (tested to give finite gradients equal to plain JAX's wherever
#: the distance exceeds sqrt(eps)).
NORM_FIX = (
    "`jnp.sqrt(jnp.maximum(jnp.sum(d ** 2, axis=-1), eps))` in place of "
    "`jnp.linalg.norm(d, axis=-1)`"
)

#: Per primitive whose derivative is infinite at a point where its value is finite: that
#: derivative and the point, and the clip that keeps its input off that point, as
#: `clipped_derivative_hint` says them.
_STEEP_AT = {
    "sqrt": (
        "`sqrt`'s derivative 0.5 / sqrt(x) is infinite at x = 0",
        "`jnp.sqrt(jnp.maximum(x, eps))`",
    ),
    "cbrt": (
        "`cbrt`'s derivative 1 / (3 * cbrt(x) ** 2) is infinite at x = 0",
        "`jnp.cbrt(jnp.maximum(x, eps))`",
    ),
    "asin": (
        "`arcsin`'s derivative 1 / sqrt(1 - x ** 2) is infinite at x = ±1",
        "`jnp.arcsin(jnp.clip(x, -1 + eps, 1 - eps))`",
    ),
    "acos": (
        "`arccos`'s derivative -1 / sqrt(1 - x ** 2) is infinite at x = ±1",
        "`jnp.arccos(jnp.clip(x, -1 + eps, 1 - eps))`",
    ),
}


def clipped_derivative_hint(
    primitive: str, clip: str, where: Any = None, exponent: float | None = None
) -> str:
    """What to say when an equation's derivative is infinite where its value is finite
    (`sqrt` at 0) and a clip before it (`clip`: how the user called it, `jnp.clip` or
    `jnp.maximum`; `where`: its source location) put its input at exactly that point: the
    clip's backward passes 0 for what it clipped, and 0 × Inf = NaN (`max`'s derivative is
    a mask times the cotangent). `exponent`: a `pow`'s. The fix clips to a point where the
    derivative is finite."""
    at = f" at {where.file}:{where.line}" if where is not None else ""
    if primitive == "pow" and exponent is not None:
        what = (
            f"`x ** {exponent:g}`'s derivative {exponent:g} * x ** {exponent - 1:g} is "
            "infinite at x = 0"
        )
        fix = f"`jnp.maximum(x, eps) ** {exponent:g}`"
    else:
        what, fix = _STEEP_AT.get(primitive, _STEEP_AT["sqrt"])
    return (
        f"; {what}, where `{clip}`{at} put the values it clipped, and it masks the value, "
        f"not its backward: its derivative is 0 there, and 0 × Inf = NaN. Fix: clip to where "
        f"the derivative is finite, {fix}"
    )


def zero_derivative_hint(
    primitive: str, exponent: float | None = None, in_norm: bool = False, held: bool = False
) -> str:
    """What to say when a NaN/Inf is the derivative of `primitive` (`sqrt`, `cbrt`, `pow`
    with an `exponent` below 1) at an input of exactly 0, the only finite input where
    it is infinite: its backward made it of a finite cotangent (`held` False), or a
    `jax.grad` inside the program computed it as a forward value (`held`: the +Inf
    the message says the origin held). `in_norm`: it is `jnp.linalg.norm`'s `sqrt`, at
    a zero vector (a point's distance to itself). One line of why, then the fix."""
    if primitive == "pow":
        what = f"`x ** {exponent:g}`'s derivative {exponent:g} * x ** {exponent - 1:g}"
        fix = f"`jnp.maximum(x, eps) ** {exponent:g}`, or "
    elif primitive == "cbrt":
        what, fix = "`cbrt`'s derivative 1 / (3 * cbrt(x) ** 2)", ""
    else:
        what, fix = "`sqrt`'s derivative 0.5 / sqrt(x)", "`jnp.sqrt(jnp.maximum(x, eps))`, or "
    if in_norm:
        fix = f"{NORM_FIX}, or "
    at = " (`norm` of a zero vector: a distance of 0, as a point's to itself)" if in_norm else ""
    if held:
        why = (
            f"that +Inf is {what} at x = 0{at}, computed for a `jax.grad` or `jax.jvp` "
            "inside the program, and 0 × Inf = NaN"
        )
    else:
        why = f"{what} is infinite at x = 0, and only there: its input is exactly 0{at}"
    return f"; {why}. Fix: {fix}{DOUBLE_WHERE}"


def loop_fill_message(n: Any, kinds: frozenset[str], tested: Sequence[Any] = ()) -> str:
    """What a finite run's loop-carried fill values are: first made by `n` before a loop,
    carried in its state (diffrax's +Inf output buffer), reaching no result; `tested`:
    the stages of a loop's body that made a NaN only tests read (`_tested_nans`)."""
    also = ""
    if tested:
        names = ", ".join(stage_name(t) for t in tested[:3])
        also = (
            f", and a NaN in {names} that only comparisons read (a solver's convergence "
            "test on its starting Inf): it becomes no value"
        )
    return (
        f"Only {_held(kinds)} fill values, first made by {stage_name(n)} before a loop and "
        'carried in its state (a buffer or a "best so far" that starts at Inf), as the '
        f"library means them{also}"
    )


def mask_fill_message(n: Any, kinds: frozenset[str], at: str = "") -> str:
    """What a finite run's mask values made inside a loop are: first put by `n` (a
    `jnp.where` of a literal `-jnp.inf`) in the loop's body, `at` that iteration
    (`at_iteration`), and masked before any result, as a decoder's causal mask is."""
    return (
        f"Only {_held(kinds)} mask values, first put by {stage_name(n)}{at or ' in a loop'} "
        "(a mask made per step, `jnp.where(mask, s, -jnp.inf)` before a softmax, as a "
        "decoder's causal mask is), as the program means them"
    )


def degenerate_spectrum_hint(primitive: str) -> str:
    """What to say when the backward of `eigh` or `svd` made the NaN/Inf of a finite
    cotangent: its vectors' derivative divides by the differences of the eigenvalues,
    1 / (λi − λj) (`svd`: of the squared singular values), infinite where two are equal
    (`eigh` of the identity), the classic trap. Each fix named is tested to give finite
    gradients equal to plain JAX's; a loss invariant to the basis of a repeated
    eigenvalue's eigenspace is no fix: JAX's rule still multiplies its 0 by Inf. "" for
    any other equation."""
    if primitive == "eigh":
        return (
            "; the gradient of `eigh`'s eigenvectors divides by the differences of its "
            "eigenvalues, 1 / (λi − λj), and two are equal (repeated eigenvalues: the "
            "identity's, or a matrix's with a symmetry), so it is undefined there. Fix: if the "
            "loss needs only the eigenvalues, `jnp.linalg.eigvalsh(a)` (their gradient is "
            "defined there); else break the tie with a small distinct diagonal, "
            "`jnp.linalg.eigh(a + jnp.diag(eps * jnp.arange(a.shape[-1])))`, or give the "
            "eigendecomposition a `jax.custom_jvp` whose 1 / (λi − λj) is 0 where λi = λj"
        )
    if primitive == "svd":
        return (
            "; the gradient of `svd`'s singular vectors divides by the differences of the "
            "squared singular values, 1 / (σj² − σi²), and two are equal (repeated singular "
            "values, as an orthogonal matrix's, or two zero ones), so it is undefined there. "
            "Fix: if the loss needs only the singular values, `jnp.linalg.svdvals(x)` (their "
            "gradient is defined there); else break the tie with a small distinct diagonal, "
            "`jnp.linalg.svd(x + jnp.diag(eps * jnp.arange(x.shape[-1])), full_matrices=False)`"
        )
    return ""


def with_message(o: Origins) -> Origins:
    """`o` with its one-line summary of both passes."""
    parts = [o.fill] if o.fill else []
    if o.forward is not None:
        parts.append("forward pass: " + o.forward.message)
    if o.backward is not None:
        parts.append("backward pass: " + o.backward.message)
    text = "; ".join(parts) or "only expected non-finite values"
    if o.removed:
        text += " (masked afterwards: no result is non-finite)"
    return replace(o, message=text)


def not_reproduced(o: Origins) -> Origins:
    """`o`, a step's own record, kept when `locate`'s re-run found no NaN/Inf reaching a
    result (XLA compiled the probed program's arithmetic otherwise): its first origin
    says so (`NOT_REPRODUCED`) instead of promising an equation; `alarm` unchanged."""
    if NOT_REPRODUCED in o.message:
        return o  # (said already)
    fwd, bwd = (_unpromised(p) for p in (o.forward, o.backward))
    if fwd is not None:
        fwd = replace(fwd, message=fwd.message + NOT_REPRODUCED)
    elif bwd is not None:
        bwd = replace(bwd, message=bwd.message + NOT_REPRODUCED)
    else:  # no origin of either pass: the record's own sentence says it
        return replace(o, message=o.message + NOT_REPRODUCED)
    return with_message(replace(o, forward=fwd, backward=bwd))


def _unpromised(p: Origin | None) -> Origin | None:
    """`p` without the promise that `locate_nonfinite()` names its equation."""
    return p and replace(p, message=p.message.replace(NAMES_THE_EQUATION, ""))


def message(graph: Any, step: int, where: Any) -> str:
    """The sentence `NonFiniteError` carries: where NaN/Inf first appeared. `where` is
    an `Origins`, or (forward node id, backward node id) when no rule ran."""
    if isinstance(where, Origins):
        return f"non-finite values at step {step}; {where.message}"
    parts = []
    for label, node in (("forward pass", where[0]), ("backward pass", where[1])):
        if node is not None:
            n = graph.node(node)
            at = f" at {n.source}" if n.source else ""
            parts.append(f"{label}: first in stage {n.label!r} ({n.kind}, {node}){at}")
    return f"non-finite values at step {step}; " + "; ".join(parts)


#: How many gradient leaves a message names before "and N more".
GRADS_NAMED = 3
#: Why `locate`'s re-run may disagree with the step on which gradients are non-finite:
#: its program, every equation probed, is compiled (fused, so rounded) otherwise.
RERUN = "the re-run that located it (every equation probed: compiled, so rounded, otherwise)"
#: After the step's own list: the leaves only the re-run made non-finite ...
RERUN_ONLY_GRADS = (
    f"; {RERUN} also made a non-finite gradient of {{names}}, which this step's gradients "
    "hold finite"
)
#: ... and those the step made non-finite that the re-run kept finite.
STEP_ONLY_GRADS = (
    f"; {RERUN} kept the gradient of {{names}} finite, which this step's gradients hold non-finite"
)


def grads_named(paths: Sequence[str]) -> str:
    """ "`a`, `b`, `c` and 2 more": gradient leaves by path, the first `GRADS_NAMED`."""
    said = ", ".join(f"`{p}`" for p in paths[:GRADS_NAMED])
    more = f" and {len(paths) - GRADS_NAMED} more" if len(paths) > GRADS_NAMED else ""
    return said + more


def grads_sentence(mine: Sequence[str], other: Sequence[str]) -> str:
    """What a backward origin's message ends with: the leaves whose gradients hold
    NaN/Inf (`mine`), and those another origin made (`other`); "" when none does."""
    if not mine and not other:
        return ""
    mine, other = (mine, other) if mine else (other, ())
    out = f"{NONFINITE_GRADS}{grads_named(mine)}"
    if other:
        out += f"{OTHER_ORIGIN_GRADS}{grads_named(other)}{OTHER_ORIGIN_FIX}"
    return out


def with_step_grads(step: Origins | None, found: Origins) -> Origins:
    """`found`, `locate`'s record, naming the gradient leaves that are non-finite in the
    values the step returned (`step`: the step's own record; None: all were finite), not
    in its re-run's: that program is fused otherwise, and in float16 one more leaf may
    overflow there, or one fewer. A leaf on which they disagree is said apart."""
    mine_then = (*step.grads, *step.other_grads) if step is not None else ()
    rerun = (*found.grads, *found.other_grads)
    if set(mine_then) == set(rerun):
        return found
    # the step's leaves, in its order; the re-run's split (whose values reach its origin)
    mine = tuple(p for p in mine_then if p not in found.other_grads)
    other = tuple(p for p in mine_then if p in found.other_grads)
    mine, other = (mine, other) if mine else (other, ())
    said = grads_sentence(mine, other)
    extra = [p for p in rerun if p not in mine_then]
    spared = [p for p in mine_then if p not in rerun]
    if extra:
        said += RERUN_ONLY_GRADS.format(names=grads_named(extra))
    if spared:
        said += STEP_ONLY_GRADS.format(names=grads_named(spared))
    out = replace(found, grads=mine, other_grads=other)
    old = grads_sentence(found.grads, found.other_grads)
    for name in ("backward", "forward"):  # the backward origin's message names them
        o = getattr(out, name)
        if o is None:
            continue
        if old and old in o.message:
            text = o.message.replace(old, said, 1)
        elif name == "backward" or out.backward is None:
            text = o.message + said
        else:
            continue
        return with_message(replace(out, **{name: replace(o, message=text)}))
    return replace(out, message=out.message + said)  # (no origin: the record's sentence)


def on_devices(devices: tuple | None) -> str:
    """ ", on the device at `batch`=6": which devices of the mesh of a `shard_map` around
    the origin made its non-finite values (`_Flags.fwd_devices`: the mesh axes, their
    sizes, the devices' row-major indices), by their coordinates along its axes. ""
    when not known (outside a shard_map), or when every device made them."""
    if not devices:
        return ""
    axes, shape, bad = devices
    total = math.prod(shape)
    if not bad or (len(bad) == total and total > 1):
        return ""
    at = [
        ", ".join(f"`{a}`={int(i)}" for a, i in zip(axes, np.unravel_index(b, shape), strict=True))
        for b in bad[:3]
    ]
    if len(bad) == 1:
        return f", on the device at {at[0]}"
    more = f" and {len(bad) - 3} more" if len(bad) > 3 else ""
    return f", on {len(bad)} of {total} devices ({'; '.join(at)}{more})"


#: What `on_devices` says, found again in a message (`devices_said`).
_ON_DEVICES = re.compile(
    r", on (?:the device at `[^`]+`=\d+(?:, `[^`]+`=\d+)*|\d+ of \d+ devices \([^)]*\))"
)


def devices_said(message: str) -> str:
    """The `on_devices` part of a `forward_message`, or "": kept when `locate` names the
    equation in a new message (`with_equations`)."""
    found = _ON_DEVICES.search(message)
    return found.group(0) if found else ""
