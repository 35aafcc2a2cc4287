"""Process-wide JAX settings for host training loops, decided before JAX starts its backend.

Measured on the 2-core CPU machine (DQN, 256-256 MLP, batch 32, one update per call):
- XLA:CPU splits mid-sized elementwise loops (tens of thousands of elements, e.g. Adam on a
  256×256 kernel) across its thread pool, and the hand-offs cost more than they save: with one
  XLA thread and the optimizer on one flat vector an update took ≈360 µs instead of ≈480 µs,
  and DQN trained ≈30% more environment steps per second. With two threads the flat optimizer is
  pathological (≈2.5 ms), so the two go together.
- Convolutional networks are the opposite: a Nature-CNN DQN update took 295 ms with the default
  pool and 660 ms with one thread. Image observations keep the default.
"""

import os
from typing import Optional, Sequence

import jax
from jax._src import xla_bridge

DEFAULT_CACHE = os.path.join(os.path.expanduser("~"), ".cache", "qrl", "jax")


def recommended_xla_threads(observation_shape: Sequence[int]) -> int:
    """1 for vector observations (small MLPs), 0 (one per core) for images `[H, W, C]`."""
    return 0 if len(observation_shape) == 3 else 1


def configure_jax(xla_threads: Optional[int] = None) -> bool:
    """Settings for host loops: synchronous dispatch, a persistent compilation cache and,
    when `xla_threads` > 0, the size of XLA:CPU's thread pool.

    - Synchronous dispatch: a host loop makes one tiny jitted call per environment step, and
      async dispatch costs more than it hides there (≈65 µs -> ≈12 µs per call).
    - The compilation cache (`QRL_JAX_CACHE`, default ~/.cache/qrl/jax) lets a second run of
      the same program skip XLA compilation (first DQN update call: 1.2 s cold, 0.3 s warm).
    - The thread pool size can only be set before JAX creates its CPU backend (brax
      environments, for one, start it when they are made): returns whether the requested size
      is in effect.
    """
    jax.config.update("jax_cpu_enable_async_dispatch", False)
    jax.config.update("jax_compilation_cache_dir", os.environ.get("QRL_JAX_CACHE", DEFAULT_CACHE))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.2)
    if not xla_threads:
        return True
    if xla_bridge.backends_are_initialized():
        return os.environ.get("PJRT_NPROC") == str(xla_threads)
    os.environ["PJRT_NPROC"] = str(xla_threads)  # read by XLA:CPU when the backend starts
    return True


def single_threaded_xla() -> bool:
    """Whether this process asked XLA:CPU for a one-thread pool."""
    return os.environ.get("PJRT_NPROC") == "1"


DEVICE_KINDS = ("cpu", "gpu")


def device_of(kind: str) -> "jax.Device":
    """The first JAX device of `kind` (`DEVICE_KINDS`); a one-line input error when this
    process's JAX has none (a GPU needs `make venv-cuda` on a CUDA machine)."""
    from qrl.errors import QrlInputError

    if kind not in DEVICE_KINDS:
        raise QrlInputError(f"device kind must be one of {', '.join(DEVICE_KINDS)}, got {kind!r}")
    try:
        devices = jax.devices(kind)
    except RuntimeError:
        devices = []
    if not devices:
        platforms = ", ".join(sorted({device.platform for device in jax.devices()}))
        raise QrlInputError(f"JAX sees no {kind} device here (it sees: {platforms}); a GPU learner needs JAX's CUDA "
                            "backend: make venv-cuda on a CUDA machine")
    return devices[0]
