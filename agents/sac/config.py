"""SAC configuration: defaults from the paper, presets from rl-baselines3-zoo.

Defaults follow Haarnoja et al. (2018b), "Soft Actor-Critic Algorithms and Applications"
(arXiv:1812.05905), table 1: Adam 3e-4 for actor, critics and temperature, batch 256, replay
1e6, two hidden layers of 256, tau 0.005, gamma 0.99, one gradient step per environment step,
target entropy -dim(A) with automatic temperature tuning. `learning_starts` is SB3's / sbx's
default (100). `PRESETS` are rl-baselines3-zoo's tuned values (hyperparams/sac.yml), so runs
compare with SB3 / sbx at the same hyperparameters.
"""

import dataclasses
from typing import Any, Mapping

from qrl import config as qrl_config


def validate(config: "Config") -> None:
    """Rejects values that cannot train."""
    qrl_config.check_positive(
        config, ("learning_rate", "batch_size", "buffer_size", "train_freq", "gradient_steps", "n_step",
                 "initial_alpha"), "sac",
    )
    qrl_config.check_fraction(config, ("tau",), "sac", low_open=True)
    qrl_config.check_fraction(config, ("gamma",), "sac")
    qrl_config.check_choice(config, "matmul_dtype", qrl_config.MATMUL_DTYPES, "sac")
    qrl_config.check_qat_fields(config, "sac")
    qrl_config.check_minimum(config, ("learning_starts",), "sac")


@dataclasses.dataclass(frozen=True)
class Config(qrl_config.ConfigMethods, agent="sac", validate=validate):
    """SAC hyperparameters. Periods count environment steps."""

    hidden_sizes: tuple[int, ...] = (256, 256)  # actor and each critic; Haarnoja et al. 2018b.
    learning_rate: float = 3e-4  # actor, critics and temperature; Haarnoja et al. 2018b.
    batch_size: int = 256  # Haarnoja et al. 2018b.
    buffer_size: int = 1_000_000  # Haarnoja et al. 2018b.
    learning_starts: int = 100  # uniformly random actions before this step; SB3 / sbx default.
    train_freq: int = 1  # environment steps per training phase; Haarnoja et al. 2018b.
    gradient_steps: int = 1  # updates per training phase, fused into one jitted call.
    tau: float = 0.005  # Polyak rate of the target critics; Haarnoja et al. 2018b.
    gamma: float = 0.99
    n_step: int = 1
    initial_alpha: float = 1.0  # SB3 / sbx ent_coef="auto" starts the temperature at 1.
    target_entropy_per_dim: float = -1.0  # target entropy = this * dim(A); Haarnoja et al. 2018b.
    matmul_dtype: str = "fp32"  # "bf16": bf16 matmuls with fp32 accumulation; params stay fp32.
    flat_optimizer: bool = False  # Adam on one flat vector: faster with one XLA thread (qrl.runtime).
    qat_bits: int = 0  # quantization-aware training of the actor (0 = off, 2..8).
    quant_delay: int = 0  # updates (gradient steps) of float training before fake quantization; ranges tracked meanwhile.
    qat_backend: str = "qrl"  # "qrl" (fake quant on the int<N> grids) or "aqt" (AQT's fake-quantized matmul).


# rl-baselines3-zoo hyperparams/sac.yml: Pendulum-v1 changes only the learning rate; the MuJoCo
# defaults (HalfCheetah-v3/v4 there) only learning_starts.
PRESETS: dict[str, dict[str, Any]] = {
    "gym:Pendulum-v1": dict(learning_rate=1e-3),
    "gym:HalfCheetah-v5": dict(learning_starts=10_000),
}


def config_for(env_id: str, values: Mapping[str, Any] | None = None) -> Config:
    """Paper defaults, then the preset for `env_id` if there is one, then `values`.

    `flat_optimizer` follows the process's XLA threading (`qrl.runtime`) unless given.
    """
    return qrl_config.config_for(Config, PRESETS, env_id, values)
