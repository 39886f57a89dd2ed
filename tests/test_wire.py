"""`_wire`: many device arrays to the host in one buffer, every dtype bit for bit."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _x64 import run_x64

from sowviz import _wire


def _bits(a) -> bytes:
    return np.ascontiguousarray(np.atleast_1d(np.asarray(a))).tobytes()


def test_every_dtype_comes_back_bit_for_bit():
    tree = {
        "f32": jnp.array([-2.5, np.nan, np.inf, -0.0, 1e-40], jnp.float32),
        "bool": jnp.array([True, False, True]),
        "none": None,
        "i8": jnp.array([-3, 127, -128], jnp.int8),
        "u16": jnp.array([65535, 1], jnp.uint16),
        "bf16": jnp.array([1.5, -2.25, np.nan], jnp.bfloat16),
        "f16": jnp.array([[1.0, -65504.0]], jnp.float16),
        "i32": jnp.array(-7, jnp.int32),
        "empty": jnp.zeros((0, 3), jnp.float32),
    }
    buf, layout = _wire.gather(tree)
    assert buf.dtype == jnp.uint32 and buf.ndim == 1
    back = _wire.split(np.asarray(buf), layout)
    assert back["none"] is None
    for k, v in tree.items():
        if v is None:
            continue
        want = np.asarray(v)
        assert back[k].dtype == want.dtype and back[k].shape == want.shape, k
        assert _bits(back[k]) == _bits(want), k


def test_a_buffer_of_another_layout_is_refused():
    _, layout = _wire.gather({"a": jnp.ones(3)})
    with pytest.raises(ValueError, match="gathered from another tree"):
        _wire.split(np.zeros(4, np.uint32), layout)


_X64 = """
import json, jax, jax.numpy as jnp, numpy as np
from sowviz import _wire
t = {"f64": jnp.array([1e300, -2.5, np.pi, np.nan]), "i64": jnp.array([-2**40, 3]),
     "f32": jnp.array([0.1], jnp.float32)}
buf, layout = _wire.gather(t)
b = _wire.split(np.asarray(buf), layout)
print(json.dumps({k: [np.asarray(t[k]).tobytes().hex(), b[k].tobytes().hex(), str(b[k].dtype)]
                  for k in t}))
"""


def test_64_bit_values_under_x64():
    got = run_x64(_X64)  # x64 is process-wide: a child process
    assert {k: v[2] for k, v in got.items()} == {"f64": "float64", "i64": "int64", "f32": "float32"}
    for want, back, _ in got.values():
        assert back == want
    assert jax.config.jax_enable_x64 is False  # this process untouched
