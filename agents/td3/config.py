"""TD3 configuration: defaults from the paper, presets from rl-baselines3-zoo.

Defaults follow Fujimoto et al. (2018), "Addressing Function Approximation Error in Actor-Critic
Methods", section 6.1 / appendix C: Adam 1e-3 for actor and critics, mini-batches of 100, two
hidden layers of 400 and 300, tau 0.005, gamma 0.99, exploration noise N(0, 0.1), target policy
smoothing noise N(0, 0.2) clipped to [-0.5, 0.5], a policy (and target) update every 2 critic
updates, and 1,000 uniformly random steps before learning (10,000 for HalfCheetah and Ant).
Noise scales are relative to the action range's half width (the paper's tasks have [-1, 1]).
`PRESETS` are rl-baselines3-zoo's tuned values (hyperparams/td3.yml; SB3's own defaults fill the
rest: batch 256, tau 0.005), so runs compare with SB3 / sbx at the same hyperparameters.
"""

import dataclasses
from typing import Any, Mapping

from qrl import config as qrl_config


def validate(config: "Config") -> None:
    """Rejects values that cannot train."""
    qrl_config.check_positive(
        config, ("learning_rate", "batch_size", "buffer_size", "train_freq", "gradient_steps", "n_step",
                 "policy_delay"), "td3",
    )
    qrl_config.check_fraction(config, ("tau",), "td3", low_open=True)
    qrl_config.check_fraction(config, ("gamma",), "td3")
    qrl_config.check_choice(config, "matmul_dtype", qrl_config.MATMUL_DTYPES, "td3")
    qrl_config.check_qat_fields(config, "td3")
    qrl_config.check_minimum(
        config, ("learning_starts", "exploration_noise", "target_policy_noise", "target_noise_clip"), "td3",
    )


@dataclasses.dataclass(frozen=True)
class Config(qrl_config.ConfigMethods, agent="td3", validate=validate):
    """TD3 hyperparameters. Periods count environment steps unless the name says updates."""

    hidden_sizes: tuple[int, ...] = (400, 300)  # actor and each critic; Fujimoto et al. 2018.
    learning_rate: float = 1e-3  # actor and critics; Fujimoto et al. 2018.
    batch_size: int = 100  # Fujimoto et al. 2018.
    buffer_size: int = 1_000_000  # Fujimoto et al. 2018.
    learning_starts: int = 1_000  # uniformly random actions before this step; Fujimoto et al. 2018.
    train_freq: int = 1  # environment steps per training phase.
    gradient_steps: int = 1  # updates per training phase, fused into one jitted call.
    tau: float = 0.005  # Polyak rate of the target networks; Fujimoto et al. 2018.
    gamma: float = 0.99
    n_step: int = 1
    exploration_noise: float = 0.1  # std of the Gaussian added when acting; Fujimoto et al. 2018.
    target_policy_noise: float = 0.2  # std of target policy smoothing; Fujimoto et al. 2018.
    target_noise_clip: float = 0.5  # Fujimoto et al. 2018.
    policy_delay: int = 2  # critic updates per actor and target update; Fujimoto et al. 2018.
    matmul_dtype: str = "fp32"  # "bf16": bf16 matmuls with fp32 accumulation; params stay fp32.
    flat_optimizer: bool = False  # Adam on one flat vector: faster with one XLA thread (qrl.runtime).
    qat_bits: int = 0  # quantization-aware training of the actor (0 = off, 2..8).
    quant_delay: int = 0  # updates (gradient steps) of float training before fake quantization; ranges tracked meanwhile.
    qat_backend: str = "qrl"  # "qrl" (fake quant on the int<N> grids) or "aqt" (AQT's fake-quantized matmul).


# rl-baselines3-zoo hyperparams/td3.yml (Pendulum-v1; the MuJoCo defaults, listed there for
# HalfCheetah-v4) with SB3's TD3 defaults for what the zoo leaves out (batch 256, tau 0.005).
PRESETS: dict[str, dict[str, Any]] = {
    "gym:Pendulum-v1": dict(
        gamma=0.98, buffer_size=200_000, learning_starts=10_000, exploration_noise=0.1,
        train_freq=1, gradient_steps=1, learning_rate=1e-3, hidden_sizes=(400, 300), batch_size=256,
    ),
    # InvertedPendulum-v5: the MuJoCo defaults with 1,000 random steps (as DDPG's preset).
    "gym:InvertedPendulum-v5": dict(
        learning_starts=1_000, exploration_noise=0.1, train_freq=1, gradient_steps=1,
        learning_rate=1e-3, batch_size=256, hidden_sizes=(400, 300),
    ),
    "gym:HalfCheetah-v5": dict(
        learning_starts=10_000, exploration_noise=0.1, train_freq=1, gradient_steps=1,
        learning_rate=1e-3, batch_size=256, hidden_sizes=(400, 300),
    ),
}


def config_for(env_id: str, values: Mapping[str, Any] | None = None) -> Config:
    """Paper defaults, then the preset for `env_id` if there is one, then `values`.

    `flat_optimizer` follows the process's XLA threading (`qrl.runtime`) unless given.
    """
    return qrl_config.config_for(Config, PRESETS, env_id, values)
