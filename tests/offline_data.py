"""Small offline datasets the pruning and study tests share: noisy swing-up steps on Pendulum in
D4RL format, with reference returns (random -1400, the collected episodes' mean as expert)."""

import jax.numpy as jnp
import numpy as np

from qrl.datasets import collect
from qrl.datasets.writers import write_d4rl_hdf5
from tests.test_bc import ENV_ID, swing_up


def write_swingup_dataset(path, steps: int) -> str:
    """`steps` transitions of the swing-up controller plus N(0, 0.5²) action noise, clipped to ±2."""
    act = lambda params, observations, normal: jnp.clip(swing_up(observations) + 0.5 * normal, -2.0, 2.0)
    transitions, stats = collect.collect_steps(ENV_ID, act, None, steps, seed=0)
    write_d4rl_hdf5(path, transitions, {"env_id": ENV_ID, "ref_min_score": -1400.0,
                                        "ref_max_score": float(np.mean(stats["episode_returns"]))})
    return str(path)
