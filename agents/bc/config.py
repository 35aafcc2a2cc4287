"""Behaviour cloning hyperparameters.

Defaults follow the BC baseline of Fujimoto & Gu, "A Minimalist Approach to Offline Reinforcement
Learning" (NeurIPS 2021, the TD3+BC paper): the TD3+BC actor's 256-256 ReLU network, Adam 3e-4,
batch 256. d3rlpy's `BCConfig` differs (Adam 1e-3, batch 100).
"""

import dataclasses
from typing import Any, Mapping, Optional

from qrl import config as qrl_config

LOSSES = ("mse", "gaussian")
LOG_STD_MIN = -5.0  # the Gaussian policy's state-dependent log-std range
LOG_STD_MAX = 2.0


def validate(config: "Config") -> None:
    """Rejects values that cannot train."""
    qrl_config.check_positive(config, ("learning_rate", "batch_size", "updates_per_call"), "bc")
    qrl_config.check_choice(config, "loss", LOSSES, "bc")


@dataclasses.dataclass(frozen=True)
class Config(qrl_config.ConfigMethods, agent="bc", validate=validate):
    """BC hyperparameters."""

    hidden_sizes: tuple[int, ...] = (256, 256)  # Fujimoto & Gu 2021 (the TD3+BC actor).
    learning_rate: float = 3e-4  # Fujimoto & Gu 2021.
    batch_size: int = 256  # Fujimoto & Gu 2021.
    loss: str = "mse"  # "mse": deterministic actor; "gaussian": negative log-likelihood.
    normalize_observations: bool = False  # train and act on (obs - mean) / std of the dataset.
    updates_per_call: int = 10  # updates fused per jitted call (K); DESIGN.md §6: K=10 gets most of it.


def config_for(values: Optional[Mapping[str, Any]] = None) -> Config:
    """The defaults with `values` applied (names and types checked), validated."""
    return Config().override(dict(values or {}))
