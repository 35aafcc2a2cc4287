"""Quantization: precisions, post-training quantization, int8 kernels, serialization."""

from qrl.quant.divergence import categorical_kl, gaussian_kl, greedy_agreement, mean_action_distance
from qrl.quant.precision import FP32, MAX_BITS, MIN_BITS, Precision, parse_precision, parse_precisions
from qrl.quant.ptq import calibrate, fake_quantized_float_params, quantize_params
from qrl.quant.qat import (
    apply_frozen,
    apply_tracking,
    check_quant_delay,
    export_params,
    init_ranges,
    make_exporter,
    qat_precision,
    serving_precision,
)
from qrl.quant.serialization import packed_param_bytes, param_bytes, params_from_bytes, params_to_bytes

__all__ = [
    "FP32",
    "MAX_BITS",
    "MIN_BITS",
    "Precision",
    "apply_frozen",
    "apply_tracking",
    "calibrate",
    "check_quant_delay",
    "export_params",
    "make_exporter",
    "categorical_kl",
    "fake_quantized_float_params",
    "gaussian_kl",
    "init_ranges",
    "greedy_agreement",
    "mean_action_distance",
    "packed_param_bytes",
    "param_bytes",
    "params_from_bytes",
    "params_to_bytes",
    "parse_precision",
    "parse_precisions",
    "qat_precision",
    "quantize_params",
    "serving_precision",
]
