"""A lean serving path for 8-bit integer MLP policies: packed once per load, few call arguments,
and the integer products run on whichever unit of this CPU is fastest.

`qrl.networks.MLP` at an integer precision (`quantize_params`' layout) takes every layer's
kernel, scales, zero points and bias as separate call arguments (13 for a three-layer static
int8 policy) and recomputes per call what does not change between calls (`input_scale *
kernel_scale`, the zero point's column sums of a dynamic layer). `pack_mlp` does that work once
per load and packs a policy into one kernel array per layer plus one float32 vector holding
every scale, zero point, column sum and bias; `lean_apply` runs it as one jitted program whose
per-layer chain is quantize → integer dot → rescale + bias + activation.

The integer products can run on three units, chosen at packing time (`unit`):
- `int8`: int8 operands, `lax.dot_general(..., preferred_element_type=int32)`. Fast where XLA
  has an int8 kernel (AMX, AVX-512 VNNI); on an AVX2-only CPU XLA converts both operands to
  int32 on every call (its HLO shows an s8→s32 `convert` of the whole kernel per call).
- `bf16` / `fp32`: the same integer values stored as bfloat16 / float32 (every int8 value is
  exact in both) and multiplied with float32 accumulation. The result is bit-for-bit the
  integer result as long as every partial sum is an integer below 2^24 in magnitude;
  `pack_mlp` checks that bound per layer from the kernel's own values (`sum_i |k[i, j]| *
  max|q|`) and keeps a layer whose bound is not met on the `int8` unit. So the policy's outputs
  are the int8 policy's on every unit; only the speed differs.

Measured (`bench/int8_lean.py`): packing the float kernels into the same buffer as the scales
(one buffer per network) made XLA copy each kernel out of it on every call (4.5× slower at batch
1 for fp32 kernels), so kernels stay one array per layer. Which unit serves fastest depends on
the ISA and the batch size: `serving_unit` reads the measured table `lean_dispatch.json`.
"""

import dataclasses
import functools
import json
import math
import os
from typing import Callable, Mapping, Optional

import jax
import jax.numpy as jnp
import numpy as np

from qrl.cpu import cpu_info, isa_class
from qrl.errors import QrlInputError
from qrl.quant import ops
from qrl.quant.precision import Precision

UNITS = {"int8": jnp.int8, "bf16": jnp.bfloat16, "fp32": jnp.float32}
ACTIVATIONS: Mapping[str, Callable[[jax.Array], jax.Array]] = {
    "relu": jax.nn.relu, "tanh": jnp.tanh, "elu": jax.nn.elu, "swish": jax.nn.swish, "gelu": jax.nn.gelu}
EXACT_FLOAT_SUM = 2**24  # float32 holds every integer below this exactly.
DISPATCH_TABLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lean_dispatch.json")


@dataclasses.dataclass(frozen=True)
class LeanLayer:
    """One packed dense layer `[B, n_in] -> [B, n_out]`.

    `floats` is the offset of its entries in the packed float vector: static layers store
    `input_scale [n]`, `input_zero_point [n]` (n = n_in per feature, else 1), `output_scale
    [n_out]`, `bias [n_out]` (the zero point's contribution folded in); dynamic layers store
    `kernel_scale [n_out]`, `column_sums [n_out]` (the zero point's multiplier), `bias [n_out]`.
    """

    n_in: int
    n_out: int
    unit: str
    precision: Precision
    static: bool
    per_feature: bool
    activate: bool
    floats: int


@dataclasses.dataclass(frozen=True)
class LeanLayout:
    """The static structure of a packed policy (hashable: it keys `lean_apply`'s compilation)."""

    layers: tuple
    activation: str
    float_count: int

    @property
    def units(self) -> tuple:
        return tuple(layer.unit for layer in self.layers)


def pack_mlp(params: Mapping, precision: Precision, unit: str = "int8", activation: str = "relu",
             activate_final: bool = False) -> tuple:
    """`(layout, packed)` for an MLP's integer params (`quantize_params` of a `qrl.networks.MLP`
    with `dense_0 … dense_{L-1}`, no layer norm); `packed = (kernels, floats)`: one kernel
    array `[n_in, n_out]` per layer in its unit's dtype and the float32 vector of the rest.

    Raises QrlInputError for float or weight-only precisions, storage wider than int8, layer
    norms, an unknown unit or activation.
    """
    if unit not in UNITS:
        raise QrlInputError(f"unknown unit {unit!r}: one of {', '.join(UNITS)}")
    if activation not in ACTIVATIONS:
        raise QrlInputError(f"unknown activation {activation!r}: one of {', '.join(ACTIVATIONS)}")
    names = sorted((key for key in params if key.startswith("dense_")), key=lambda key: int(key.split("_")[1]))
    if not names or set(params) != set(names) or names != [f"dense_{index}" for index in range(len(names))]:
        raise QrlInputError(f"lean serving packs MLPs of dense_0 … dense_<L-1> layers only, got {sorted(params)}")
    layer_precisions = [precision.for_layer(index == 0, index == len(names) - 1) for index in range(len(names))]
    for layer_precision in layer_precisions:
        if not layer_precision.quantizes_activations or layer_precision.trainable or layer_precision.is_float:
            raise QrlInputError(f"{precision.name}: lean serving needs integer weights and activations in every layer")
        if layer_precision.storage_dtype != np.int8:
            raise QrlInputError(f"{precision.name}: lean serving needs weights stored in int8")
    kernels, floats, layers = [], [], []
    offset = 0
    for index, (name, layer_precision) in enumerate(zip(names, layer_precisions)):
        layer = params[name]
        kernel = np.asarray(layer["kernel"])
        n_in, n_out = kernel.shape
        static = "input_scale" in layer
        layer_unit = unit
        largest_input = max(abs(layer_precision.activation_qmin), layer_precision.activation_qmax)
        bound = np.max(np.sum(np.abs(kernel.astype(np.int64)), axis=0)) * largest_input
        if unit != "int8" and bound >= EXACT_FLOAT_SUM:
            layer_unit = "int8"  # float accumulation would round: keep this layer exact.
        if static:
            input_scale = np.asarray(layer["input_scale"], np.float32)
            zero_point = np.asarray(layer.get("input_zero_point", np.zeros_like(input_scale)), np.float32)
            per_feature = input_scale.ndim == 1
            kernel_scale = np.asarray(layer["kernel_scale"], np.float32)
            output_scale = kernel_scale if per_feature else np.float32(input_scale) * kernel_scale
            entries = [input_scale.reshape(-1), zero_point.reshape(-1), np.broadcast_to(output_scale, (n_out,)),
                       np.asarray(layer["bias"], np.float32)]
        else:
            per_feature = False
            column_sums = np.sum(kernel.astype(np.int64), axis=0).astype(np.float32)
            entries = [np.broadcast_to(np.asarray(layer["kernel_scale"], np.float32), (n_out,)), column_sums,
                       np.asarray(layer["bias"], np.float32)]
        activate = index < len(names) - 1 or activate_final
        layers.append(LeanLayer(n_in, n_out, layer_unit, layer_precision, static, per_feature, activate, offset))
        block = np.concatenate([np.asarray(entry, np.float32).reshape(-1) for entry in entries])
        floats.append(block)
        offset += block.size
        kernels.append(jnp.asarray(kernel, UNITS[layer_unit]))
    layout = LeanLayout(tuple(layers), activation, offset)
    return layout, (tuple(kernels), jnp.asarray(np.concatenate(floats), jnp.float32))


def _layer_forward(layer: LeanLayer, kernel: jax.Array, floats: jax.Array, x: jax.Array) -> jax.Array:
    """One packed layer `[B, n_in] -> [B, n_out]`: the arithmetic of `qrl.networks.layers`'
    integer layers (`ops.grid_range`, `ops.quantize_to_grid`), with the per-load products read
    from `floats`."""
    accumulate = jnp.int32 if layer.unit == "int8" else jnp.float32
    precision, start, n_out = layer.precision, layer.floats, layer.n_out
    if layer.static:
        width = layer.n_in if layer.per_feature else 1
        input_scale, zero_point = floats[start:start + width], floats[start + width:start + 2 * width]
        output_scale = floats[start + 2 * width:start + 2 * width + n_out]
        bias = floats[start + 2 * width + n_out:start + 2 * width + 2 * n_out]
        if not layer.per_feature:
            input_scale, zero_point = input_scale[0], zero_point[0]
        q = ops.quantize_to_grid(x, input_scale, zero_point, precision, UNITS[layer.unit])
        accumulated = jax.lax.dot_general(q, kernel, (((1,), (0,)), ((), ())), preferred_element_type=accumulate)
        return accumulated.astype(jnp.float32) * output_scale + bias
    kernel_scale = floats[start:start + n_out]
    column_sums = floats[start + n_out:start + 2 * n_out]
    bias = floats[start + 2 * n_out:start + 3 * n_out]
    scale, zero_point = ops.grid_range(jnp.min(x), jnp.max(x), precision)
    q = ops.quantize_to_grid(x, scale, zero_point, precision, UNITS[layer.unit])
    accumulated = jax.lax.dot_general(q, kernel, (((1,), (0,)), ((), ())), preferred_element_type=accumulate)
    if precision.grid == "affine":
        accumulated = accumulated - (zero_point * column_sums).astype(accumulate)
    return accumulated.astype(jnp.float32) * (scale * kernel_scale) + bias


def _forward(layout: LeanLayout, packed, x: jax.Array) -> jax.Array:
    kernels, floats = packed
    x = x.astype(jnp.float32)
    activation = ACTIVATIONS[layout.activation]
    for layer, kernel in zip(layout.layers, kernels):
        x = _layer_forward(layer, kernel, floats, x)
        if layer.activate:
            x = activation(x)
    return x


@functools.lru_cache(maxsize=None)
def lean_apply(layout: LeanLayout) -> Callable:
    """The jitted `apply(packed, x [B, n_in]) -> [B, n_out]` float32 of a packed policy (one
    compiled function per layout)."""
    return jax.jit(functools.partial(_forward, layout))


def load_dispatch_table(path: str = DISPATCH_TABLE) -> dict:
    """The measured table `{isa_class: {"machine": str, "entries": [{"params", "batch", "unit"}]}}`
    (plain JSON; an absent file is an empty table)."""
    if not os.path.exists(path):
        return {}
    try:
        with open(path, encoding="utf-8") as handle:
            table = json.load(handle)
    except (OSError, json.JSONDecodeError) as error:
        raise QrlInputError(f"{path}: not a readable dispatch table ({error})") from None
    if not isinstance(table, dict):
        raise QrlInputError(f"{path}: a dispatch table is a JSON object keyed by ISA class")
    return table


def serving_unit(batch: int, param_count: int, isa: Optional[str] = None, table: Optional[Mapping] = None) -> str:
    """The unit measured fastest on this ISA class for the measured policy nearest in parameter
    count, then in batch size (both on a log scale); `"int8"` where this ISA class was never
    measured."""
    if batch < 1 or param_count < 1:
        raise QrlInputError(f"batch and param_count must be >= 1, got {batch} and {param_count}")
    table = load_dispatch_table() if table is None else table
    isa = isa_class(cpu_info()[1]) if isa is None else isa
    entries = (table.get(isa) or {}).get("entries") or []
    if not entries:
        return "int8"

    def distance(entry):
        return (abs(math.log(entry["params"]) - math.log(param_count)), abs(math.log(entry["batch"]) - math.log(batch)))

    unit = min(entries, key=distance)["unit"]
    if unit not in UNITS:
        raise QrlInputError(f"dispatch table names an unknown unit {unit!r}")
    return unit
