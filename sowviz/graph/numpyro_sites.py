"""NumPyro models drawn as their structure, with no change to user code.

NumPyro runs a model through a stack of effect handlers (`trace`, `substitute`,
`seed`), each one a `numpyro.primitives.Messenger` whose `__call__` calls the next,
and computes each sample site's log-density after the model returns, in a loop over
the trace (`compute_log_probs`). Traced as it is, the model's code sat in a box
named after NumPyro's `trace.get_trace`, each distribution's construction read
`DistributionMeta` (the metaclass's `__call__`), and the log-densities were folds
labelled from NumPyro's source text (`log_joint[site['name']]`), no site named.

While `frameworks.named`'s call runs (`tracing`), hooks on NumPyro's public classes
push `jax.named_scope`s (`_Run` keeps what they learn):

* a **run of a model**: the innermost handler's call of the user's function (a
  `Messenger` whose `fn` is no handler) is a scope named by that function (`model`);
  an object's by its class, an autoguide's as a guide (`guide: AutoNormal`);
* a **sample site**: the distributions are known by identity from `_Sites`, a
  handler below every other of the run, which sees each site as `trace` records it.
  Its `log_prob` is `log_prob(<site>)`, whose output is the site's log-density, with
  its gradient; a guide's (an autoguide's, or a function's named like one:
  `guide`, `my_guide`) is `log q(<site>)`, so an ELBO's two densities of one site
  are told apart. Its draw (`Distribution.__call__`, the reparametrized sample a
  guide takes) is `sample(<site>)`; the key it draws with, split off the `seed`
  handler's, `seed(<site>)` before it. A model run against a guide's trace (an ELBO's:
  `replay` gives each latent site the guide's value) draws nothing: the split is all
  of its site's code, `sample(<site>)` too. A site's value made from an unconstrained
  parameter (`potential_energy`'s `substitute`, with its Jacobian) is
  `constrain(<site>)`, and the log-Jacobian that `substitute` adds as a factor site
  (`_tau_log_det`) is sown as `log|J| (<site>)` in a stage of that name, where it
  enters the log-density (its `Unit.log_prob` computes nothing: a scope of it would
  be empty). The support check of a
  log-density (the private `_validate_sample`) is `support(<site>)`, inside it;
* a **distribution's construction** is a scope named by its class, numbered per
  run (`Normal`, `Normal#2`: two in a row stay two stages), not by the metaclass;
  it is built before `numpyro.sample` gets it, so once `_Sites` sees which site it
  went to (or a distribution wrapping it, `.to_event(1)`), the graph names it by the
  site, `theta: Normal` (`relabeled`, applied by `build`), sourced at the user's line
  that built it (the first equation may be a plate's `arange`, staged where first
  read: the `with numpyro.plate` line above);
* a `numpyro.deterministic` site's value is a `sowviz.sow` point named by the site
  (`logits`), with its primal, tangent and cotangent.

Nothing else changes: the scopes and the sow are identities, every hook calls the
original, and outside `tracing` (another thread, or after it) the originals run
untouched. The hooks are installed only when the user has imported NumPyro
(`sys.modules`); installing is reference counted under a lock, and the originals go
back when the last user leaves.
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import dataclasses
import functools
import sys
import types
from collections.abc import Callable, Iterator
from typing import Any

import jax

from .._compat import SourceLocation, user_call_site
from ..capture.primitive import sow as sow_value
from .patches import Patches


@dataclasses.dataclass
class _Model:
    """A run of a model (or guide) in progress: whether it is a guide, and how many
    distributions of each class it has built."""

    guide: bool = False
    built: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    #: its stage's label (`model_label`)
    label: str = ""


@dataclasses.dataclass(frozen=True)
class _Built:
    """A distribution built in a run of a model: the run's label, the construction's
    scope label (`Normal#2`), its class, and the user's line that built it."""

    model: str
    label: str
    cls: str
    site: SourceLocation | None


@dataclasses.dataclass
class _Run:
    """What one trace of the user's function learned of its NumPyro models."""

    #: id(distribution) -> (its site, whether a guide's, the distribution: kept alive,
    #: so that ids stay unique)
    sites: dict[int, tuple[str, bool, Any]] = dataclasses.field(default_factory=dict)
    #: the runs of models in progress, innermost last; the first stands for none
    models: list[_Model] = dataclasses.field(default_factory=lambda: [_Model()])
    #: a `_Sites` handler is on NumPyro's stack below the running model's handlers
    listening: bool = False
    #: the site whose scope is open (its distribution's own inner calls push none)
    site: str | None = None
    #: a distribution is being built (one it builds is part of its construction)
    building: bool = False
    #: a site's value is being checked against its support (`support(<site>)`)
    checking: bool = False
    #: the site whose value `potential_energy`'s substitute is constraining
    constraining: str | None = None
    #: the factor sites that add a constrained site's log-Jacobian (`_tau_log_det`), and
    #: the site (`tau`)
    jacobians: dict[str, str] = dataclasses.field(default_factory=dict)
    #: id(distribution) -> how it was built, and the distribution (kept alive)
    built: dict[int, tuple[_Built, Any]] = dataclasses.field(default_factory=dict)
    #: (model's label, construction's label) -> the construction's stage label named by
    #: the site its distribution was given to (`theta: Normal`, not `Normal#2`)
    relabel: dict[tuple[str, str], str] = dataclasses.field(default_factory=dict)
    #: (model's label, construction's stage label, `relabel`'s) -> the user's line that
    #: built it
    built_at: dict[tuple[str, str], SourceLocation] = dataclasses.field(default_factory=dict)
    #: the names this module sowed (`log|J| (tau)`, a deterministic site's): sowviz's
    #: own captures, which the user wrote no `sow` for (`own_sows`)
    sown: set[str] = dataclasses.field(default_factory=set)


_ACTIVE: contextvars.ContextVar[_Run | None] = contextvars.ContextVar(
    "sowviz_numpyro_sites", default=None
)
_PATCHES = Patches()


def present() -> bool:
    """Whether the user has imported NumPyro's primitives and distributions."""
    return "numpyro.primitives" in sys.modules and "numpyro.distributions" in sys.modules


@contextlib.contextmanager
def tracing() -> Iterator[_Run]:
    """The hooks push their scopes while this is open (in this context only); the run
    it gives says what they did (`own_sows`)."""
    run = _Run()
    token = _ACTIVE.set(run)
    try:
        yield run
    finally:
        _ACTIVE.reset(token)


def own_sows(run: _Run) -> frozenset[str]:
    """The names of the sows the hooks made in `run`. The checks of a user's `sow`
    ("not reached: sow the custom function's output instead", "no cotangent") would
    give advice about code the user never wrote: a `log|J| (tau)` whose inner cotangent
    is the constant 1 under a leapfrog's `jax.grad` of the potential has no gradient
    for a reason of NumPyro's, not a mistake of theirs."""
    return frozenset(run.sown)


# ---------------------------------------------------------------------------
# Labels.


def density_label(name: str, guide: bool) -> str:
    """A sample site's log-density stage: `log_prob(obs)`, a guide's `log q(mu)`."""
    return f"log q({name})" if guide else f"log_prob({name})"


def jacobian_label(name: str) -> str:
    """The log-Jacobian term of site `name`'s constrained value: `log|J| (tau)`."""
    return f"log|J| ({name})"


def _unwrapped(fn: Any) -> Any:
    while isinstance(fn, functools.partial):
        fn = fn.func
    return fn


def _autoguide(fn: Any) -> bool:
    module = sys.modules.get("numpyro.infer.autoguide")
    base = getattr(module, "AutoGuide", None)
    return base is not None and isinstance(_unwrapped(fn), base)


def model_label(fn: Any) -> str:
    """The stage of a model's run: the function's name (`model`), a `partial`'s by its
    function's, an object's by its class, an autoguide's as a guide (`guide: AutoNormal`)."""
    fn = _unwrapped(fn)
    if _autoguide(fn):
        return f"guide: {type(fn).__name__}"
    name = getattr(fn, "__name__", None)
    if isinstance(name, str) and name.isidentifier():
        return name
    # (a lambda names nothing: it is the model)
    return "model" if isinstance(fn, types.FunctionType) else type(fn).__name__


def is_guide(fn: Any) -> bool:
    """Whether `fn` is a guide: an autoguide, or a function named like one (`guide`)."""
    return _autoguide(fn) or "guide" in model_label(fn).lower()


# ---------------------------------------------------------------------------
# The hooks. Each calls the original; each pushes its scope only while `tracing`.


def _messenger() -> type:
    return sys.modules["numpyro.primitives"].Messenger


def _distribution() -> type:
    return sys.modules["numpyro.distributions"].Distribution


@functools.cache
def _sites_class(messenger: type) -> type:
    """`_Sites`, a NumPyro handler (made once NumPyro is imported: its base is NumPyro's)."""

    class _Sites(messenger):  # type: ignore[misc, valid-type]
        """At the bottom of NumPyro's stack: it processes each site after every other
        handler (knowing the site's distribution before it draws) and postprocesses it
        before them, before `trace` records it."""

        def __init__(self, run: _Run) -> None:
            super().__init__()
            self.run = run

        def process_message(self, msg: dict) -> None:
            name = msg.get("name")
            if msg.get("type") == "sample" and isinstance(name, str) and msg.get("fn") is not None:
                guide = self.run.models[-1].guide
                self.run.sites[id(msg["fn"])] = (name, guide, msg["fn"])
                _name_construction(self.run, name, msg["fn"])
                of = self.run.constraining
                if of not in (None, name) and _is_factor(msg["fn"]):
                    # `numpyro.factor` of the log-Jacobian, inside `constrain(<of>)`
                    self.run.jacobians[name] = of

        def postprocess_message(self, msg: dict) -> None:
            name, value = msg.get("name"), msg.get("value")
            if msg.get("type") == "deterministic" and isinstance(name, str) and _traced(value):
                # the model and the trace both hold the sown value: its cotangent is
                # the whole gradient
                self.run.sown.add(name)
                msg["value"] = sow_value(value, name)

    return _Sites


def _name_construction(run: _Run, site: str, fn: Any) -> None:
    """Name the constructions of site `site`'s distribution `fn` (and of those it wraps,
    `dist.Normal(0, 1).expand([J]).to_event(1)`'s) by the site: `theta: Normal`. A
    distribution is built before `numpyro.sample` receives it, so its scope was pushed
    numbered (`Normal#2`), which told no reader which site it was."""
    seen: set[int] = set()
    while fn is not None and id(fn) not in seen:
        seen.add(id(fn))
        found = run.built.get(id(fn))
        if found is not None and found[1] is fn:
            built = found[0]
            label = f"{site}: {built.cls}"
            key = (built.model, built.label)
            if run.relabel.setdefault(key, label) != label:
                # (one label given to constructions for several sites: runs of one model
                # that built in another order; none is named)
                run.relabel[key] = built.label
            elif built.site is not None:
                run.built_at[built.model, label] = built.site
        fn = getattr(fn, "base_dist", None)


def relabeled(
    run: _Run | None,
) -> tuple[dict[tuple[str, str], str], dict[tuple[str, str], SourceLocation]]:
    """The constructions' stage labels named by their sites, by (model's label,
    construction's label), and where the user built each (`_name_construction`)."""
    if run is None:
        return {}, {}
    return dict(run.relabel), dict(run.built_at)


def _is_factor(fn: Any) -> bool:
    """Whether `fn` is the distribution of a `numpyro.factor` site (`Unit`)."""
    unit = getattr(sys.modules["numpyro.distributions"], "Unit", None)
    return unit is not None and isinstance(fn, unit)


def _traced(value: Any) -> bool:
    leaves = jax.tree_util.tree_leaves(value)
    return bool(leaves) and all(isinstance(x, jax.Array) for x in leaves)


def _wrap_call(raw: Callable) -> Callable:
    """`Messenger.__call__`: the innermost handler's call of the user's function inside
    the scope of its label, with a `_Sites` handler below the outermost handler."""

    def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
        run = _ACTIVE.get()
        if run is None:
            return raw(self, *args, **kwargs)
        if not run.listening:
            run.listening = True
            try:
                with _sites_class(_messenger())(run):
                    return __call__(self, *args, **kwargs)
            finally:
                run.listening = False
        fn = getattr(self, "fn", None)
        if fn is None or isinstance(fn, _messenger()):
            return raw(self, *args, **kwargs)  # a handler passing the call on
        label = model_label(fn)
        run.models.append(_Model(guide=is_guide(fn), label=label))
        try:
            return _scoped(label, raw, self, *args, **kwargs)
        finally:
            run.models.pop()

    return __call__


def _site_of(dist: Any) -> tuple[_Run, str, bool] | None:
    """The run and site (name, whether a guide's) of a site's distribution, unless a
    site's scope is open already."""
    run = _ACTIVE.get()
    if run is None or run.site is not None:
        return None
    found = run.sites.get(id(dist))
    if found is None or found[2] is not dist:
        return None
    return run, found[0], found[1]


def _in_site(run: _Run, site: str, label: str, fn: Callable, *args: Any, **kwargs: Any) -> Any:
    """`fn(*args, **kwargs)` inside the scope `label` of `site`, which is open meanwhile."""
    outer, run.site = run.site, site
    try:
        return _scoped(label, fn, *args, **kwargs)
    finally:
        run.site = outer


def _scoped(label: str, fn: Callable, *args: Any, **kwargs: Any) -> Any:
    """`fn(*args, **kwargs)` inside `jax.named_scope(label)`: the one frame that pushes a
    scope of this module's (`SCOPE_CODE`)."""
    with jax.named_scope(label):
        return fn(*args, **kwargs)


#: The code of the frame that pushes each scope of this module's: the library calls
#: made outside it (NumPyro's `log_density` > `compute_log_probs` around a site's
#: `log_prob`) are what the scope says already, and `_compat.call_path` may cut a
#: call path there, as `frameworks.CALL_CODE` marks a module's call.
SCOPE_CODE = _scoped.__code__


def _wrap_log_prob(raw: Callable) -> Callable:
    """A distribution class's `log_prob`: a site's inside `log_prob(<site>)`."""

    def log_prob(self: Any, *args: Any, **kwargs: Any) -> Any:
        found = _site_of(self)
        if found is None:
            return raw(self, *args, **kwargs)
        run, site, guide = found
        of = run.jacobians.get(site)
        if of is not None:
            return _jacobian_term(raw(self, *args, **kwargs), of)
        return _in_site(run, site, density_label(site, guide), raw, self, *args, **kwargs)

    return functools.wraps(raw)(log_prob)


def _jacobian_term(term: Any, of: str) -> Any:
    """The log-density of the factor adding site `of`'s log-Jacobian, sown as
    `log|J| (<of>)`: its log-density (`Unit.log_prob`) only passes the term on, so a
    scope of it would be empty, and the term would reach the sum of the log-densities
    unnamed, like any site's."""
    if not _traced(term):
        return term
    label = jacobian_label(of)
    run = _ACTIVE.get()
    if run is not None:
        run.sown.add(label)
    return _scoped(label, sow_value, term, label)


def _wrap_sample(raw: Callable) -> Callable:
    """`Distribution.__call__` (how a sample site draws): a site's inside `sample(<site>)`."""

    def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
        found = _site_of(self)
        if found is None:
            return raw(self, *args, **kwargs)
        run, site, _ = found
        return _in_site(run, site, f"sample({site})", raw, self, *args, **kwargs)

    return functools.wraps(raw)(__call__)


def _wrap_validate(raw: Callable) -> Callable:
    """A distribution class's private `_validate_sample`: inside a site's `log_prob`, the
    support check of the value, `support(<site>)`."""

    def _validate_sample(self: Any, *args: Any, **kwargs: Any) -> Any:
        run = _ACTIVE.get()
        if run is None or run.site is None or run.checking:
            return raw(self, *args, **kwargs)
        run.checking = True  # (`HalfCauchy`'s check calls its base class's)
        try:
            return _scoped(f"support({run.site})", raw, self, *args, **kwargs)
        finally:
            run.checking = False

    return functools.wraps(raw)(_validate_sample)


def _wrap_construct(raw: Callable) -> Callable:
    """`DistributionMeta.__call__`: a distribution's construction inside the scope of its
    class, numbered per run (`Normal`, `Normal#2`), not of the metaclass's `__call__`;
    one built by another's construction (`HalfCauchy`'s `Cauchy`) is part of it."""

    def __call__(cls: type, *args: Any, **kwargs: Any) -> Any:
        run = _ACTIVE.get()
        if run is None or run.building:
            return raw(cls, *args, **kwargs)
        model = run.models[-1]
        model.built[cls.__name__] += 1
        n = model.built[cls.__name__]
        label = cls.__name__ if n == 1 else f"{cls.__name__}#{n}"
        # where the user built it (its stage's source): the frame calling the class, when
        # it is the user's (an autoguide's own `dist.Normal(loc, scale)` keeps its first
        # equation's line)
        site = user_call_site(sys._getframe(1), direct=True)
        run.building = True
        try:
            made = _scoped(label, raw, cls, *args, **kwargs)
        finally:
            run.building = False
        run.built[id(made)] = (_Built(model.label, label, cls.__name__, site), made)
        return made

    return __call__


def _wrap_substitute(raw: Callable) -> Callable:
    """`substitute.process_message`: a sample site's value made by a `substitute_fn` (the
    constrained value `potential_energy` makes of an unconstrained parameter, with its
    Jacobian) inside `constrain(<site>)`, another function's in `substitute(<site>)`."""

    def process_message(self: Any, msg: dict) -> None:
        run, name = _ACTIVE.get(), msg.get("name")
        fn = getattr(self, "substitute_fn", None)
        if run is None or fn is None or msg.get("type") != "sample" or not isinstance(name, str):
            return raw(self, msg)
        own = getattr(_unwrapped(fn), "__name__", None) == "_unconstrain_reparam"
        if not own:
            return _scoped(f"substitute({name})", raw, self, msg)
        outer, run.constraining = run.constraining, name
        try:
            return _scoped(f"constrain({name})", raw, self, msg)
        finally:
            run.constraining = outer

    return functools.wraps(raw)(process_message)


def _replayed(name: str) -> bool:
    """Whether a `replay` handler on NumPyro's stack gives sample site `name` its value
    (the model of an ELBO, run against its guide's trace)."""
    replay = sys.modules["numpyro.handlers"].replay
    stack = getattr(sys.modules["numpyro.primitives"], "_PYRO_STACK", ())
    return any(
        isinstance(h, replay) and isinstance(getattr(h, "trace", None), dict) and name in h.trace
        for h in stack
    )


def _wrap_seed(raw: Callable) -> Callable:
    """`seed.process_message`: the key a sample site will draw with, split off the
    handler's. A site whose value a `replay` gives (an ELBO's model) draws nothing: the
    split is all its code, inside `sample(<site>)` as the guide's draw is. Else it is
    `seed(<site>)`, before the draw's `sample(<site>)`: one stage of both would have two
    outputs (the draw and the handler's next key), and its probe would need a `leaf=`."""

    def process_message(self: Any, msg: dict) -> None:
        run, name = _ACTIVE.get(), msg.get("name")
        if run is None or msg.get("type") != "sample" or not isinstance(name, str):
            return raw(self, msg)
        label = f"sample({name})" if _replayed(name) else f"seed({name})"
        return _scoped(label, raw, self, msg)

    return functools.wraps(raw)(process_message)


def _distribution_classes() -> Iterator[type]:
    todo, seen = [_distribution()], set()
    while todo:
        cls = todo.pop()
        if cls not in seen:
            seen.add(cls)
            todo.extend(cls.__subclasses__())
            yield cls


#: Per distribution class, the methods hooked, and how.
_METHODS = {
    "log_prob": _wrap_log_prob,
    "_validate_sample": _wrap_validate,
    "__call__": _wrap_sample,
}


def _targets() -> Iterator[tuple[type, str, Callable[[Callable], Callable]]]:
    """(class, attribute, wrapper) of every hook."""
    yield _messenger(), "__call__", _wrap_call
    yield type(_distribution()), "__call__", _wrap_construct
    handlers = sys.modules.get("numpyro.handlers")
    if handlers is not None:
        yield handlers.substitute, "process_message", _wrap_substitute
        yield handlers.seed, "process_message", _wrap_seed
    for cls in _distribution_classes():
        for name, wrap in _METHODS.items():
            if isinstance(cls.__dict__.get(name), types.FunctionType):
                yield cls, name, wrap


def install() -> None:
    """Hook NumPyro's classes (when imported); reference counted, `uninstall` undoes."""
    _PATCHES.enter(lambda: _targets() if present() else ())


def uninstall() -> None:
    """Put NumPyro's originals back when the last user leaves."""
    _PATCHES.leave()
