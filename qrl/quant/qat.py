"""Quantization-aware training (QuaRL's QAT, Krishnan et al. 2019 §4; Jacob et al. 2018).

A QAT network is the agent's own network built at `qat_precision(N)`: the same float32
parameter tree as at fp32, with N-bit fake quantization of every dense/conv layer's kernel (per
output channel) and input (per tensor, dynamic max-abs scale) in the forward pass, and
straight-through gradients. Training runs fp32 for `quant_delay` environment steps, then the
agent swaps its update and acting functions for the QAT ones (same parameters).

After training, `export_params` converts the trained float parameters to the serving
precision `int<N>` — real int8 arithmetic for N = 8 — whose numerics the fake quantization
simulated: with dynamic activation scales the exported network reproduces the fake-quantized
network's outputs up to float rounding; with static (calibrated) scales it is PTQ of a
QAT-trained network.

The fake quantization is written here rather than through AQT (`aqtp`): AQT's TRAIN mode
scales activations per row and weights per contraction column, which the per-tensor int8
serving kernels cannot reproduce, and it costs more per update (see `bench/qat_overhead.py`).
"""

from typing import Any, Callable, Mapping, Optional

import jax
import jax.numpy as jnp
from flax import serialization as flax_serialization

from qrl.config import QAT_MAX_BITS, QAT_MIN_BITS
from qrl.errors import QrlInputError
from qrl.quant import ops
from qrl.quant.precision import Precision, parse_precision
from qrl.quant.ptq import quantize_params


def qat_precision(bits: int) -> Precision:
    """The training-time precision `qat<bits>` (2..8)."""
    if isinstance(bits, bool) or not isinstance(bits, int) or not QAT_MIN_BITS <= bits <= QAT_MAX_BITS:
        raise QrlInputError(f"qat bits must be an integer in {QAT_MIN_BITS}..{QAT_MAX_BITS}, got {bits!r}")
    return Precision(f"qat{bits}", bits=bits, weight_rule="symmetric", activations="dynamic", trainable=True)


def serving_precision(bits: int, activations: str = "dynamic") -> Precision:
    """`int<bits>-obst-sym` with the given activation scales: what a `qat<bits>` network exports
    to (one symmetric per-tensor scale per layer input, as the QAT forward pass rounds)."""
    return parse_precision(f"int{bits}-obst-sym", activations)


def check_quant_delay(quant_delay: int, steps: int) -> None:
    """A delay must leave some quantization-aware training: 0 <= quant_delay < steps."""
    if quant_delay < 0:
        raise QrlInputError(f"quant_delay must be >= 0, got {quant_delay}")
    if quant_delay >= steps:
        raise QrlInputError(
            f"quant_delay {quant_delay} is not shorter than the training run ({steps} steps): "
            "no step would train with quantization"
        )


def export_params(
    params: Mapping[str, Any], bits: int, activations: str = "dynamic",
    input_ranges: Optional[Mapping[str, Any]] = None,
) -> dict:
    """Trained float params of a QAT network -> params of the network at `int<bits>`."""
    return quantize_params(params, serving_precision(bits, activations), input_ranges)


def make_exporter(bits: int) -> Callable[[Mapping[str, Any]], dict]:
    """A jitted `params -> int<bits>` export (dynamic activation scales) of a QAT network's params.

    For acting during QAT: a `qat<N>` forward pass fake-quantizes every kernel on every call
    (per-channel max, round, clip), which at batch 1 cost ≈6× the fp32 action (98 vs 15 µs for
    a 256-256 MLP); exporting once per training phase and acting with the `int<N>` network runs
    the same numerics with the weights quantized once.
    """
    precision = serving_precision(bits, "dynamic")

    def export(node):
        if isinstance(node, Mapping) and "kernel" in node and not isinstance(node["kernel"], Mapping):
            values, scale = ops.quantize_weights(node["kernel"], precision)
            return {"kernel": values, "kernel_scale": scale, "bias": jnp.asarray(node["bias"], jnp.float32)}
        return {key: export(child) for key, child in node.items()}

    return jax.jit(lambda params: export(flax_serialization.to_state_dict(params)))
