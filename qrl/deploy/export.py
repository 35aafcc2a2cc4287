"""Exporting a qrl policy at a precision: an ONNX model plus a JSON sidecar.

The model maps `observation [B, ...]` (float32) to `action [B, ...]` (environment actions: the
agent's own post-processing — argmax, tanh squashing, scaling to the action bounds — is in the
graph) and `outputs [B, ...]` (the network's raw outputs: Q-values, logits, actions), computed
with exactly the arithmetic qrl's JAX policy uses at that precision (`qrl.deploy.onnx_graph`).

The sidecar `<model>.json` says what the model is and where it came from:

    {"format": "qrl-policy", "version": 1, "agent": "dqn", "env": "gym:CartPole-v1",
     "precision": "int8", "observation": {"shape": [4], "dtype": "float32", "normalization": null},
     "action": {"kind": "discrete", "shape": [], "dtype": "int32", "num_actions": 2},
     "outputs": ["action", "outputs"], "model_sha256": "...", "model_bytes": 12345,
     "agreement": {"probe_states": 1024, "action_agreement": 1.0, "max_output_difference": 2e-07},
     "source": {"workdir": "/abs/runs/dqn", "checkpoint_step": 50000, "run_finished": true,
                "activation_ranges": "calibrated on 2048 fp32 rollout states (seed 10000)"}}

`normalization` (`{"mean": [...], "std": [...]}`) is applied by the loader before the model,
for policies trained on normalized observations. Both files are written to temporary siblings
and renamed into place, the model last-but-one and the sidecar last: a killed export leaves no
half-written file under either name.
"""

import hashlib
import os
from typing import Any, Callable, Mapping, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from qrl import io
from qrl.deploy.onnx_graph import to_onnx
from qrl.deploy.policy import SIDECAR_FORMAT, SIDECAR_VERSION, session_from_bytes, sidecar_path
from qrl.errors import QrlInputError
from qrl.quant.precision import Precision
from qrl.quant.ptq import quantize_params
from qrl.quant.sweep import PolicySpec

OUTPUT_NAMES = ("action", "outputs")


def check_out_path(out_path: str) -> str:
    """Refuses an output path that is a directory, whose sidecar path is, or whose directory
    does not exist or cannot be written; returns it absolute."""
    if not out_path:
        raise QrlInputError("--out is required")
    out_path = os.path.abspath(out_path)
    directory = os.path.dirname(out_path)
    for path in (out_path, sidecar_path(out_path)):
        if os.path.isdir(path):
            raise QrlInputError(f"--out {path} is a directory")
    if not os.path.isdir(directory):
        raise QrlInputError(f"--out {out_path}: directory {directory} does not exist")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise QrlInputError(f"--out {out_path}: directory {directory} is not writable")
    return out_path


def policy_function(spec: PolicySpec, params: Mapping[str, Any], precision: Precision,
                    input_ranges: Optional[Mapping[str, Any]] = None) -> Callable[[jax.Array], tuple]:
    """`fn(observations [B, ...]) -> (actions [B, ...], outputs [B, ...])` of the fp32 `params`
    quantized to `precision` (`input_ranges`: the calibration tree static scales need), the
    computation `qrl.quant.sweep` evaluates at that precision."""
    quantized = jax.tree.map(np.asarray, quantize_params(params, precision, input_ranges))
    network = spec.build_network(precision)

    def fn(observations):
        outputs = network.apply({"params": quantized}, observations)
        return spec.outputs_to_actions(outputs), outputs

    return fn


def action_description(action_spec: Any) -> dict:
    """The sidecar's `action` entry for a dm_env action spec."""
    minimum, maximum = getattr(action_spec, "minimum", None), getattr(action_spec, "maximum", None)
    if np.issubdtype(np.dtype(action_spec.dtype), np.integer):
        return {"kind": "discrete", "shape": [], "dtype": "int32", "num_actions": int(np.asarray(maximum).max()) + 1}
    return {"kind": "continuous", "shape": list(action_spec.shape), "dtype": "float32",
            "low": np.broadcast_to(minimum, action_spec.shape).astype(float).tolist(),
            "high": np.broadcast_to(maximum, action_spec.shape).astype(float).tolist()}


def export_policy(
    fn: Callable[[jax.Array], tuple],
    observation_shape: Sequence[int],
    out_path: str,
    description: Mapping[str, Any],
    normalization: Optional[Mapping[str, Sequence[float]]] = None,
    probe_observations: Optional[np.ndarray] = None,
) -> dict:
    """Writes `fn` (see `policy_function`) as the ONNX model `out_path` and its sidecar
    (`description`: agent, env, precision, action, source; see the module docstring).
    With `probe_observations [N, ...]` (already normalized, as `fn` sees them) the model is run
    by ONNX Runtime before anything is written and its agreement with `fn` recorded in the
    sidecar's `agreement` (`agreement_of`). Returns the sidecar. Refuses, before writing, an
    output path whose directory cannot be written or that is a directory."""
    out_path = check_out_path(out_path)
    model = to_onnx(fn, observation_shape, OUTPUT_NAMES, doc=f"qrl policy: {description.get('agent')} "
                    f"on {description.get('env')} at {description.get('precision')}")
    data = model.SerializeToString()
    agreement = None
    if probe_observations is not None:
        session = session_from_bytes(data)
        onnx_actions, onnx_outputs = session.run(list(OUTPUT_NAMES), {session.get_inputs()[0].name: probe_observations})
        jax_actions, jax_outputs = jax.jit(fn)(jnp.asarray(probe_observations))
        agreement = agreement_of(np.asarray(jax_actions), np.asarray(jax_outputs), onnx_actions, onnx_outputs)
    sidecar = {
        "format": SIDECAR_FORMAT, "version": SIDECAR_VERSION, **description,
        "observation": {"shape": [int(d) for d in observation_shape], "dtype": "float32",
                        "normalization": None if normalization is None else {
                            "mean": np.asarray(normalization["mean"], np.float64).tolist(),
                            "std": np.asarray(normalization["std"], np.float64).tolist()}},
        "outputs": list(OUTPUT_NAMES),
        "model_sha256": hashlib.sha256(data).hexdigest(),
        "model_bytes": len(data),
        "agreement": agreement,
    }
    io.atomic_write_bytes(out_path, data)
    io.atomic_write_json(sidecar_path(out_path), sidecar)
    return sidecar


def agreement_of(jax_actions: np.ndarray, jax_outputs: np.ndarray, onnx_actions: np.ndarray,
                 onnx_outputs: np.ndarray) -> dict:
    """How closely an exported model reproduces the JAX policy on the same states: the fraction
    of equal actions (discrete) or the largest action difference (continuous), and the largest
    difference of the raw outputs."""
    result = {"probe_states": int(jax_actions.shape[0]),
              "max_output_difference": float(np.max(np.abs(onnx_outputs.astype(np.float32) - jax_outputs.astype(np.float32))))}
    if np.issubdtype(jax_actions.dtype, np.integer):
        result["action_agreement"] = float(np.mean(onnx_actions == jax_actions))
    else:
        result["max_action_difference"] = float(np.max(np.abs(onnx_actions - jax_actions)))
    return result
