"""IQL hyperparameters.

Defaults are the MuJoCo locomotion settings of Kostrikov, Nair, Levine, "Offline Reinforcement
Learning with Implicit Q-Learning" (ICLR 2022), and its reference code
(github.com/ikostrikov/implicit_q_learning, `configs/mujoco_config.py`, `learner.py`,
`train_offline.py`).
"""

import dataclasses
from typing import Any, Mapping, Optional

from qrl import config as qrl_config
from qrl.errors import QrlInputError

ACTOR_LR_SCHEDULES = ("cosine", "constant")
LOG_STD_MIN = -5.0  # the reference's state-independent log-std range (learner.py, policy.py).
LOG_STD_MAX = 2.0


def validate(config: "Config") -> None:
    """Rejects values that cannot train."""
    qrl_config.check_positive(
        config,
        ("actor_learning_rate", "critic_learning_rate", "value_learning_rate", "batch_size", "updates_per_call",
         "max_weight", "reward_scale"),
        "iql",
    )
    qrl_config.check_fraction(config, ("gamma",), "iql")
    qrl_config.check_fraction(config, ("tau",), "iql", low_open=True)
    qrl_config.check_choice(config, "actor_lr_schedule", ACTOR_LR_SCHEDULES, "iql")
    qrl_config.check_choice(config, "matmul_dtype", qrl_config.MATMUL_DTYPES, "iql")
    if not 0.0 < config.expectile < 1.0:
        raise QrlInputError(f"IQL config expectile must be in (0, 1), got {config.expectile}")
    qrl_config.check_minimum(config, ("beta", "actor_lr_decay_steps"), "iql")


@dataclasses.dataclass(frozen=True)
class Config(qrl_config.ConfigMethods, agent="iql", validate=validate):
    """IQL hyperparameters."""

    hidden_sizes: tuple[int, ...] = (256, 256)  # actor, twin critics and value network; Kostrikov et al. 2022.
    actor_learning_rate: float = 3e-4  # Kostrikov et al. 2022.
    critic_learning_rate: float = 3e-4  # Kostrikov et al. 2022.
    value_learning_rate: float = 3e-4  # Kostrikov et al. 2022.
    actor_lr_schedule: str = "cosine"  # reference code: cosine decay of the actor's rate to 0 over the run.
    actor_lr_decay_steps: int = 0  # the cosine's length; 0: `train` sets it to the run's steps.
    batch_size: int = 256  # Kostrikov et al. 2022.
    gamma: float = 0.99  # Kostrikov et al. 2022.
    tau: float = 0.005  # Polyak rate of the target critics; Kostrikov et al. 2022.
    expectile: float = 0.7  # tau of the expectile value loss (locomotion); Kostrikov et al. 2022.
    beta: float = 3.0  # inverse temperature of the advantage weights exp(beta * (Q - V)) (locomotion).
    max_weight: float = 100.0  # advantage weights clipped at this (reference code).
    normalize_rewards: bool = True  # locomotion: `train` sets reward_scale = 1000 / (max - min episode return).
    reward_scale: float = 1.0  # factor on batch rewards (set by `train` when normalize_rewards).
    normalize_observations: bool = False  # the reference does not normalize observations.
    updates_per_call: int = 10  # updates fused per jitted call (K); DESIGN.md §6.
    matmul_dtype: str = "fp32"  # "bf16": training matmuls in bf16 with fp32 accumulation; params stay fp32.


def config_for(values: Optional[Mapping[str, Any]] = None) -> Config:
    """The defaults with `values` applied (names and types checked), validated."""
    return Config().override(dict(values or {}))
