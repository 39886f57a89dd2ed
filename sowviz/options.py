"""Options of `inspect`, `show` and `Monitor`: one typed, validated object.

Every option is checked when it is given, with an error that names the option,
what was wrong and how to fix it; misspelled options are rejected. (Checks are
`raise`, never `assert`, so `python -O` keeps them.)
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ._model import Mode

Capture = Literal["sows", "stages", "all"]
CAPTURES = ("sows", "stages", "all")
DUPLICATES = ("error", "suffix", "stack")
#: Upper bound for `bins`: a histogram per probe and mode travels to the host each step.
MAX_BINS = 4096

OPTION_NAMES = (
    "argnums",
    "tangents",
    "cotangents",
    "bins",
    "title",
    "tag",
    "duplicates",
    "loops",
    "strict",
    "tesseract_names",
    "expect_nonfinite",
    "has_aux",
)

_KWARGS = "(To pass keyword arguments to your function, bind them first with functools.partial.)"

#: The options that only some modes use, those modes, and why the others do not: given
#: to another mode, such an option would change nothing (`check_used_by_mode`).
_MODES_USING = {
    "argnums": (
        (Mode.GRAD, Mode.JVP, Mode.VJP, Mode.ALL),
        "picks the arguments to differentiate, and mode 'primal' differentiates nothing",
    ),
    "tangents": (
        (Mode.JVP, Mode.ALL),
        "is the direction a JVP pushes forward, and mode '{mode}' pushes no tangent",
    ),
    "cotangents": (
        (Mode.VJP, Mode.ALL),
        "is the seed a VJP pulls back, and mode '{mode}' pulls back none",
    ),
}
_COTANGENTS_IN_GRAD = (
    "is the seed a VJP pulls back, and mode 'grad' pulls back 1 from its scalar loss, as "
    "`jax.grad` does (to scale the gradient, scale the loss)"
)
_UNUSED = (
    "sowviz.{where}: `{name}` {why}: it would be ignored. It is used by mode(s) {modes}; "
    "pass mode={first!r}, or leave `{name}` out."
)
#: Set while `show`'s widget runs another mode with the options `show` was given (any
#: mode the widget switches to may use them): `check_used_by_mode` is off then.
_EVERY_MODE: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "sowviz_every_mode", default=False
)


@contextlib.contextmanager
def options_for_every_mode() -> Iterator[None]:
    """Within: options are taken for every mode (`show`'s, which the widget re-runs in
    the mode it switches to), not refused in a mode that does not use them."""
    token = _EVERY_MODE.set(True)
    try:
        yield
    finally:
        _EVERY_MODE.reset(token)


def check_used_by_mode(where: str, mode: Mode, options: Mapping[str, Any]) -> None:
    """A ValueError for an option given (not None) to a mode that does not use it
    (`cotangents` in mode grad: the gradient came back unscaled, without a word).
    `show` takes them all: its widget switches to the modes that use them."""
    if where == "show" or _EVERY_MODE.get():
        return
    for name, (modes, why) in _MODES_USING.items():
        if options.get(name) is None or mode in modes:
            continue
        why = _COTANGENTS_IN_GRAD if (name, mode) == ("cotangents", Mode.GRAD) else why
        names = " and ".join(repr(m.value) for m in modes)
        raise ValueError(
            _UNUSED.format(
                where=where,
                name=name,
                why=why.format(mode=mode.value),
                modes=names,
                first=modes[0].value,
            )
        )


def check_bool(where: str, name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(
            f"sowviz.{where}: `{name}` must be True or False, got {value!r} "
            f"({type(value).__name__})."
        )
    return value


def check_int(where: str, name: str, value: Any, *, lo: int = 1, hi: int | None = None) -> int:
    ok = isinstance(value, int) and not isinstance(value, bool)
    if not ok or value < lo or (hi is not None and value > hi):
        span = f"between {lo} and {hi}" if hi is not None else f"≥ {lo}"
        raise (TypeError if not ok else ValueError)(
            f"sowviz.{where}: `{name}` must be an int {span}, got {value!r}."
        )
    return value


def check_number(where: str, name: str, value: Any, *, lo: float = 0.0) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= lo:
        raise TypeError(
            f"sowviz.{where}: `{name}` must be a number ≥ {lo} (seconds), got {value!r}."
        )
    return float(value)


def check_str(where: str, name: str, value: Any, *, optional: bool = False) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value:
        what = "a non-empty string" + (" or None" if optional else "")
        raise TypeError(f"sowviz.{where}: `{name}` must be {what}, got {value!r}.")
    return value


def check_mode(where: str, mode: Any) -> Mode:
    try:
        return Mode(mode)
    except ValueError:
        names = ", ".join(repr(m.value) for m in Mode)
        raise ValueError(
            f"sowviz.{where}: unknown `mode` {mode!r}; use one of {names} "
            "('grad' for value and gradient, 'jvp' for tangents, 'all' for both)."
        ) from None


def check_argnums(where: str, argnums: Any) -> int | tuple[int, ...]:
    def is_int(a: Any) -> bool:
        return isinstance(a, int) and not isinstance(a, bool)

    if is_int(argnums):
        return argnums
    if isinstance(argnums, Sequence) and not isinstance(argnums, str) and argnums:
        if all(is_int(a) for a in argnums):
            return tuple(argnums)
    if type(argnums).__name__ == "DiffState":  # Flax NNX's: one argument, a filter
        raise TypeError(_DIFF_STATE.format(where=where, argnum=getattr(argnums, "argnum", 0)))
    raise TypeError(
        f"sowviz.{where}: `argnums` must be an int or a non-empty tuple of ints (positions "
        f"of the arguments to differentiate), got {argnums!r}; e.g. argnums=0 or (0, 1)."
    )


_DIFF_STATE = (
    "sowviz.{where}: `argnums` takes argument positions, not an `nnx.DiffState` "
    "(differentiating only some of a model's variables, e.g. LoRA's). Split the model "
    "so that those variables are an argument of their own, and differentiate it:\n"
    "    graphdef, trained, frozen = nnx.split(model, nnx.LoRAParam, ...)\n"
    "    def loss_of(trained, frozen, *args):\n"
    "        return loss(nnx.merge(graphdef, trained, frozen), *args)\n"
    "then pass `loss_of`, `trained, frozen, ...` and argnums={argnum} (the gradient is "
    "that of `nnx.value_and_grad` with the DiffState)."
)


def _tesseract_names(where: str, value: Any) -> Any:
    """Hashable form: None, a callable, or the mapping's items."""
    if value is None or callable(value):
        return value
    if isinstance(value, Mapping) and all(isinstance(v, str) for v in value.values()):
        # keys: a Tesseract's name, or the Tesseract object itself (by identity)
        items = sorted(value.items(), key=lambda kv: (not isinstance(kv[0], str), str(kv[0])))
        try:
            hash(tuple(items))
            return tuple(items)
        except TypeError:
            pass
    raise TypeError(
        f"sowviz.{where}: `tesseract_names` must be None, a dict of Tesseract (or its "
        "name) → label (a string), or a function of the Tesseract returning its label; "
        f"got {value!r}."
    )


def _names(where: str, name: str, value: Any) -> tuple[str, ...]:
    """One name or a sequence of names, as a tuple of non-empty strings."""
    items = (value,) if isinstance(value, str) else value
    if isinstance(items, Sequence) and all(isinstance(v, str) and v for v in items):
        return tuple(items)
    raise TypeError(
        f"sowviz.{where}: `{name}` must be a stage label or sow name, or a tuple of them "
        f"(e.g. {name}=('mask',)); got {value!r}."
    )


@dataclass(frozen=True)
class InspectOptions:
    """Options shared by `inspect`, `show` and `Monitor` (all keyword-only there).

    `tangents`/`cotangents` are values, not options of the compiled program: they
    travel into it as arguments, so new values reuse the compiled program."""

    mode: Mode = Mode.GRAD
    capture: Capture = "stages"
    #: the arguments differentiated: None is argument 0 in mode "grad" and every
    #: argument in modes "jvp", "vjp" and "all" (as `jax.jvp`/`jax.vjp` take them)
    argnums: int | tuple[int, ...] | None = None
    tangents: Any = None
    cotangents: Any = None
    bins: int = 64
    title: str | None = None
    tag: str = "intermediates"
    duplicates: str = "suffix"
    loops: Literal["last"] | int = "last"
    strict: bool = True
    tesseract_names: Any = None
    #: stage labels or sow names where NaN/Inf are expected (e.g. an attention mask's
    #: -inf): no alarm for them nor for the kinds of values they pass on (sowviz.nonfinite)
    expect_nonfinite: tuple[str, ...] = ()
    #: `fn` returns `(output, aux)`: `aux` is carried along, never differentiated, and
    #: returned as `jax.value_and_grad(fn, has_aux=True)` returns it
    has_aux: bool = False

    @classmethod
    def from_kwargs(
        cls, where: str, mode: Any, capture: Any, options: dict[str, Any]
    ) -> InspectOptions:
        unknown = sorted(set(options) - set(OPTION_NAMES))
        if unknown:
            raise TypeError(
                f"sowviz.{where}: unknown option(s) {', '.join(map(repr, unknown))}. "
                f"Known options: {', '.join(OPTION_NAMES)}. {_KWARGS}"
            )
        if capture not in CAPTURES:
            raise ValueError(
                f"sowviz.{where}: unknown `capture` {capture!r}; use 'stages' (user sows and "
                "every stage's outputs), 'sows' (user sows only) or 'all' (every equation)."
            )
        o = dict(options)
        if o.get("argnums") is not None:
            o["argnums"] = check_argnums(where, o["argnums"])
        if "bins" in o:
            check_int(where, "bins", o["bins"], lo=1, hi=MAX_BINS)
        if "title" in o:
            check_str(where, "title", o["title"], optional=True)
        if "tag" in o:
            check_str(where, "tag", o["tag"])
        if "duplicates" in o and o["duplicates"] not in DUPLICATES:
            raise ValueError(
                f"sowviz.{where}: unknown `duplicates` {o['duplicates']!r}; use one of "
                f"{', '.join(map(repr, DUPLICATES))}."
            )
        if "loops" in o and o["loops"] != "last":
            check_int(where, "loops", o["loops"], lo=1)
        for name in ("strict", "has_aux"):
            if name in o:
                check_bool(where, name, o[name])
        if "tesseract_names" in o:
            o["tesseract_names"] = _tesseract_names(where, o["tesseract_names"])
        if o.get("tangents") is not None and not isinstance(o["tangents"], (tuple, list)):
            raise TypeError(
                f"sowviz.{where}: `tangents` must be a tuple with one tangent per positional "
                f"argument, shaped like the arguments; got a {type(o['tangents']).__name__}. "
                "For a single argument write tangents=(t,)."
            )
        if o.get("tangents") is not None:
            o["tangents"] = tuple(o["tangents"])
        if "expect_nonfinite" in o:
            o["expect_nonfinite"] = _names(where, "expect_nonfinite", o["expect_nonfinite"])
        mode = check_mode(where, mode)
        check_used_by_mode(where, mode, o)
        return cls(mode=mode, capture=capture, **o)

    @property
    def grad_argnums(self) -> int | tuple[int, ...]:
        """The arguments mode "grad" differentiates (and the graph draws as
        "parameters"): `argnums`, argument 0 by default, as `jax.grad`."""
        return 0 if self.argnums is None else self.argnums

    def drawn_parameters(self, parted: Collection[int] = ()) -> tuple[int, ...]:
        """The arguments the graph draws as the group "parameters": those mode "grad"
        differentiates (`grad_argnums`). Mode "primal" takes no derivative: there each
        argument keeps its name (`runner_state`), but for one of them that holds a model's
        state beside its parameters (`parted`: a Flax NNX model, parted as
        `nnx.split(model, nnx.Param, ...)` parts it), as in the other modes."""
        nums = self.grad_argnums
        nums = (nums,) if isinstance(nums, int) else tuple(nums)
        if self.mode is Mode.PRIMAL:
            return tuple(a for a in nums if a in parted)
        return nums

    def graph_key(self) -> tuple:
        """What the stage graph depends on (beyond the function and its arguments): the
        arguments drawn as "parameters" (`drawn_parameters`)."""
        primal = self.mode is Mode.PRIMAL
        return (self.capture, self.title, self.tesseract_names, self.has_aux, self.argnums, primal)

    def program_key(self) -> tuple:
        """What the compiled program depends on (beyond the graph): not the values of
        `tangents`/`cotangents`, which are arguments of the program."""
        return (
            self.mode,
            self.argnums,
            self.bins,
            self.tag,
            self.duplicates,
            self.loops,
            self.strict,
            *self.graph_key(),
        )
