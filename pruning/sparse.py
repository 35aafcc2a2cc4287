"""Compact storage of pruned (and optionally int8) policies, with exact byte accounting.

    blob = export_sparse(params, mask, "csr", precision="int8", input_ranges=ranges)
    data = to_bytes(blob)                 # msgpack; nothing is unpickled on load
    served = densify(from_bytes(data))    # what the dense network at that precision runs
    storage_bytes(blob)                   # every stored array's bytes, exactly

Formats, per pruned leaf (unpruned leaves — biases, scales — are stored dense as they are):
- `bitmask`: the mask packed 8 per byte plus the kept values in row-major order.
- `csr`: a 2-D view `[prod(shape[:-1]), out]`: row pointers and column indices in the smallest
  unsigned type that holds them, plus the kept values.
- `bcoo`: JAX's `jax.experimental.sparse.BCOO` layout: int32 coordinates `[nnz, ndim]` and values.

Values are float32, or int8 with qrl's per-output-channel scales (`qrl.quant.ptq.quantize_params`
on the masked params), so `densify` returns exactly the masked fp32 params or exactly the dense
int8 params: the policy's outputs equal the masked dense policy's (fp32) or the dense int8 path's.
Inference densifies: at these layer sizes (hundreds of units, batch 1–256) XLA's dense matmul
beats its sparse kernels on CPU, and the savings are in storage and transfer. An exported pruned
policy (`launch.export`) can run its kernels as CSR products instead
(`qrl.deploy.csr_runtime`), which pays at batch 1 for wide layers (2048 units: 0.26× the dense
time, `bench/inference.py`), not for layers of a few hundred units.

The pruning paper stored PyTorch sparse COO tensors: int64 coordinates per dimension plus a
float32 value, 20 bytes per non-zero of a 2-D kernel; `pytorch_coo_bytes` counts that reference.
"""

from typing import Any, Mapping, Optional

import jax
import numpy as np
from flax import serialization
from jax.experimental import sparse as jax_sparse

from pruning.masks import apply_mask, check_mask
from qrl.errors import QrlInputError
from qrl.quant.precision import parse_precision
from qrl.quant.ptq import quantize_params

FORMATS = ("bitmask", "csr", "bcoo")
PRECISIONS = ("fp32", "int8")
PYTORCH_COO_BYTES_PER_NONZERO = 20  # two int64 coordinates + one float32 value (2-D kernels)
SEPARATOR = "/"


def index_dtype(max_value: int) -> np.dtype:
    """The smallest unsigned integer type holding 0..max_value."""
    for dtype in (np.uint8, np.uint16, np.uint32):
        if max_value <= np.iinfo(dtype).max:
            return np.dtype(dtype)
    return np.dtype(np.uint64)


def _flatten(tree: Any) -> dict[str, Any]:
    """`{"a/b/kernel": leaf}` for every leaf, `None` leaves included."""
    flat, _ = jax.tree_util.tree_flatten_with_path(tree, is_leaf=lambda node: node is None)
    return {jax.tree_util.keystr(path, simple=True, separator=SEPARATOR): leaf for path, leaf in flat}


def _unflatten(flat: Mapping[str, Any]) -> dict:
    tree: dict = {}
    for path, leaf in flat.items():
        node = tree
        *parents, name = path.split(SEPARATOR)
        for parent in parents:
            node = node.setdefault(parent, {})
        node[name] = leaf
    return tree


def _encode(values: np.ndarray, kept: np.ndarray, kind: str) -> dict:
    shape = np.asarray(values.shape, np.int64)
    if kind == "bitmask":
        return {"shape": shape, "bits": np.packbits(kept.ravel()), "values": values[kept]}
    if kind == "csr":
        columns = values.shape[-1] if values.ndim else 1
        kept_2d = kept.reshape(-1, columns)
        nonzero = int(kept_2d.sum())
        row_pointers = np.concatenate([[0], np.cumsum(kept_2d.sum(axis=1))]).astype(index_dtype(nonzero))
        column_indices = np.nonzero(kept_2d)[1].astype(index_dtype(max(columns - 1, 0)))
        return {"shape": shape, "row_pointers": row_pointers, "column_indices": column_indices,
                "values": values.reshape(-1, columns)[kept_2d]}
    coordinates = np.argwhere(kept).astype(np.int32)
    return {"shape": shape, "coordinates": coordinates, "values": values[kept]}


def _decode(entry: Mapping[str, np.ndarray], kind: str) -> np.ndarray:
    shape = tuple(int(size) for size in entry["shape"])
    values = np.asarray(entry["values"])
    if kind == "bcoo":
        matrix = jax_sparse.BCOO((values, np.asarray(entry["coordinates"], np.int32)), shape=shape)
        return np.asarray(matrix.todense())
    dense = np.zeros(shape, values.dtype)
    if kind == "bitmask":
        size = int(np.prod(shape))
        kept = np.unpackbits(np.asarray(entry["bits"]), count=size).astype(bool).reshape(shape)
        dense[kept] = values
        return dense
    columns = shape[-1] if shape else 1
    rows = np.repeat(np.arange(len(entry["row_pointers"]) - 1), np.diff(np.asarray(entry["row_pointers"], np.int64)))
    dense.reshape(-1, columns)[rows, np.asarray(entry["column_indices"], np.int64)] = values
    return dense


def export_sparse(params, mask, format: str = "csr", precision: str = "fp32",
                  input_ranges: Optional[Mapping] = None) -> dict:
    """The pruned policy `params` (a flax params dict) under `mask`, stored in `format`.

    `precision="int8"` quantizes the masked params as `qrl.quant.ptq.quantize_params` does (static
    activation scales from `input_ranges`, see `qrl.quant.ptq.calibrate`; dynamic without them).
    """
    if format not in FORMATS:
        raise QrlInputError(f"unknown sparse format {format!r}; known: {', '.join(FORMATS)}")
    if precision not in PRECISIONS:
        raise QrlInputError(f"sparse storage precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    check_mask(params, mask)
    masked = serialization.to_state_dict(jax.tree.map(np.asarray, apply_mask(params, mask)))
    activations = "dynamic" if input_ranges is None else "static"
    scheme = "fp32"
    if precision == "int8":
        scheme = "int8" if input_ranges is not None else "int8-obst-dyn"  # per-feature scales need ranges.
        stored = quantize_params(masked, parse_precision(scheme), input_ranges)
    else:
        stored = jax.tree.map(lambda leaf: np.asarray(leaf, np.float32), masked)
    kept = {path: np.asarray(flag, bool) for path, flag in _flatten(mask).items() if flag is not None}
    dense_leaves, sparse_leaves = {}, {}
    for path, values in _flatten(stored).items():
        values = np.asarray(values)
        if path in kept:
            sparse_leaves[path] = _encode(values, kept[path], format)
        else:
            dense_leaves[path] = values
    return {"format": format, "precision": precision, "activations": activations, "scheme": scheme,
            "dense": _unflatten(dense_leaves), "sparse": {path: entry for path, entry in sparse_leaves.items()}}


def densify(blob: Mapping) -> dict:
    """The params a dense network at the blob's precision scheme consumes (exactly what was exported);
    `parse_precision(blob["scheme"])` builds that network."""
    kind = blob["format"]
    flat = dict(_flatten(blob["dense"]))
    for path, entry in blob["sparse"].items():
        flat[path] = _decode(entry, kind)
    return _unflatten(flat)


def storage_bytes(blob: Mapping) -> int:
    """Bytes of every array the blob stores (values, indices, bitmasks, shapes, scales, biases)."""
    arrays = jax.tree.leaves(blob["dense"]) + jax.tree.leaves(blob["sparse"])
    return int(sum(np.asarray(array).nbytes for array in arrays))


def to_bytes(blob: Mapping) -> bytes:
    """msgpack bytes (flax.serialization); `from_bytes` reads them back without unpickling."""
    return serialization.msgpack_serialize(
        {"format": blob["format"], "precision": blob["precision"], "activations": blob["activations"],
         "scheme": blob["scheme"], "dense": jax.tree.map(np.asarray, blob["dense"]), "sparse": jax.tree.map(np.asarray, blob["sparse"])})


def from_bytes(data: bytes) -> dict:
    """Inverse of `to_bytes`; bytes that are not a sparse policy raise a one-line QrlInputError."""
    try:
        blob = serialization.msgpack_restore(data)
    except Exception as error:  # msgpack raises several unrelated types on garbage
        raise QrlInputError(f"corrupt sparse policy: {str(error).splitlines()[0] if str(error) else type(error).__name__}") from None
    if not isinstance(blob, dict) or blob.get("format") not in FORMATS or not {"dense", "sparse", "scheme"} <= set(blob):
        raise QrlInputError("corrupt sparse policy: not a sparse policy blob")
    return blob


def dense_fp32_bytes(params) -> int:
    """Bytes of the unpruned policy in float32: the baseline every ratio divides by."""
    return int(sum(4 * np.size(leaf) for leaf in jax.tree.leaves(params)))


def pytorch_coo_bytes(params, mask) -> int:
    """The pruning paper's storage: PyTorch sparse COO for pruned leaves (int64 coordinates per
    dimension + a float32 value per non-zero: 20 bytes for 2-D kernels), float32 for the rest."""
    check_mask(params, mask)
    total = 0
    flat_mask = _flatten(mask)
    for path, leaf in _flatten(params).items():
        flag = flat_mask.get(path)
        if flag is None:
            total += 4 * np.size(leaf)
        else:
            total += int(np.sum(flag)) * (8 * np.ndim(leaf) + 4)
    return int(total)


def memory_table(params, mask, input_ranges: Optional[Mapping] = None) -> list[dict]:
    """Bytes of the policy in every format and precision, against dense fp32 and PyTorch COO.

    Rows: `{"format", "precision", "bytes", "vs_dense_fp32", "vs_pytorch_coo"}`; the first two
    rows are the dense fp32 and PyTorch COO references.
    """
    dense = dense_fp32_bytes(params)
    coo = pytorch_coo_bytes(params, mask)
    rows = [{"format": "dense", "precision": "fp32", "bytes": dense},
            {"format": "pytorch_coo", "precision": "fp32", "bytes": coo}]
    for precision in PRECISIONS:
        for kind in FORMATS:
            rows.append({"format": kind, "precision": precision,
                         "bytes": storage_bytes(export_sparse(params, mask, kind, precision, input_ranges))})
    for row in rows:
        row["vs_dense_fp32"] = row["bytes"] / dense
        row["vs_pytorch_coo"] = row["bytes"] / coo
    return rows
