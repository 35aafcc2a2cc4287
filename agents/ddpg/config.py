"""DDPG configuration: defaults from the paper, presets from rl-baselines3-zoo.

Defaults follow Lillicrap et al. (2016), "Continuous control with deep reinforcement learning",
section 7: Adam 1e-4 for the actor and 1e-3 for the critic with L2 weight decay 1e-2 on the
critic, tau 0.001, gamma 0.99, mini-batches of 64, replay 1e6, two hidden layers of 400 and 300.
Exploration is Gaussian N(0, 0.1) (relative to the action range's half width) rather than the
paper's Ornstein-Uhlenbeck process, as in Fujimoto et al.'s (2018) DDPG and SB3; the first
`learning_starts` steps act uniformly at random (SB3's default 100). `PRESETS` are
rl-baselines3-zoo's tuned values (hyperparams/ddpg.yml and td3.yml's MuJoCo defaults; SB3's DDPG
defaults fill the rest: batch 256, tau 0.005, no weight decay, one learning rate).
"""

import dataclasses
from typing import Any, Mapping

from qrl import config as qrl_config


def validate(config: "Config") -> None:
    """Rejects values that cannot train."""
    qrl_config.check_positive(
        config, ("actor_learning_rate", "critic_learning_rate", "batch_size", "buffer_size", "train_freq",
                 "gradient_steps", "n_step"), "ddpg",
    )
    qrl_config.check_fraction(config, ("tau",), "ddpg", low_open=True)
    qrl_config.check_fraction(config, ("gamma",), "ddpg")
    qrl_config.check_choice(config, "matmul_dtype", qrl_config.MATMUL_DTYPES, "ddpg")
    qrl_config.check_qat_fields(config, "ddpg")
    qrl_config.check_minimum(config, ("learning_starts", "exploration_noise", "critic_l2"), "ddpg")


@dataclasses.dataclass(frozen=True)
class Config(qrl_config.ConfigMethods, agent="ddpg", validate=validate):
    """DDPG hyperparameters. Periods count environment steps."""

    hidden_sizes: tuple[int, ...] = (400, 300)  # actor and critic; Lillicrap et al. 2016.
    actor_learning_rate: float = 1e-4  # Lillicrap et al. 2016.
    critic_learning_rate: float = 1e-3  # Lillicrap et al. 2016.
    critic_l2: float = 1e-2  # L2 weight decay of the critic; Lillicrap et al. 2016.
    batch_size: int = 64  # Lillicrap et al. 2016.
    buffer_size: int = 1_000_000  # Lillicrap et al. 2016.
    learning_starts: int = 100  # uniformly random actions before this step; SB3 default.
    train_freq: int = 1  # environment steps per training phase; Lillicrap et al. 2016.
    gradient_steps: int = 1  # updates per training phase, fused into one jitted call.
    tau: float = 0.001  # Polyak rate of the target networks; Lillicrap et al. 2016.
    gamma: float = 0.99  # Lillicrap et al. 2016.
    n_step: int = 1
    exploration_noise: float = 0.1  # std of the Gaussian added when acting (see above).
    matmul_dtype: str = "fp32"  # "bf16": bf16 matmuls with fp32 accumulation; params stay fp32.
    flat_optimizer: bool = False  # Adam on one flat vector: faster with one XLA thread (qrl.runtime).
    qat_bits: int = 0  # quantization-aware training of the actor (0 = off, 2..8).
    quant_delay: int = 0  # updates (gradient steps) of float training before fake quantization; ranges tracked meanwhile.
    qat_backend: str = "qrl"  # "qrl" (fake quant on the int<N> grids) or "aqt" (AQT's fake-quantized matmul).


_SB3 = dict(batch_size=256, tau=0.005, critic_l2=0.0)  # SB3 DDPG defaults the zoo relies on.

# rl-baselines3-zoo hyperparams/ddpg.yml (Pendulum-v1) and the MuJoCo defaults it shares with
# td3.yml (HalfCheetah-v4 there), on top of SB3's DDPG defaults.
PRESETS: dict[str, dict[str, Any]] = {
    "gym:Pendulum-v1": dict(
        _SB3, gamma=0.98, buffer_size=200_000, learning_starts=10_000, exploration_noise=0.1,
        train_freq=1, gradient_steps=1, actor_learning_rate=1e-3, critic_learning_rate=1e-3,
        hidden_sizes=(400, 300),
    ),
    # InvertedPendulum-v5: the MuJoCo defaults with 1,000 random steps (its episodes end within
    # a few steps at first; 10,000 random steps would be most of a short run's budget).
    "gym:InvertedPendulum-v5": dict(
        _SB3, learning_starts=1_000, exploration_noise=0.1, train_freq=1, gradient_steps=1,
        actor_learning_rate=1e-3, critic_learning_rate=1e-3, hidden_sizes=(400, 300),
    ),
    "gym:HalfCheetah-v5": dict(
        _SB3, learning_starts=10_000, exploration_noise=0.1, train_freq=1, gradient_steps=1,
        actor_learning_rate=1e-3, critic_learning_rate=1e-3, hidden_sizes=(400, 300),
    ),
}


def config_for(env_id: str, values: Mapping[str, Any] | None = None) -> Config:
    """Paper defaults, then the preset for `env_id` if there is one, then `values`.

    `flat_optimizer` follows the process's XLA threading (`qrl.runtime`) unless given.
    """
    return qrl_config.config_for(Config, PRESETS, env_id, values)
