"""What a located NaN's message names "before it": an attention row masked everywhere
(`jnp.where(mask, logits, -jnp.inf)`, softmax of all -inf) said `where` held -Inf before
locating and, after, the cast of the `-jnp.inf` literal (`convert_element_type`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from _helpers import marked_line

import sowviz


def attn(q, k, mask):
    logits = jnp.einsum("td,sd->ts", q, k)
    logits = jnp.where(mask, logits, -jnp.inf)  # MARK: where-line
    return jax.nn.softmax(logits, axis=-1)  # MARK: softmax-line


def test_the_value_named_before_a_located_origin_is_the_users_call_not_a_literal():
    q = jax.random.normal(jax.random.key(0), (4, 8))
    k = jax.random.normal(jax.random.key(1), (4, 8))
    mask = jnp.tril(jnp.ones((4, 4), bool)).at[2].set(False)  # row 2 masks every position
    want = np.asarray(attn(q, k, mask))
    assert np.isnan(want[2]).all() and np.isfinite(np.delete(want, 2, axis=0)).all()
    ins = sowviz.inspect(lambda q, k, m: jnp.sum(attn(q, k, m)), q, k, mask, mode="primal")
    before = ins.nonfinite.message
    origins = ins.locate_nonfinite()
    where, softmax = (
        marked_line(__file__, "MARK: where-line"),
        marked_line(__file__, "MARK: softmax-line"),
    )
    assert f"`where` (tests/test_nonfinite_earlier.py:{where}) held -Inf" in before
    assert f"`where` (tests/test_nonfinite_earlier.py:{where}) held -Inf" in origins.message
    assert "convert_element_type" not in origins.message
    assert origins.forward.equation.source.line == softmax
