"""Numeric precisions a network can be built and served at.

One `Precision` value describes how every dense/conv layer of a network stores its weights and
computes. The same module definition (see `qrl.networks.layers`) runs at any of them:

- `fp32`, `bf16`, `fp16`: float weights and arithmetic in that dtype.
- `int8`: real integer execution — int8 weights (symmetric, per output channel), int8
  activations (symmetric, per tensor; static calibrated or dynamic scales) and an
  int8×int8→int32 dot or convolution.
- `int<N>` for N in 2..16 (N != 8): N-bit fake quantization of weights (per output channel) and
  activations (per tensor), simulated in float32 — what the hardware would compute, not how fast.
- `quarl<N>` for N in 2..16: QuaRL's weight-only rule, for comparison with the paper:
  `d = (|min| + |max|) / 2^N`, `W = d * round(W / d)`, per tensor for dense layers and per output
  channel for convolutions; activations stay float32.
- `qat<N>` for N in 2..8 (training only, see `qrl.quant.qat`): float32 parameters, N-bit fake
  quantization of weights (per output channel) and activations (per tensor, dynamic) in the
  forward pass with straight-through gradients — the numerics `int<N>` serves with.
"""

import dataclasses
import re
from typing import Optional

import jax.numpy as jnp
import numpy as np

from qrl.errors import QrlInputError

MIN_BITS = 2
MAX_BITS = 16
ACTIVATION_MODES = ("static", "dynamic")

_FLOAT_DTYPES = {"fp32": jnp.float32, "bf16": jnp.bfloat16, "fp16": jnp.float16}


@dataclasses.dataclass(frozen=True)
class Precision:
    """How a layer stores weights and computes.

    Attributes:
      name: canonical name (`fp32`, `bf16`, `fp16`, `int8`, `int4`, `quarl4`, ...).
      dtype: float dtype of parameters and arithmetic for float precisions; float32 otherwise.
      bits: integer bit width, None for float precisions.
      weight_rule: `none` (float), `symmetric` (per output channel, max-abs scale) or `quarl`.
      activations: `none`, `static` (scales calibrated from rollouts) or `dynamic` (per call).
      integer_kernel: True when the layer runs a real int8×int8→int32 dot/convolution.
      trainable: True for quantization-aware training: float32 parameters (named and shaped as
        at fp32), fake-quantized in the forward pass with straight-through gradients.
    """

    name: str
    dtype: jnp.dtype = jnp.float32
    bits: Optional[int] = None
    weight_rule: str = "none"
    activations: str = "none"
    integer_kernel: bool = False
    trainable: bool = False

    @property
    def is_float(self) -> bool:
        return self.bits is None

    @property
    def has_float_params(self) -> bool:
        """Whether layers hold float `kernel`/`bias` (float precisions and QAT) rather than integers."""
        return self.is_float or self.trainable

    @property
    def quantizes_activations(self) -> bool:
        return self.activations != "none"

    @property
    def weight_qmax(self) -> int:
        """Largest integer magnitude a quantized weight can take."""
        if self.weight_rule == "quarl":
            return 2**self.bits
        return 2 ** (self.bits - 1) - 1

    @property
    def activation_qmax(self) -> int:
        return 2 ** (self.bits - 1) - 1

    @property
    def packed_bits(self) -> int:
        """Bits per weight in a bit-packed format: N for `int<N>`; N + 1 for `quarl<N>`, whose
        rounded values span 2^N + 1 levels (the range is |min| + |max| wide in steps of d)."""
        return self.bits + 1 if self.weight_rule == "quarl" else self.bits

    @property
    def storage_dtype(self) -> np.dtype:
        """Smallest signed integer type holding every quantized weight (float dtype if float)."""
        if self.is_float:
            return np.dtype(self.dtype)
        for dtype in (np.int8, np.int16, np.int32):
            if self.weight_qmax <= np.iinfo(dtype).max:
                return np.dtype(dtype)
        raise AssertionError("unreachable: bits are capped at 16")


FP32 = Precision("fp32")


def parse_precision(name: str, activations: str = "static") -> Precision:
    """Parses a precision name; `activations` picks static or dynamic activation scales.

    Raises QrlInputError for an unknown name, bits outside 2..16, or an unknown activation mode.
    """
    text = str(name).strip().lower()
    if activations not in ACTIVATION_MODES:
        raise QrlInputError(
            f"unknown activation scale mode {activations!r}; choose one of {', '.join(ACTIVATION_MODES)}"
        )
    if text in _FLOAT_DTYPES:
        return Precision(text, dtype=_FLOAT_DTYPES[text])
    match = re.fullmatch(r"(int|quarl)(\d+)", text)
    if not match:
        raise QrlInputError(
            f"unknown precision {name!r}; known: fp32, bf16, fp16, int<N>, quarl<N> "
            f"with N in {MIN_BITS}..{MAX_BITS}"
        )
    family, bits = match.group(1), int(match.group(2))
    if not MIN_BITS <= bits <= MAX_BITS:
        raise QrlInputError(f"precision {name!r}: bits must be in {MIN_BITS}..{MAX_BITS}, got {bits}")
    if family == "quarl":
        return Precision(text, bits=bits, weight_rule="quarl")
    return Precision(
        text, bits=bits, weight_rule="symmetric", activations=activations, integer_kernel=bits == 8
    )


def parse_precisions(names: str, activations: str = "static") -> list[Precision]:
    """Parses a comma-separated list of precision names, keeping order and dropping repeats."""
    parsed = []
    for name in str(names).split(","):
        if name.strip():
            precision = parse_precision(name, activations)
            if precision not in parsed:
                parsed.append(precision)
    if not parsed:
        raise QrlInputError("no precision given")
    return parsed
