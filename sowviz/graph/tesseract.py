"""Naming Tesseract stages.

A `tesseract_dispatch` equation (from `tesseract_jax.apply_tesseract`) carries a
`client` param: tesseract-jax's `Jaxeract` wrapper, whose `.client` is the
`tesseract_core.Tesseract`. Tesseracts have no name field, so one is found, in
order, from: the user's override; the `name:` of the `tesseract_config.yaml`
beside an in-process API module (`Tesseract.from_tesseract_api`), else that
module's folder (or file) name; the image name (`from_image`); the URL
(`from_url`); the OpenAPI title when it is not the generic "Tesseract".
Everything here is best effort and reads attributes defensively: the
Tesseract SDK's private fields may move between releases.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

_GENERIC = {"", "tesseract", "tesseract_api"}


def tesseract_of(client: Any) -> Any:
    """The `tesseract_core.Tesseract` behind a `tesseract_dispatch` `client` param."""
    return getattr(client, "client", client)


def default_name(tess: Any) -> str:
    """A readable name for a Tesseract (see the module docstring for the order)."""
    inner = getattr(tess, "_client", None)
    module = getattr(inner, "api_module", None)
    file = getattr(module, "__file__", None)
    if file:
        path = Path(file)
        name = _config_name(path.parent / "tesseract_config.yaml")
        if name:
            return name
        return path.parent.name if path.stem == "tesseract_api" else path.stem
    spawn = getattr(tess, "_spawn_config", None)
    if isinstance(spawn, Mapping):
        image = spawn.get("image_name") or spawn.get("image")
        if isinstance(image, str) and image:
            return image.rsplit("/", 1)[-1]
    url = getattr(inner, "_url", None)
    if isinstance(url, str) and url:
        return url
    try:
        title = inner.openapi_schema["info"]["title"]  # type: ignore[union-attr]
    except Exception:
        title = None
    if isinstance(title, str) and title.strip().lower() not in _GENERIC:
        return title
    return "tesseract"


def _config_name(path: Path) -> str | None:
    try:
        text = path.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("name:"):
            value = line[5:].split("#", 1)[0].strip().strip("'\"")
            if value and "{{" not in value:
                return value
    return None


def tesseract_label(
    client: Any, overrides: Mapping[Any, str] | Callable[[Any], str | None] | None
) -> str:
    """The label of a Tesseract stage: the user's override, else `default_name`."""
    tess = tesseract_of(client)
    name = default_name(tess)
    if overrides is None:
        return name
    if callable(overrides) and not isinstance(overrides, Mapping):
        chosen = overrides(tess)
        return chosen if chosen else name
    for key, label in overrides.items():  # by identity: Tesseracts need not be hashable
        if key is tess or key is client or (isinstance(key, str) and key == name):
            return label
    return name


def output_names(params: Mapping[str, Any], n_out: int) -> tuple[str, ...] | None:
    """The schema field of each array output of a `tesseract_dispatch` equation
    (`normed_result`, `state.energy`), or None when the params do not say.

    tesseract-jax 0.5 keeps the output tree in `params["params"].output_pytreedef`
    with a `static_output_mask` (non-array outputs are not outputs of the
    primitive); 0.4 passes `output_pytreedef` as a param of its own.
    """
    import jax

    holder = params.get("params")
    treedef = getattr(holder, "output_pytreedef", None) or params.get("output_pytreedef")
    if treedef is None:
        return None
    mask = tuple(getattr(holder, "static_output_mask", ()) or params.get("static_output_mask", ()))
    try:
        tree = jax.tree_util.tree_unflatten(treedef, list(range(treedef.num_leaves)))
        paths = jax.tree_util.tree_flatten_with_path(tree)[0]
    except Exception:  # an SDK whose tree we cannot rebuild: fall back to indices
        return None
    names = [
        ".".join(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path)
        for i, (path, _) in enumerate(paths)
        if not (i < len(mask) and mask[i])
    ]
    return tuple(names) if len(names) == n_out else None


def _param(params: Mapping[str, Any], name: str, *old: str) -> Any:
    """A `tesseract_dispatch` param: tesseract-jax 0.5 bundles them in `params`; 0.4
    passes each as a param of its own (`is_static_mask` for 0.5's `static_input_mask`)."""
    holder = params.get("params")
    for key in (name, *old):
        value = getattr(holder, key, None) if holder is not None else None
        if value is None:
            value = params.get(key)
        if value is not None:
            return value
    return None


def _path_names(treedef: Any) -> list[str] | None:
    import jax

    try:
        tree = jax.tree_util.tree_unflatten(treedef, list(range(treedef.num_leaves)))
        paths = jax.tree_util.tree_flatten_with_path(tree)[0]
    except Exception:  # an SDK whose tree we cannot rebuild
        return None
    return [
        ".".join(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path)
        for path, _ in paths
    ]


def eval_func(params: Mapping[str, Any]) -> str:
    """The endpoint a `tesseract_dispatch` equation calls: `apply`, or in a program that
    differentiates itself `jacobian_vector_product` / `vector_jacobian_product`."""
    return str(_param(params, "eval_func") or "apply")


def input_fields(
    params: Mapping[str, Any], n_in: int
) -> tuple[dict[int, str], tuple[tuple[str, str], ...]]:
    """The schema field each operand of a `tesseract_dispatch` equation feeds ({operand
    position: `conductivity`, `a.v`}; a JVP's tangents `conductivity (tangent)`, a
    VJP's cotangents by output field, `temperature (cotangent)`), and its static
    inputs, (field, value as written: `solver`, `'dense'`). Empty when the params do not
    say."""
    treedef = _param(params, "input_pytreedef")
    mask = tuple(_param(params, "static_input_mask", "is_static_mask") or ())
    statics = tuple(_param(params, "static_args") or ())
    paths = _path_names(treedef) if treedef is not None else None
    if paths is None or (mask and len(mask) != len(paths)):
        return {}, ()
    arrays = [p for k, p in enumerate(paths) if not (k < len(mask) and mask[k])]
    static_paths = [p for k, p in enumerate(paths) if k < len(mask) and mask[k]]
    shown = tuple((p, repr(v)) for p, v in zip(static_paths, statics, strict=False) if _plain(v))
    names = dict(enumerate(arrays))
    func = eval_func(params)
    n = len(arrays)
    if func == "jacobian_vector_product":
        has = tuple(_param(params, "has_tangent") or (True,) * n)
        tangent = [p for p, h in zip(arrays, has, strict=False) if h]
        names.update({n + k: f"{p} (tangent)" for k, p in enumerate(tangent)})
    elif func == "vector_jacobian_product":
        outs = output_names(params, len(_param(params, "output_avals") or ())) or ()
        has = tuple(_param(params, "has_cotangent") or (True,) * len(outs))
        cot = [p for p, h in zip(outs, has, strict=False) if h]
        names.update({n + k: f"{p} (cotangent)" for k, p in enumerate(cot)})
    return {k: v for k, v in names.items() if k < n_in}, shown


def _plain(value: Any) -> bool:
    # a number, a string or a flag the user wrote, not an object whose repr is noise
    return isinstance(value, str | int | float | bool) or value is None


def differentiable_fields(params: Mapping[str, Any]) -> frozenset[str]:
    """The input fields a `tesseract_dispatch` equation's Tesseract differentiates
    (its schema's `Differentiable` arrays, by path as `input_fields` names them:
    `scale.a`); empty when the client does not say. tesseract-jax refuses a tangent
    for any other input, so only these may be probed in the data flow."""
    from .. import _compat

    client = _compat.tesseract_client(params)
    paths = getattr(client, "differentiable_input_paths", None)
    try:
        return frozenset(str(p) for p in paths or ())
    except TypeError:  # (an SDK that keeps them otherwise)
        return frozenset()
