"""The post-training quantization sweep: one fp32 policy evaluated at many precisions.

For each precision: quantize the fp32 params (calibrating static activation scales on states
the fp32 policy visits), evaluate the quantized policy over fixed-seed episodes, and measure
what QuaRL reported — mean/std return, relative error `E = (R_fp32 - R_q) / |R_fp32|`, the
divergence of its actions from fp32's on the same states — plus parameter bytes and jitted
inference latency.
"""

import dataclasses
import time
from typing import Any, Callable, Optional, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from qrl import evaluation
from qrl.quant import divergence as divergence_lib
from qrl.quant.precision import FP32, Precision
from qrl.quant.ptq import calibrate, quantize_params
from qrl.quant.serialization import packed_param_bytes, param_bytes, params_from_bytes, params_to_bytes

DIVERGENCE_KINDS = ("categorical", "deterministic")


@dataclasses.dataclass(frozen=True)
class PolicySpec:
    """What the sweep needs to know about an agent's policy.

    Attributes:
      build_network: precision -> flax module mapping observations `[B, ...]` to policy
        outputs (Q-values or logits `[B, A]` for discrete actions, actions `[B, D]` for
        deterministic continuous policies).
      outputs_to_actions: policy outputs `[B, ...]` -> environment actions `[B, ...]`.
      divergence: `categorical` (KL of softmax outputs and greedy agreement) or
        `deterministic` (mean distance between actions).
    """

    build_network: Callable[[Precision], nn.Module]
    outputs_to_actions: Callable[[jax.Array], jax.Array]
    divergence: str = "categorical"


def precision_bits(precision: Precision) -> int:
    """Bits per weight for plots: 32/16 for floats, N for integer precisions."""
    if precision.is_float:
        return int(np.dtype(precision.dtype).itemsize * 8)
    return precision.bits


def measure_latency_us(fn: Callable[[np.ndarray], Any], inputs: np.ndarray, repeats: int = 200,
                       budget_seconds: float = 1.0) -> float:
    """Median wall time of `fn(inputs)` in microseconds, after a warm-up call: `repeats` calls,
    fewer (at least 5) when they would take longer than `budget_seconds` (a CNN at batch 256
    takes ≈0.1 s per call here)."""
    jax.block_until_ready(fn(inputs))
    start = time.perf_counter()
    jax.block_until_ready(fn(inputs))
    first = time.perf_counter() - start
    repeats = int(min(repeats, max(5, budget_seconds / max(first, 1e-9))))
    times = np.empty(repeats)
    for index in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(inputs))
        times[index] = time.perf_counter() - start
    return float(np.median(times) * 1e6)


def _divergence_metrics(kind: str, reference: jax.Array, other: jax.Array, actions_ref, actions_other) -> dict:
    if kind == "categorical":
        return {
            "kl_divergence": float(divergence_lib.categorical_kl(reference, other)),
            "action_agreement": float(divergence_lib.greedy_agreement(reference, other)),
        }
    return {"mean_action_distance": float(divergence_lib.mean_action_distance(actions_ref, actions_other))}


def fp32_policy_of(spec: PolicySpec, params: dict) -> tuple[Callable, Callable[[np.ndarray], np.ndarray]]:
    """(jitted fp32 network outputs, numpy fp32 policy) of `params`."""
    fp32_network = spec.build_network(FP32)
    fp32_apply = jax.jit(lambda obs: fp32_network.apply({"params": params}, obs))
    return fp32_apply, lambda obs: np.asarray(spec.outputs_to_actions(fp32_apply(obs)))


def calibration_ranges(spec: PolicySpec, params: dict, env_id: str, calibration_steps: int, seed: int = 0,
                       env_options: Optional[dict] = None, fp32_policy: Optional[Callable] = None) -> dict:
    """Every layer's input ranges (`calibrate`) over `calibration_steps` states of fp32 rollouts
    seeded `seed + 10_000`: the static scales the sweep, the demo and the export all use.
    `fp32_policy` (numpy observations -> actions) saves compiling it again."""
    fp32_policy = fp32_policy or fp32_policy_of(spec, params)[1]
    states = evaluation.collect_observations(fp32_policy, env_id, calibration_steps, seed=seed + 10_000,
                                             env_options=env_options)
    return calibrate(spec.build_network(FP32).apply, params, states)


def probe_states(spec: PolicySpec, params: dict, env_id: str, steps: int, seed: int = 0,
                 env_options: Optional[dict] = None, fp32_policy: Optional[Callable] = None) -> np.ndarray:
    """`[steps, ...]` states of fp32 rollouts seeded `seed + 20_000`, on which quantized
    policies' actions are compared with fp32's (disjoint from the calibration states)."""
    fp32_policy = fp32_policy or fp32_policy_of(spec, params)[1]
    return evaluation.collect_observations(fp32_policy, env_id, steps, seed=seed + 20_000, env_options=env_options)


def run_sweep(
    spec: PolicySpec,
    params: dict,
    env_id: str,
    precisions: Sequence[Precision],
    episodes: int,
    seed: int = 0,
    calibration_steps: int = 2048,
    divergence_steps: int = 2048,
    latency_batch_sizes: Sequence[int] = (1, 256),
    env_options: Optional[dict] = None,
    log: Callable[[str], None] = print,
    max_steps: Optional[int] = None,
    input_ranges: Optional[dict] = None,
) -> dict:
    """Evaluates `params` (fp32) at every precision; returns a JSON-ready results dict.
    `input_ranges` (a calibration tree, e.g. a QAT run's trained ranges) replaces calibration.

    Episode i of every precision runs in an environment seeded `seed + i`, so all precisions
    face the same episodes. Calibration states come from fp32 rollouts seeded `seed + 10_000`,
    divergence states from rollouts seeded `seed + 20_000`. `max_steps` cuts evaluation
    episodes (long Atari games in smoke runs).
    """
    if spec.divergence not in DIVERGENCE_KINDS:
        raise ValueError(f"unknown divergence kind {spec.divergence!r}")
    fp32_apply, fp32_policy = fp32_policy_of(spec, params)
    divergence_states = probe_states(spec, params, env_id, divergence_steps, seed, env_options, fp32_policy)
    if input_ranges is None:
        input_ranges = calibration_ranges(spec, params, env_id, calibration_steps, seed, env_options, fp32_policy)
    reference_outputs = fp32_apply(divergence_states)
    reference_actions = spec.outputs_to_actions(reference_outputs)

    rows = []
    for precision in [FP32] + [p for p in precisions if p != FP32]:
        quantized = quantize_params(params, precision, input_ranges)
        serialized = params_to_bytes(quantized)
        quantized = params_from_bytes(serialized)  # evaluate what a receiver would load.
        network = spec.build_network(precision)
        apply = jax.jit(lambda obs, network=network, quantized=quantized: network.apply({"params": quantized}, obs))
        act = jax.jit(lambda obs, apply=apply: spec.outputs_to_actions(apply(obs)))
        policy = lambda obs, act=act: np.asarray(act(obs))
        result = evaluation.evaluate(policy, env_id, episodes, seed=seed, max_steps=max_steps, env_options=env_options)
        outputs = apply(divergence_states)
        row = {
            "precision": precision.name,
            "bits": precision_bits(precision),
            "family": precision.scheme,
            "activations": precision.activations,
            "integer_kernel": precision.integer_kernel,
            "mean_return": result.mean,
            "std_return": result.std,
            "returns": list(result.returns),
            "param_bytes": param_bytes(quantized),
            "packed_param_bytes": packed_param_bytes(quantized, precision),
            "serialized_bytes": len(serialized),
            **_divergence_metrics(spec.divergence, reference_outputs, outputs, reference_actions, spec.outputs_to_actions(outputs)),
        }
        for batch_size in latency_batch_sizes:
            batch = np.resize(divergence_states, (batch_size,) + divergence_states.shape[1:])
            row[f"latency_us_batch{batch_size}"] = measure_latency_us(act, jnp.asarray(batch))
        rows.append(row)
        log(f"{precision.name:>7}: return {result.mean:9.2f} ± {result.std:7.2f}  bytes {row['param_bytes']}")

    reference_return = rows[0]["mean_return"]
    for row in rows:
        row["relative_error"] = (
            (reference_return - row["mean_return"]) / abs(reference_return) if reference_return != 0 else None
        )
        row["bytes_ratio_to_fp32"] = row["param_bytes"] / rows[0]["param_bytes"]
        for batch_size in latency_batch_sizes:
            key = f"latency_us_batch{batch_size}"
            row[f"latency_ratio_batch{batch_size}"] = row[key] / rows[0][key]
    return {
        "env": env_id,
        "episodes": episodes,
        "seed": seed,
        "calibration_steps": calibration_steps,
        "divergence_steps": divergence_steps,
        "divergence": spec.divergence,
        "results": rows,
    }
