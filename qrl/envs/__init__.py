"""Environments as `dm_env`, from string ids: `gym:`, `atari:`, `dmc:` (host), `brax:` and `gymnax:` (device).

    env = make("gym:CartPole-v1", seed=0)            # dm_env.Environment
    vec = make_vector("dmc:walker-walk", 8, seed=0)  # 8 host envs, batched numpy, auto-reset
    fn_env = make_brax("halfcheetah", batch_size=128)  # functional brax env for jit/scan loops
    fenv = make_functional("gymnax:CartPole-v1", 128)  # brax or gymnax: pure reset/step, auto-reset

Family modules load on first use, so importing this package is cheap.
"""

from qrl.envs.action_specs import is_discrete, num_actions
from qrl.envs.functional import FunctionalEnv, episode_returns, is_device_id, make_functional
from qrl.envs.ids import DEVICE_FAMILIES, HOST_FAMILIES, KNOWN_FAMILIES
from qrl.envs.registry import make
from qrl.envs.vector import BatchedTimeStep, DeviceBatchVector, VectorEnv, make_host_vector, make_vector


def make_brax(name: str, batch_size: int, episode_length: int = 1000, backend: str = "spring", action_repeat: int = 1):
    """The functional batched brax env `name` (see `qrl.envs.brax.make_brax`); imports brax lazily."""
    from qrl.envs import brax as brax_family

    return brax_family.make_brax(name, batch_size, episode_length, backend, action_repeat)


__all__ = [
    "BatchedTimeStep",
    "DEVICE_FAMILIES",
    "FunctionalEnv",
    "DeviceBatchVector",
    "HOST_FAMILIES",
    "KNOWN_FAMILIES",
    "VectorEnv",
    "episode_returns",
    "is_device_id",
    "is_discrete",
    "make",
    "make_brax",
    "make_functional",
    "make_host_vector",
    "make_vector",
    "num_actions",
]
