"""Two Tesseracts chained with `tesseract_jax.apply_tesseract`, served in-process with
`Tesseract.from_tesseract_api` (as tesseract-jax's own tests do): `scale`
(``y = a x + b``) feeds `energy_mask`, whose `active` and `count` outputs are not
differentiable. The loss uses the differentiable `energy` and the count."""

from __future__ import annotations

import pathlib

import jax.numpy as jnp

from . import ZooCase

TESSERACTS = pathlib.Path(__file__).resolve().parents[2] / "fixtures" / "tesseracts"


def load():
    from tesseract_core import Tesseract

    return (
        Tesseract.from_tesseract_api(TESSERACTS / "scale" / "tesseract_api.py"),
        Tesseract.from_tesseract_api(TESSERACTS / "energy_mask" / "tesseract_api.py"),
    )


def make_pipeline(scale, energy_mask):
    from tesseract_jax import apply_tesseract

    def pipeline(x, a):
        y = apply_tesseract(scale, {"x": x, "a": a, "b": jnp.float32(0.5)})["y"]
        out = apply_tesseract(energy_mask, {"y": jnp.tanh(y)})
        # `count` is an integer output: a plain number here, not differentiated.
        return out["energy"] / (1.0 + out["count"])

    return pipeline


def make_args():
    x = jnp.linspace(-1.5, 2.0, 6, dtype=jnp.float32)
    return x, jnp.float32(1.3)


def case() -> ZooCase:
    return ZooCase("tesseract-pipeline", make_pipeline(*load()), make_args())
