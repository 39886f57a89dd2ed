"""Concatenations of many operands (probe layouts, stacked leaves) that XLA compiles fast.

sowviz's programs concatenate hundreds of small arrays: the probes' layout for the
shared summary program, and like parameter leaves stacked for the finite flags.
Written plainly, each operand arrives as a reshape of a value computed elsewhere,
and XLA compiles that slowly, differently per backend:

* XLA:GPU's priority fusion merges the reshapes into the concatenation one at a
  time and, after each, re-prices every operand of the growing fusion: k²/2
  cost-model evaluations per concatenation. A 1,000-equation program's capture
  spent 1.7 s in that pass (0.04 s for the plain program; its dump showed 50,000
  fusion steps against 3,000). Passing the operands through one
  `optimization_barrier` first leaves nothing to merge (a barrier's outputs are not
  fusible), so the concatenation is priced once; at run time the barrier is free.
* XLA:CPU compiles one concatenation of thousands of operands slowly (a 1,010-probe
  layout: 2.7 s); concatenated in chunks of `CPU_CHUNK` parts kept apart by a barrier
  it compiled in 1.3 s. (On a GPU each chunk would be a kernel launch.)
* XLA:CPU also RUNS a fused concatenation slowly: fused with its operands (the NaN
  fills, a reshape), it is a loop choosing the operand of every element. On a CPU
  every part, fills included, therefore reaches the concatenation through a barrier,
  and XLA copies each with a memcpy: a Monitor's layout of 1.8M values in 98 parts
  took 0.14-0.2 ms instead of 0.6-1.4 ms (and 0.6 ms instead of 7 ms in the capture
  program, where the fused loop also wrote a full-size temporary).

Elsewhere the constant fills (``fills``: the NaN padding) stay fusible: the
concatenation writes them without reading memory, and a fill shared by many parts
merges once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax

#: On a CPU, concatenations are built in chunks of this many parts (64 to 512 compiled
#: alike; the larger, the fewer layouts are copied twice).
CPU_CHUNK = 256
#: Elsewhere, concatenations of more parts than this take their operands through a
#: barrier (fewer merge fast enough). `None` turns the barrier off (an A/B switch).
SEAL_OVER: int | None = 8


def concatenate(
    parts: Sequence[Any], axis: int = 0, *, fills: Sequence[Any] = (), backend: str | None = None
) -> Any:
    """``jax.lax.concatenate(parts, axis)``, built so XLA compiles it in time linear in
    ``len(parts)`` (see the module docstring) on `backend` (default: JAX's default
    backend). `fills` are parts (by identity) that are constants, kept out of the
    barrier."""
    if len(parts) == 1:
        return parts[0]
    if (backend or jax.default_backend()) == "cpu":
        chunks = [
            jax.lax.concatenate(_sealed(parts[i : i + CPU_CHUNK]), axis)
            for i in range(0, len(parts), CPU_CHUNK)
        ]
        return chunks[0] if len(chunks) == 1 else jax.lax.concatenate(_sealed(chunks), axis)
    if SEAL_OVER is None or len(parts) <= SEAL_OVER:
        return jax.lax.concatenate(list(parts), axis)
    fill_ids = {id(f) for f in fills}
    sealed = iter(jax.lax.optimization_barrier([p for p in parts if id(p) not in fill_ids]))
    return jax.lax.concatenate([p if id(p) in fill_ids else next(sealed) for p in parts], axis)


def _sealed(parts: Sequence[Any]) -> list:
    """`parts` through one `optimization_barrier` (on a CPU: nothing fuses into the
    concatenation of them, fills included, so XLA:CPU copies each part with a memcpy;
    fused, a concatenation is a loop choosing the operand of every element)."""
    return list(jax.lax.optimization_barrier(list(parts))) if len(parts) > 1 else list(parts)


def stack(arrays: Sequence[Any], *, backend: str | None = None) -> Any:
    """``jnp.stack(arrays)`` as a `concatenate` of the arrays given a leading axis."""
    return concatenate([jax.lax.expand_dims(a, (0,)) for a in arrays], 0, backend=backend)
