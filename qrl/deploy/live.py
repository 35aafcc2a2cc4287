"""Policies whose weights change while they run: an actor's policy in JAX or in ONNX Runtime.

    backend = policy_backend("onnx", agent.policy(precision), params, observation_spec)
    runtime_params = backend.prepare(new_params)      # each weight update: no re-export
    actions = backend(runtime_params, observations)   # [N, ...] -> actions [N, ...] (numpy)

Both backends take the numpy params tree `qrl.distributed.weights.load` makes and compute the
same function. `jax` jits the policy and puts each update on the device. `onnx` exports the
policy once per network precision with its parameters as graph inputs
(`to_onnx_with_parameters`): an update runs the jitted parameter-only part (dequantizing scales,
a kernel's column sums) once and hands ONNX Runtime the resulting arrays, which its CPU provider
reads in place; the graph, its optimizations and the session are built once.
"""

from typing import Any, Callable

import jax
import numpy as np

from qrl.deploy.onnx_graph import to_onnx_with_parameters
from qrl.deploy.policy import session_from_bytes
from qrl.errors import QrlInputError

BACKENDS = ("jax", "onnx")


class JaxPolicyBackend:
    """`policy(params, observations)` jitted on the CPU (where actors run, whatever accelerator
    the process also sees); `prepare` puts params there."""

    def __init__(self, policy: Callable[[Any, Any], Any]):
        self._policy = jax.jit(policy)
        self._device = jax.devices("cpu")[0]

    def prepare(self, params: Any) -> Any:
        return jax.block_until_ready(jax.device_put(params, self._device))

    def __call__(self, params: Any, observations: np.ndarray) -> np.ndarray:
        return np.asarray(self._policy(params, observations))


class OnnxPolicyBackend:
    """`policy(params, observations)` as an ONNX Runtime session with the params as inputs,
    built from a template of the params' shapes and dtypes (`threads` intra-op threads)."""

    def __init__(self, policy: Callable[[Any, Any], Any], template_params: Any, observation_shape, observation_dtype,
                 threads: int = 1):
        self._observation_dtype = np.dtype(jax.numpy.asarray(np.zeros((), observation_dtype)).dtype)
        model, self._prepare = to_onnx_with_parameters(policy, template_params, tuple(observation_shape), ["action"],
                                                       self._observation_dtype)
        self.model_bytes = model.ByteSize()
        self.session = session_from_bytes(model.SerializeToString(), threads)
        self._structure = jax.tree.structure(template_params)
        self._shapes = [(np.shape(leaf), np.asarray(leaf).dtype) for leaf in jax.tree.leaves(template_params)]

    def prepare(self, params: Any) -> dict:
        """The session's parameter feeds for `params` (same structure, shapes and dtypes as the
        template; anything else is an input error: the graph was built for those)."""
        leaves = jax.tree.leaves(params)
        if jax.tree.structure(params) != self._structure or [(np.shape(leaf), np.asarray(leaf).dtype) for leaf in leaves] != self._shapes:
            raise QrlInputError("these weights do not fit the exported policy's parameter shapes and dtypes")
        return {name: np.ascontiguousarray(value) for name, value in self._prepare(params).items()}

    def __call__(self, feeds: dict, observations: np.ndarray) -> np.ndarray:
        return self.session.run(["action"], {**feeds, "observation": np.asarray(observations, self._observation_dtype)})[0]


def policy_backend(backend: str, policy: Callable[[Any, Any], Any], template_params: Any, observation_shape,
                   observation_dtype, threads: int = 1):
    """The `backend` (`BACKENDS`) running `policy(params, observations)`."""
    if backend == "jax":
        return JaxPolicyBackend(policy)
    if backend == "onnx":
        return OnnxPolicyBackend(policy, template_params, observation_shape, observation_dtype, threads)
    raise QrlInputError(f"unknown actor runtime {backend!r}; known: {', '.join(BACKENDS)}")
