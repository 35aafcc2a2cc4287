"""BCQ hyperparameters.

Defaults follow Fujimoto, Meger, Precup, "Off-Policy Deep Reinforcement Learning without
Exploration" (ICML 2019), and its reference code (github.com/sfujim/BCQ, `continuous_BCQ`,
`BCQ.py`, `main.py`): a 750-750 VAE with latent size 2 * action_dim, a 400-300 perturbation
actor with phi 0.05, twin 400-300 critics, lambda 0.75, 10 sampled actions per next state in the
target and 100 when acting, Adam 1e-3 for all three networks, batch 100, tau 0.005, gamma 0.99,
no observation normalization.
"""

import dataclasses
from typing import Any, Mapping, Optional

from qrl import config as qrl_config
from qrl.errors import QrlInputError

LOG_STD_MIN = -4.0  # the reference VAE's clamp of the latent log-std.
LOG_STD_MAX = 15.0


def validate(config: "Config") -> None:
    """Rejects values that cannot train."""
    qrl_config.check_positive(
        config,
        ("actor_learning_rate", "critic_learning_rate", "vae_learning_rate", "batch_size", "updates_per_call",
         "target_samples", "acting_samples", "latent_clip"),
        "bcq",
    )
    qrl_config.check_fraction(config, ("gamma", "lmbda"), "bcq")
    qrl_config.check_fraction(config, ("tau",), "bcq", low_open=True)
    qrl_config.check_choice(config, "target_matmul_dtype", qrl_config.MATMUL_DTYPES, "bcq")
    qrl_config.check_choice(config, "matmul_dtype", qrl_config.MATMUL_DTYPES, "bcq")
    if not 0.0 <= config.phi <= 1.0:
        raise QrlInputError(f"BCQ config phi must be in [0, 1], got {config.phi}")
    if config.latent_size < 0:
        raise QrlInputError(f"BCQ config latent_size must be >= 0 (0: 2 * action size), got {config.latent_size}")


@dataclasses.dataclass(frozen=True)
class Config(qrl_config.ConfigMethods, agent="bcq", validate=validate):
    """BCQ hyperparameters. Actions inside the networks are in `[-1, 1]` ("unit" actions)."""

    vae_hidden_sizes: tuple[int, ...] = (750, 750)  # encoder and decoder each; Fujimoto et al. 2019.
    actor_hidden_sizes: tuple[int, ...] = (400, 300)  # perturbation model; Fujimoto et al. 2019.
    critic_hidden_sizes: tuple[int, ...] = (400, 300)  # each twin critic; Fujimoto et al. 2019.
    latent_size: int = 0  # 0: 2 * action size (reference code).
    latent_clip: float = 0.5  # decoder latents N(0, 1) clipped to +-this when generating (reference code).
    phi: float = 0.05  # perturbation bound, in half action ranges; Fujimoto et al. 2019.
    lmbda: float = 0.75  # soft clipped double Q: lmbda * min + (1 - lmbda) * max; Fujimoto et al. 2019.
    target_samples: int = 10  # sampled actions per next state in the target; Fujimoto et al. 2019.
    acting_samples: int = 100  # sampled actions per state when acting; Fujimoto et al. 2019.
    actor_learning_rate: float = 1e-3  # reference code.
    critic_learning_rate: float = 1e-3  # reference code.
    vae_learning_rate: float = 1e-3  # reference code (torch Adam's default).
    batch_size: int = 100  # reference code.
    tau: float = 0.005  # Polyak rate of the target actor and critics; reference code.
    gamma: float = 0.99  # reference code.
    normalize_observations: bool = False  # the reference does not normalize observations.
    target_matmul_dtype: str = "fp32"  # "bf16": the sampled target and acting passes in bf16 (fp32 accumulation).
    matmul_dtype: str = "fp32"  # "bf16": the VAE, critic and actor gradient passes in bf16; params stay fp32.
    acting_seed: int = 0  # the fixed key of the deterministic policy's candidate sampling.
    updates_per_call: int = 10  # updates fused per jitted call (K); DESIGN.md §6.


def config_for(values: Optional[Mapping[str, Any]] = None) -> Config:
    """The defaults with `values` applied (names and types checked), validated."""
    return Config().override(dict(values or {}))
