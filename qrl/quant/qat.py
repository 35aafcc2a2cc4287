"""Quantization-aware training (QuaRL's QAT, Krishnan et al. 2019 §4; Jacob et al. 2018).

A QAT network is the agent's own network built at `qat_precision(N)`: the same float32
parameter tree as at fp32, plus a `quant_ranges` collection of moving-average input ranges,
one per dense/conv layer (`input_min` / `input_max`: per feature `[in]` for the layer reading
the observation, per tensor `[]` for the others; `seen`, `role`). Its forward pass simulates
the serving scheme `int<N>` with static ranges (`qrl.quant.precision`): every layer input
rounded onto the affine grid of its range (the observation per feature, its scales folded into
the kernel), every kernel symmetric per output channel; straight-through gradients.

Training mode applies the network with `mutable=["quant_ranges"]` (`apply_tracking`): each
layer first moves its range towards the batch's (`range_decay` 0.99 by default; the first
batch sets the range, so nothing starts from zero), then rounds onto it. Any other apply reads
the ranges frozen (`apply_frozen`). `export_params(params, N, quant_ranges)` is
`quantize_params(params, int<N>, ranges)`: the int<N> network computes with the ranges the
network trained with, and its outputs equal the frozen-range QAT network's up to float rounding
(`tests/test_qat.py`).

The quantization delay counts **updates** (gradient steps): the first `quant_delay` updates
train float (`qat_precision(N, fake_quant=False)`: same parameters, float forward pass) while
the ranges are already tracked, so they are warm when fake quantization switches on.

Deviation from QuaRL (TF contrib's `create_training_graph`): TF tracked moving-average min/max
on layer *outputs* and left the model input float; here each layer's *input* is tracked and
rounded, the observation included (per feature), because that is what the int<N> kernels
consume.

Backends: `qrl` (the layers' own fake quantization, the numerics above) or `aqt`: dense
matmuls through AQT's fake-quantized dot (`qrl.quant.aqt_backend`; dynamic symmetric scales, so
training and exported numerics differ), the same ranges tracked beside it for export.
"""

from typing import Any, Callable, Mapping, Optional

import jax
import jax.numpy as jnp
import numpy as np
from flax import serialization as flax_serialization

from qrl.config import QAT_BACKENDS, QAT_MAX_BITS, QAT_MIN_BITS
from qrl.errors import QrlInputError
from qrl.quant import ops
from qrl.quant.ops import QUANT_RANGES
from qrl.quant.precision import Precision, QatPrecision, parse_precision
from qrl.quant.ptq import INPUT_ABSMAX, INPUT_MAX, INPUT_MIN, ROLE, ROLE_READS_OBSERVATION, quantize_params

RANGE_DECAY = 0.99


def qat_precision(bits: int, backend: str = "qrl", fake_quant: bool = True, range_decay: float = RANGE_DECAY) -> QatPrecision:
    """The training-time precision `qat<bits>` (2..8) on `backend` (`qrl` or `aqt`);
    `fake_quant=False` is the quantization delay's (float forward, ranges tracked)."""
    if isinstance(bits, bool) or not isinstance(bits, int) or not QAT_MIN_BITS <= bits <= QAT_MAX_BITS:
        raise QrlInputError(f"qat bits must be an integer in {QAT_MIN_BITS}..{QAT_MAX_BITS}, got {bits!r}")
    if backend not in QAT_BACKENDS:
        raise QrlInputError(f"unknown qat backend {backend!r}; choose one of {', '.join(QAT_BACKENDS)}")
    if not 0.0 <= range_decay < 1.0:
        raise QrlInputError(f"qat range decay must be in [0, 1), got {range_decay}")
    name = f"qat{bits}" + ("-aqt" if backend == "aqt" else "") + ("" if fake_quant else "-delay")
    return QatPrecision(name, bits=bits, weight_rule="symmetric", activations="static", trainable=True, grid="affine",
                        observation="feature", range_decay=range_decay, fake_quant=fake_quant, backend=backend)


def serving_precision(bits: int) -> Precision:
    """`int<bits>`: static affine activation ranges, per-feature observation, per-channel
    weights — what a `qat<bits>` network exports to and simulates."""
    return parse_precision(f"int{bits}")


def check_quant_delay(quant_delay: int, updates: int) -> None:
    """A delay (in updates) must leave some quantization-aware training: 0 <= delay < updates."""
    if quant_delay < 0:
        raise QrlInputError(f"quant_delay must be >= 0 updates, got {quant_delay}")
    if quant_delay >= updates:
        raise QrlInputError(
            f"quant_delay {quant_delay} updates is not shorter than the training run ({updates} updates): "
            "no update would train with quantization"
        )


def apply_tracking(network, params, quant_ranges, *args, **kwargs) -> tuple[Any, Any]:
    """Training-mode forward pass: `(outputs, updated quant_ranges)`. A network without ranges
    (`quant_ranges` empty: not QAT) is applied plainly and its empty ranges returned."""
    if not quant_ranges:
        return network.apply({"params": params}, *args, **kwargs), quant_ranges
    outputs, state = network.apply({"params": params, QUANT_RANGES: quant_ranges}, *args, mutable=[QUANT_RANGES], **kwargs)
    return outputs, state[QUANT_RANGES]


def apply_frozen(network, params, quant_ranges, *args, **kwargs) -> Any:
    """Forward pass reading the ranges frozen (the same as `network.apply` when there are none)."""
    variables = {"params": params, QUANT_RANGES: quant_ranges} if quant_ranges else {"params": params}
    return network.apply(variables, *args, **kwargs)


def init_ranges(network, key: jax.Array, *example_inputs) -> dict:
    """A QAT network's `quant_ranges` collection before any batch (unseen, zero ranges)."""
    return network.init(key, *example_inputs)[QUANT_RANGES]


def _is_range(node: Any) -> bool:
    return isinstance(node, Mapping) and INPUT_MIN in node and "seen" in node


def calibration_from_ranges(quant_ranges: Mapping[str, Any], path: tuple = ()) -> dict:
    """`quant_ranges` -> the calibration tree `qrl.quant.calibrate` produces (`input_absmax`,
    `input_min`, `input_max`, `role` per layer). Raises QrlInputError for a layer no training
    batch has passed through."""
    quant_ranges = flax_serialization.to_state_dict(quant_ranges)
    tree = {}
    for key, node in quant_ranges.items():
        if not _is_range(node):
            tree[key] = calibration_from_ranges(node, path + (key,))
            continue
        if int(np.asarray(node["seen"])) == 0:
            raise QrlInputError(f"layer {'/'.join(path + (key,))} has no activation range yet: no training batch passed through it")
        low, high = np.asarray(node[INPUT_MIN], np.float32), np.asarray(node[INPUT_MAX], np.float32)
        tree[key] = {INPUT_MIN: low, INPUT_MAX: high, INPUT_ABSMAX: np.float32(max(np.abs(low).max(), np.abs(high).max())),
                     ROLE: np.asarray(node[ROLE], np.int32)}
    return tree


def export_params(params: Mapping[str, Any], bits: int, quant_ranges: Mapping[str, Any]) -> dict:
    """Trained float params of a QAT network and its ranges -> params of the network at the
    static `int<bits>` scheme, calibrated with the ranges it trained with."""
    return quantize_params(params, serving_precision(bits), calibration_from_ranges(quant_ranges))


def range_roles(quant_ranges: Mapping[str, Any]) -> dict:
    """The `role` bit flags of every layer in `quant_ranges` as Python ints (a tree shaped like
    the ranges' layers): constants of the network, needed to export under `jit`."""
    quant_ranges = flax_serialization.to_state_dict(quant_ranges)
    return {key: int(np.asarray(node[ROLE])) if _is_range(node) else range_roles(node)
            for key, node in quant_ranges.items()}


def make_exporter(bits: int, roles: Optional[Mapping[str, Any]] = None) -> Callable[[Mapping[str, Any], Mapping[str, Any]], dict]:
    """A jitted `(params, quant_ranges) -> int<bits> params`, equal to `export_params` up to
    float rounding of the folded bias (for acting during QAT: re-exported after every training
    phase). Layer places (`roles`, see `range_roles`) are read from the first call's ranges
    unless given; given, the export also traces inside other jitted code."""
    precision = serving_precision(bits)

    def export_layer(layer, ranges, reads_observation):
        kernel, bias = layer["kernel"].astype(jnp.float32), layer["bias"].astype(jnp.float32)
        scale, zero_point = ops.grid_range(ranges[INPUT_MIN], ranges[INPUT_MAX], precision)
        if reads_observation:
            values, kernel_scale = ops.quantize_weights(kernel * scale[:, None], precision)
            output_scale = kernel_scale
        else:
            values, kernel_scale = ops.quantize_weights(kernel, precision)
            output_scale = scale * kernel_scale
        correction = ops.zero_point_correction(values, zero_point).astype(jnp.float32)
        return {"kernel": values, "kernel_scale": kernel_scale, "input_scale": scale,
                "input_zero_point": zero_point, "bias": bias - output_scale * correction}

    def export_tree(params, ranges, roles):
        if isinstance(roles, int):
            return export_layer(params, ranges, bool(roles & ROLE_READS_OBSERVATION))
        return {key: export_tree(params[key], ranges[key], roles[key]) if key in roles else params[key]
                for key in params}

    compiled = {}

    def export(params, quant_ranges):
        params = flax_serialization.to_state_dict(params)
        quant_ranges = flax_serialization.to_state_dict(quant_ranges)
        if "fn" not in compiled:
            layer_roles = roles
            if layer_roles is None:
                calibration_from_ranges(quant_ranges)  # fails clearly on a layer with no range yet.
                layer_roles = range_roles(quant_ranges)
            compiled["fn"] = jax.jit(lambda p, r: export_tree(p, r, layer_roles))
        return compiled["fn"](params, quant_ranges)

    return export
