"""TD3+BC hyperparameters.

Defaults follow Fujimoto & Gu, "A Minimalist Approach to Offline Reinforcement Learning"
(NeurIPS 2021), section 5 / appendix C and the reference code (github.com/sfujimoto/TD3_BC):
alpha 2.5, TD3's critic update (target smoothing noise 0.2 clipped to 0.5, a policy and target
update every 2 critic updates), Adam 3e-4 for actor and critics, batch 256, tau 0.005, gamma 0.99,
256-256 ReLU networks, observations normalized with the dataset's mean and std. Noise scales are
relative to the action range's half width (the paper's `max_action`).
"""

import dataclasses
from typing import Any, Mapping, Optional

from qrl import config as qrl_config


def validate(config: "Config") -> None:
    """Rejects values that cannot train."""
    qrl_config.check_positive(
        config, ("actor_learning_rate", "critic_learning_rate", "batch_size", "updates_per_call", "policy_delay",
                 "alpha"), "td3_bc",
    )
    qrl_config.check_fraction(config, ("tau",), "td3_bc", low_open=True)
    qrl_config.check_fraction(config, ("gamma",), "td3_bc")
    qrl_config.check_choice(config, "matmul_dtype", qrl_config.MATMUL_DTYPES, "td3_bc")
    qrl_config.check_minimum(config, ("target_policy_noise", "target_noise_clip"), "td3_bc")


@dataclasses.dataclass(frozen=True)
class Config(qrl_config.ConfigMethods, agent="td3_bc", validate=validate):
    """TD3+BC hyperparameters. Periods count gradient updates."""

    hidden_sizes: tuple[int, ...] = (256, 256)  # actor and each critic; Fujimoto & Gu 2021.
    actor_learning_rate: float = 3e-4  # Fujimoto & Gu 2021.
    critic_learning_rate: float = 3e-4  # Fujimoto & Gu 2021.
    batch_size: int = 256  # Fujimoto & Gu 2021.
    alpha: float = 2.5  # lambda = alpha / mean|Q(s, pi(s))|; Fujimoto & Gu 2021.
    tau: float = 0.005  # Polyak rate of the target networks; Fujimoto & Gu 2021.
    gamma: float = 0.99  # Fujimoto & Gu 2021.
    target_policy_noise: float = 0.2  # std of target policy smoothing; Fujimoto & Gu 2021 (TD3's).
    target_noise_clip: float = 0.5  # Fujimoto & Gu 2021 (TD3's).
    policy_delay: int = 2  # critic updates per actor and target update; Fujimoto & Gu 2021.
    normalize_observations: bool = True  # train and act on (obs - mean) / std; Fujimoto & Gu 2021.
    updates_per_call: int = 10  # updates fused per jitted call (K); DESIGN.md §6: K=10 gets most of it.
    matmul_dtype: str = "fp32"  # "bf16": training matmuls in bf16 with fp32 accumulation; params stay fp32.


def config_for(values: Optional[Mapping[str, Any]] = None) -> Config:
    """The defaults with `values` applied (names and types checked), validated."""
    return Config().override(dict(values or {}))
