"""Numeric precisions and quantization schemes a network can be built and served at.

One `Precision` value describes how a network's dense/conv layers store weights and compute; a
layer may refine it by its place in the network (`Precision.for_layer`: the layer reading the
observation and the output layers). The same module definition (see `qrl.networks.layers`)
runs at any of them. Two families of integer schemes sit side by side (README, "Quantization
schemes"):

QuaRL's (Krishnan et al. 2019, reproduced for comparison with the paper):
- `quarl<N>` (N in 2..16): weight-only, `d = (|min| + |max|) / 2^N`, `W = d * round(W / d)`,
  per tensor for dense layers and per output channel for convolutions; activations float32.
- `quarl_fp16`: weights stored in float16 and computed in float32, as its TFLite fp16 path.
- `quarl_dyn8`: dynamic-range int8 as QuaRL's ActorQ actors ran it (PyTorch `quantize_dynamic`):
  int8 weights per output channel, every layer input quantized per call on an affine 8-bit grid
  over `[min(x, 0), max(x, 0)]`, real int8×int8→int32 kernels.

qrl's weights + activations scheme, `int<N>[-modifier...]` (N in 2..16): int8 runs real
int8×int8→int32 kernels, other N simulate the arithmetic in float32 (same integer values):
- weights symmetric per output channel (max-abs scale);
- activations static (scales calibrated on fp32 rollouts; the default) or `-dyn` (per call);
- an affine grid for every layer input: `[min(x, 0), max(x, 0)]` onto 2^N levels, so a
  non-negative (post-ReLU) input gets the whole unsigned grid; `-sym` keeps the signed grid
  `[-max|x|, max|x|]` (one bit wasted on ReLU outputs);
- the observation (first layer's input) on per-feature calibrated scales folded into the
  kernel (the default: velocity and position each get all 2^N levels), `-obst` one per-tensor
  scale, or `-obsf` kept float (that layer weight-only);
- `-e<M>`: the first and the output layers at M bits (M > N), e.g. `int4-e8`.
`int<N>-obst-sym` is the scheme qrl used before the W+A scheme was improved.

Float precisions: `fp32`, `bf16`, `fp16` — weights and arithmetic in that dtype (f32 sums).
Training only: `qat<N>` for N in 2..8 (see `qrl.quant.qat`).
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
GRIDS = ("affine", "symmetric")
OBSERVATION_MODES = ("feature", "tensor", "float")

_FLOAT_DTYPES = {"fp32": jnp.float32, "bf16": jnp.bfloat16, "fp16": jnp.float16}
_OBSERVATION_MODIFIERS = {"obst": "tensor", "obsf": "float"}
SCHEME_NAMES = "fp32, bf16, fp16, quarl_fp16, quarl<N>, quarl_dyn8, int<N>[-e<M>][-obst|-obsf][-sym][-dyn]"


@dataclasses.dataclass(frozen=True)
class Precision:
    """How a layer stores weights and computes.

    Attributes:
      name: canonical name (`fp32`, `int8`, `int4-e8`, `quarl4`, `quarl_dyn8`, ...).
      dtype: float dtype of parameters (and arithmetic, unless `compute_dtype`) for float
        precisions; float32 otherwise.
      bits: integer bit width, None for float precisions.
      weight_rule: `none` (float), `symmetric` (per output channel, max-abs scale) or `quarl`.
      activations: `none`, `static` (scales calibrated from rollouts) or `dynamic` (per call).
      integer_kernel: True when the layer runs a real int8×int8→int32 dot/convolution.
      trainable: True for quantization-aware training: float32 parameters (named and shaped as
        at fp32), fake-quantized in the forward pass with straight-through gradients.
      grid: activation grid, `affine` (`[min(x, 0), max(x, 0)]` onto 2^bits levels with a zero
        point) or `symmetric` (`[-max|x|, max|x|]`, zero point 0).
      observation: how the layer reading the observation quantizes its input: `feature`
        (calibrated per-feature scales folded into its kernel), `tensor` (one scale, as every
        other layer) or `float` (kept float; that layer is weight-only).
      edge_bits: bit width of the observation-reading and output layers, None for `bits`.
      compute_dtype: arithmetic dtype of a float precision when it differs from `dtype`
        (`quarl_fp16` stores float16 and computes float32).
    """

    name: str
    dtype: jnp.dtype = jnp.float32
    bits: Optional[int] = None
    weight_rule: str = "none"
    activations: str = "none"
    integer_kernel: bool = False
    trainable: bool = False
    grid: str = "symmetric"
    observation: str = "tensor"
    edge_bits: Optional[int] = None
    compute_dtype: Optional[jnp.dtype] = None

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
    def arithmetic_dtype(self) -> jnp.dtype:
        """The dtype a float precision's layers compute in."""
        return self.compute_dtype if self.compute_dtype is not None else self.dtype

    @property
    def scheme(self) -> str:
        """The family a precision belongs to, bits left out: `float`, `quarl`, `quarl_dyn`,
        `int`, `int-e8-dyn`, ... (one series per scheme in return-vs-bits plots)."""
        if self.is_float:
            return "float"
        if self.name.startswith("quarl_dyn"):
            return "quarl_dyn"
        if self.weight_rule == "quarl":
            return "quarl"
        head, _, modifiers = self.name.partition("-")
        return "int" + (f"-{modifiers}" if modifiers else "")

    @property
    def weight_qmax(self) -> int:
        """Largest integer magnitude a quantized weight can take."""
        if self.weight_rule == "quarl":
            return 2**self.bits
        return 2 ** (self.bits - 1) - 1

    @property
    def activation_qmax(self) -> int:
        """Largest integer of the activation grid (symmetric: `[-qmax, qmax]`)."""
        return 2 ** (self.bits - 1) - 1

    @property
    def activation_qmin(self) -> int:
        """Smallest integer of the activation grid: `-qmax` symmetric, `-2^(bits-1)` affine."""
        return -(2 ** (self.bits - 1)) if self.grid == "affine" else -self.activation_qmax

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

    def for_layer(self, reads_observation: bool, is_output: bool) -> "Precision":
        """The precision one layer runs at, given its place in the network.

        Edge layers (reading the observation, or producing an output) take `edge_bits`; the
        observation-reading layer keeps its input float (`observation="float"`: a weight-only
        layer) or calibrates it per feature (`"feature"`: static scales even when the other
        layers' are dynamic — an observation's range is the environment's, not the call's).
        Float, weight-only and QAT precisions are the same for every layer.
        """
        if not self.quantizes_activations or self.trainable:
            return self
        layer = self
        if self.edge_bits is not None and (reads_observation or is_output):
            layer = dataclasses.replace(layer, name=f"{self.name}@edge", bits=self.edge_bits,
                                        integer_kernel=self.edge_bits == 8, edge_bits=None)
        if reads_observation and self.observation == "float":
            layer = dataclasses.replace(layer, activations="none", integer_kernel=False)
        elif reads_observation and self.observation == "feature":
            layer = dataclasses.replace(layer, activations="static")
        return layer

    def per_feature_input(self, reads_observation: bool) -> bool:
        """Whether a layer at this (layer) precision scales its input per feature."""
        return reads_observation and self.quantizes_activations and self.observation == "feature"


@dataclasses.dataclass(frozen=True)
class QatPrecision(Precision):
    """A quantization-aware training precision `qat<N>` (see `qrl.quant.qat.qat_precision`):
    float32 parameters, the forward pass rounding onto the grids of the serving scheme `int<N>`
    (static activation ranges, affine grids, per-feature observation, per-channel weights).

    Attributes (beyond `Precision`'s):
      range_decay: decay of the moving averages of every layer input's min/max.
      fake_quant: False during the quantization delay: float forward, ranges still tracked.
      backend: `qrl` (fake quantization onto the int<N> grids) or `aqt` (AQT's fake-quantized
        matmul; same ranges tracked for export).
    """

    range_decay: float = 0.99
    fake_quant: bool = True
    backend: str = "qrl"


FP32 = Precision("fp32")
QUARL_FP16 = Precision("quarl_fp16", dtype=jnp.float16, compute_dtype=jnp.float32)
QUARL_DYN8 = Precision("quarl_dyn8", bits=8, weight_rule="symmetric", activations="dynamic", integer_kernel=True,
                       grid="affine", observation="tensor")


def _check_bits(name: str, bits: int, what: str = "bits") -> None:
    if not MIN_BITS <= bits <= MAX_BITS:
        raise QrlInputError(f"precision {name!r}: {what} must be in {MIN_BITS}..{MAX_BITS}, got {bits}")


def _parse_int_scheme(name: str, bits: int, modifiers: list, activations: str) -> Precision:
    """`int<N>` and its modifiers (see the module docstring) -> a Precision with canonical name."""
    edge_bits, observation, grid = None, "feature", "affine"
    seen = set()
    for modifier in modifiers:
        if modifier in seen:
            raise QrlInputError(f"precision {name!r}: modifier -{modifier} given twice")
        seen.add(modifier)
        edge = re.fullmatch(r"e(\d+)", modifier)
        if edge:
            if edge_bits is not None:
                raise QrlInputError(f"precision {name!r}: more than one edge width (-e<M>)")
            edge_bits = int(edge.group(1))
            _check_bits(name, edge_bits, "edge bits")
            if edge_bits <= bits:
                raise QrlInputError(f"precision {name!r}: edge layers need more bits than the others ({edge_bits} <= {bits})")
        elif modifier in _OBSERVATION_MODIFIERS:
            if observation != "feature":
                raise QrlInputError(f"precision {name!r}: -obst and -obsf cannot both be given")
            observation = _OBSERVATION_MODIFIERS[modifier]
        elif modifier == "sym":
            grid = "symmetric"
        elif modifier == "dyn":
            activations = "dynamic"
        else:
            raise QrlInputError(
                f"precision {name!r}: unknown modifier -{modifier}; int<N> takes -e<M>, -obst, -obsf, -sym, -dyn"
            )
    parts = [f"int{bits}"]
    if edge_bits is not None:
        parts.append(f"e{edge_bits}")
    parts += [modifier for modifier, mode in _OBSERVATION_MODIFIERS.items() if mode == observation]
    parts += ["sym"] if grid == "symmetric" else []
    parts += ["dyn"] if activations == "dynamic" else []
    return Precision("-".join(parts), bits=bits, weight_rule="symmetric", activations=activations,
                     integer_kernel=bits == 8, grid=grid, observation=observation, edge_bits=edge_bits)


def parse_precision(name: str, activations: str = "static") -> Precision:
    """Parses a precision name (see the module docstring); `activations` is the default
    activation mode of `int<N>` schemes (`-dyn` in the name picks dynamic regardless).

    Raises QrlInputError for an unknown name or modifier, bits outside 2..16, a modifier on a
    scheme that takes none, conflicting modifiers, or an unknown activation mode.
    """
    text = str(name).strip().lower()
    if activations not in ACTIVATION_MODES:
        raise QrlInputError(
            f"unknown activation scale mode {activations!r}; choose one of {', '.join(ACTIVATION_MODES)}"
        )
    if text in _FLOAT_DTYPES:
        return Precision(text, dtype=_FLOAT_DTYPES[text])
    if text == QUARL_FP16.name:
        return QUARL_FP16
    if text == QUARL_DYN8.name:
        return QUARL_DYN8
    head, *modifiers = text.split("-")
    match = re.fullmatch(r"(int|quarl)(\d+)", head)
    if not match or not all(modifiers):
        raise QrlInputError(f"unknown precision {name!r}; known: {SCHEME_NAMES} with N in {MIN_BITS}..{MAX_BITS}")
    family, bits = match.group(1), int(match.group(2))
    _check_bits(name, bits)
    if family == "quarl":
        if modifiers:
            raise QrlInputError(
                f"precision {name!r}: QuaRL's weight-only rule takes no modifiers (-{'-'.join(modifiers)} applies to "
                "int<N> schemes)"
            )
        return Precision(text, bits=bits, weight_rule="quarl")
    return _parse_int_scheme(name, bits, modifiers, activations)


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
