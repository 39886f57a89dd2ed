"""Reading values that span several processes' devices (`jax.distributed`).

Under `jax.distributed` a program's outputs are global arrays: each process holds
only its own devices' shards, and `jax.device_get` refuses the rest ("Fetching value
for jax.Array that spans non-addressable devices is not possible"). The NaN re-run
(`nonfinite_locate`) runs on every process in lockstep, as the Monitor's steps do, so
each process can read such a value: a replicated one from its own copy, any other
gathered from every process (a collective: each process gathers it with the others).
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np


def host_value(x: Any) -> Any:
    """`x` on the host, whole, even when it spans other processes' devices."""
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        if x.is_fully_replicated:
            return np.asarray(x.addressable_data(0))
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return jax.device_get(x)


def host_tree(tree: Any) -> Any:
    """`jax.device_get(tree)`, leaves spanning other processes' devices read whole."""
    return jax.tree_util.tree_map(host_value, tree)
