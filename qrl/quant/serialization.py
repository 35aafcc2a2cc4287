"""Quantized (or float) parameter pytrees to bytes and back, and their sizes.

msgpack through flax.serialization: numpy arrays of any dtype (int8, int16, bfloat16, float16)
round-trip exactly and nothing is unpickled, so bytes from another process are safe to load.
"""

from typing import Any, Mapping

import jax
import numpy as np
from flax import serialization

from qrl.errors import QrlInputError
from qrl.quant.precision import Precision


def params_to_bytes(params: Mapping[str, Any]) -> bytes:
    """Serializes a params pytree (nested dicts of arrays) to msgpack bytes."""
    state = serialization.to_state_dict(params)
    return serialization.msgpack_serialize(jax.tree.map(np.asarray, state))


def params_from_bytes(data: bytes) -> dict:
    """Inverse of `params_to_bytes`; corrupt bytes raise QrlInputError."""
    try:
        restored = serialization.msgpack_restore(data)
    except Exception as error:  # msgpack raises several unrelated types on garbage.
        raise QrlInputError(f"corrupt serialized parameters: {error}") from None
    if not isinstance(restored, dict):
        raise QrlInputError("corrupt serialized parameters: not a parameter tree")
    return restored


def param_bytes(params: Mapping[str, Any]) -> int:
    """Bytes of every array in the tree as stored (values, scales and biases)."""
    return int(sum(np.asarray(leaf).nbytes for leaf in jax.tree.leaves(params)))


def packed_param_bytes(params: Mapping[str, Any], precision: Precision) -> int:
    """Bytes if integer kernels were bit-packed at `precision.packed_bits` (other leaves as
    stored); a kernel of an edge layer (`-e<M>`, recognised by values beyond the narrow width's
    largest) at the edge width. For int8 and float precisions this equals `param_bytes`."""
    if precision.is_float:
        return param_bytes(params)
    total_bits = 0
    for leaf in jax.tree.leaves(params):
        leaf = np.asarray(leaf)
        if np.issubdtype(leaf.dtype, np.integer):
            wide = precision.edge_bits is not None and leaf.size and np.abs(leaf).max() > precision.weight_qmax
            total_bits += leaf.size * (precision.edge_bits if wide else precision.packed_bits)
        else:
            total_bits += leaf.nbytes * 8
    return int(-(-total_bits // 8))
