"""A runtime-neutral policy: an exported qrl policy run by ONNX Runtime on numpy observations.

    policy = load_policy("policy.onnx")            # reads policy.onnx.json beside it
    actions = policy(observations)                 # [B, ...] float32 -> environment actions [B, ...]
    action = policy.act(observation)               # one observation, no batch axis
    pruned = load_policy("pruned.onnx", runtime="csr")   # pruned kernels as scipy CSR products

Nothing of JAX is imported here: a robot or an actor process needs numpy and onnxruntime only
(and scipy for the CSR runtime).
The sidecar is checked (format, version, the model's SHA-256) before the model is parsed, and the
model's input and outputs against the sidecar; any mismatch is a one-line `QrlInputError`.
"""

import hashlib
import json
import os
from typing import Any, Optional

import numpy as np

from qrl.errors import QrlInputError

SIDECAR_FORMAT = "qrl-policy"
SIDECAR_VERSION = 1
_REQUIRED = {"agent": str, "env": str, "precision": str, "observation": dict, "action": dict,
             "outputs": list, "model_sha256": str}


def sidecar_path(model_path: str) -> str:
    """Where the sidecar of `model_path` lives: `<model_path>.json`."""
    return f"{model_path}.json"


def _read_sidecar(model_path: str) -> dict:
    path = sidecar_path(model_path)
    if not os.path.isfile(path):
        raise QrlInputError(f"{model_path} has no sidecar {path}: export it with python -m launch.export")
    try:
        with open(path, encoding="utf-8") as handle:
            sidecar = json.load(handle)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise QrlInputError(f"{path} is not a readable qrl policy sidecar: {error}") from error
    if not isinstance(sidecar, dict) or sidecar.get("format") != SIDECAR_FORMAT:
        raise QrlInputError(f"{path} is not a qrl policy sidecar (format is not {SIDECAR_FORMAT!r})")
    if sidecar.get("version") != SIDECAR_VERSION:
        raise QrlInputError(f"{path} has sidecar version {sidecar.get('version')!r}; this qrl reads {SIDECAR_VERSION}")
    for key, kind in _REQUIRED.items():
        if not isinstance(sidecar.get(key), kind):
            raise QrlInputError(f"{path}: entry {key!r} is missing or not a {kind.__name__}")
    shape = sidecar["observation"].get("shape")
    if not isinstance(shape, list) or not all(isinstance(d, int) and d > 0 for d in shape):
        raise QrlInputError(f"{path}: observation shape {shape!r} is not a list of positive integers")
    normalization = sidecar["observation"].get("normalization")
    if normalization is not None:
        try:
            mean = np.asarray(normalization["mean"], np.float32)
            std = np.asarray(normalization["std"], np.float32)
        except (KeyError, TypeError, ValueError) as error:
            raise QrlInputError(f"{path}: observation normalization is malformed ({error})") from error
        if mean.shape != std.shape or np.broadcast_shapes(mean.shape, tuple(shape)) != tuple(shape) or not np.all(std > 0):
            raise QrlInputError(f"{path}: observation normalization does not fit observations of shape {shape}")
    return sidecar


def session_from_bytes(data: bytes, threads: int = 1, providers: Optional[list] = None,
                       unsigned_kernels: Optional[bool] = None):
    """An ONNX Runtime session of a serialized model (`threads` intra-op threads). Where ONNX
    Runtime's u8·s8 integer product saturates (x86 without VNNI / AMX; `unsigned_kernels=None`
    asks the CPU), the model's int8 kernels run as the exact u8·u8 product instead
    (`qrl.deploy.integer_kernels`); the file itself is not changed."""
    import onnxruntime

    from qrl.deploy import integer_kernels

    if unsigned_kernels is None:
        unsigned_kernels = integer_kernels.u8s8_saturates()
    if unsigned_kernels and any(op.encode() in data for op in integer_kernels.INTEGER_PRODUCTS):
        import onnx

        data = integer_kernels.unsigned_kernels(onnx.load_from_string(data)).SerializeToString()

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    return onnxruntime.InferenceSession(data, options, providers=providers or ["CPUExecutionProvider"])


RUNTIMES = ("onnxruntime", "csr")


class OnnxPolicy:
    """An exported policy run by ONNX Runtime (`runtime="onnxruntime"`, `threads` intra-op
    threads; 1 by default, as an actor or a robot's control loop runs it) or by qrl's numpy/scipy
    interpreter whose pruned kernels run as CSR products (`runtime="csr"`:
    `qrl.deploy.csr_runtime`, faster for wide pruned policies; MLPs only)."""

    def __init__(self, model_path: str, threads: int = 1, providers: Optional[list] = None,
                 runtime: str = "onnxruntime"):
        if runtime not in RUNTIMES:
            raise QrlInputError(f"unknown policy runtime {runtime!r}; known: {', '.join(RUNTIMES)}")
        if not os.path.isfile(model_path):
            raise QrlInputError(f"policy model {model_path} does not exist")
        self.sidecar = _read_sidecar(model_path)
        self.runtime = runtime
        with open(model_path, "rb") as handle:
            data = handle.read()
        if hashlib.sha256(data).hexdigest() != self.sidecar["model_sha256"]:
            raise QrlInputError(f"{model_path} does not match its sidecar's SHA-256: the model is corrupted or foreign")
        if runtime == "csr":
            input_names, outputs = self._load_csr(model_path, data)
        else:
            try:
                self.session = session_from_bytes(data, threads, providers)
            except Exception as error:  # ONNX Runtime raises its own exception types for malformed models.
                raise QrlInputError(f"{model_path} is not a model ONNX Runtime can run: {str(error).splitlines()[0]}") from error
            input_names = [value.name for value in self.session.get_inputs()]
            outputs = [output.name for output in self.session.get_outputs()]
        if len(input_names) != 1 or outputs != self.sidecar["outputs"]:
            raise QrlInputError(f"{model_path}: its inputs/outputs do not match the sidecar's {self.sidecar['outputs']}")
        self.input_name = input_names[0]
        self.observation_shape = tuple(self.sidecar["observation"]["shape"])
        normalization = self.sidecar["observation"].get("normalization")
        self._mean = self._std = None
        if normalization is not None:
            self._mean = np.asarray(normalization["mean"], np.float32)
            self._std = np.asarray(normalization["std"], np.float32)

    def _load_csr(self, model_path: str, data: bytes) -> tuple[list, list]:
        import onnx

        from qrl.deploy.csr_runtime import CsrProgram

        try:
            model = onnx.load_from_string(data)
            onnx.checker.check_model(model)
        except Exception as error:  # the onnx package raises its own exception types for malformed models.
            raise QrlInputError(f"{model_path} is not a valid ONNX model: {str(error).splitlines()[0]}") from error
        self.session = CsrProgram(model)
        return self.session.input_names, self.session.output_names

    @property
    def precision(self) -> str:
        return self.sidecar["precision"]

    def _prepare(self, observations: Any) -> np.ndarray:
        observations = np.asarray(observations, np.float32)
        if observations.shape[1:] != self.observation_shape:
            raise QrlInputError(f"observations of shape {observations.shape[1:]} given; the policy takes {self.observation_shape}")
        if self._mean is not None:
            observations = (observations - self._mean) / self._std
        return np.ascontiguousarray(observations, np.float32)

    def outputs(self, observations: Any) -> tuple[np.ndarray, np.ndarray]:
        """(actions [B, ...], network outputs [B, ...]) of observations [B, *shape]."""
        actions, outputs = self.session.run(["action", "outputs"], {self.input_name: self._prepare(observations)})
        return actions, outputs

    def __call__(self, observations: Any) -> np.ndarray:
        """Environment actions [B, ...] of observations [B, *shape]."""
        return self.session.run(["action"], {self.input_name: self._prepare(observations)})[0]

    def act(self, observation: Any) -> np.ndarray:
        """The environment action of one observation (no batch axis)."""
        return self(np.asarray(observation, np.float32)[None])[0]


def load_policy(model_path: str, threads: int = 1, runtime: str = "onnxruntime") -> OnnxPolicy:
    """An `OnnxPolicy` for the exported model at `model_path` and its sidecar, run by `runtime`
    (`RUNTIMES`)."""
    return OnnxPolicy(model_path, threads=threads, runtime=runtime)
