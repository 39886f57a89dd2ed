"""A program whose NaN is born inside a multi-equation scope, shared by the widget tests."""

from __future__ import annotations

import inspect as pyinspect

import jax
import jax.numpy as jnp


def nan_in_scope(w, x):
    with jax.named_scope("feat"):
        h = jnp.tanh(x @ w)
        h = h * 2.0 + 1.0
        z = jnp.log(h - 3.5)  # h < 3: every entry negative, the NaN is born here
        z = z * h
    with jax.named_scope("head"):
        return jnp.sum(z)


def line_of(fn, text):
    lines, start = pyinspect.getsourcelines(fn)
    return start + next(i for i, line in enumerate(lines) if text in line)
