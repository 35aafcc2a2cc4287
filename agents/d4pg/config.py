"""D4PG configuration: defaults from Acme's D4PG, presets for small tasks.

D4PG (Barth-Maron et al., 2018, "Distributed Distributional Deterministic Policy Gradients"):
DDPG with a categorical (C51) critic trained on n-step returns through the L2 projection of
Bellemare et al. (2017). Defaults are Acme's (acme/agents/jax/d4pg/config.py and networks.py):
Adam 1e-4 for actor and critic, batch 256, n-step 5, gamma 0.99, Gaussian exploration sigma 0.3,
a hard target copy every 100 updates, 32 samples per insert (one update of 256 every 8
environment steps), 1,000 transitions before learning, replay 1e6, dq/da clipped to [-1, 1] in
the policy loss, 51 atoms on [-150, 150], actor 300-200 and critic 400-300.
"""

import dataclasses
from typing import Any, Mapping

from qrl import config as qrl_config
from qrl.errors import QrlInputError
from qrl.networks.continuous import ARCHITECTURES


def validate(config: "Config") -> None:
    """Rejects values that cannot train."""
    qrl_config.check_positive(
        config, ("learning_rate", "batch_size", "buffer_size", "train_freq", "gradient_steps",
                 "target_update_period", "n_step"), "d4pg",
    )
    qrl_config.check_fraction(config, ("tau",), "d4pg", low_open=True)
    qrl_config.check_fraction(config, ("gamma",), "d4pg")
    qrl_config.check_choice(config, "matmul_dtype", qrl_config.MATMUL_DTYPES, "d4pg")
    qrl_config.check_qat_fields(config, "d4pg")
    qrl_config.check_minimum(config, ("learning_starts", "exploration_noise", "dqda_clipping", "max_grad_norm"), "d4pg")
    qrl_config.check_choice(config, "architecture", ARCHITECTURES, "d4pg")
    if config.num_atoms < 2:
        raise QrlInputError(f"D4PG config num_atoms must be >= 2, got {config.num_atoms}")
    if not config.v_min < config.v_max:
        raise QrlInputError(f"D4PG config v_min must be below v_max, got {config.v_min} and {config.v_max}")


@dataclasses.dataclass(frozen=True)
class Config(qrl_config.ConfigMethods, agent="d4pg", validate=validate):
    """D4PG hyperparameters. Periods count environment steps unless the name says updates."""

    architecture: str = "default"  # ReLU MLPs; "quarl": QuaRL's ActorQ networks (qrl.networks.continuous.ARCHITECTURES).
    actor_hidden_sizes: tuple[int, ...] = (300, 200)  # Acme make_networks.
    critic_hidden_sizes: tuple[int, ...] = (400, 300)  # Acme make_networks.
    learning_rate: float = 1e-4  # actor and critic; Acme.
    batch_size: int = 256  # Acme.
    buffer_size: int = 1_000_000  # Acme max_replay_size.
    learning_starts: int = 1_000  # Acme min_replay_size (here: uniformly random actions until then).
    train_freq: int = 8  # environment steps per training phase: Acme's 32 samples per insert at batch 256.
    gradient_steps: int = 1  # updates per training phase, fused into one jitted call.
    target_update_period: int = 100  # updates between target updates; Acme.
    tau: float = 1.0  # 1 = hard copy every period (Acme); < 1 = Polyak averaging every period.
    gamma: float = 0.99  # Acme.
    n_step: int = 5  # Acme.
    exploration_noise: float = 0.3  # Gaussian sigma (in half action ranges); Acme's sigma.
    dqda_clipping: float = 1.0  # clip dQ/da in the policy loss (0 = off); Acme clipping=True.
    max_grad_norm: float = 0.0  # clip each network's gradient to this global norm (0 = off; Acme TF clipping=True: 40).
    num_atoms: int = 51  # Acme / Bellemare et al. 2017.
    v_min: float = -150.0  # Acme (DM Control: rewards in [0, 1]).
    v_max: float = 150.0  # Acme.
    matmul_dtype: str = "fp32"  # "bf16": bf16 matmuls with fp32 accumulation; params stay fp32.
    flat_optimizer: bool = False  # Adam on one flat vector: faster with one XLA thread (qrl.runtime).
    qat_bits: int = 0  # quantization-aware training of the actor (0 = off, 2..8).
    quant_delay: int = 0  # updates (gradient steps) of float training before fake quantization; ranges tracked meanwhile.
    qat_backend: str = "qrl"  # "qrl" (fake quant on the int<N> grids) or "aqt" (AQT's fake-quantized matmul).


# Pendulum-v1: rewards lie in [-16.3, 0] per step, so with gamma 0.99 values lie in
# [-16.3 / (1 - 0.99), 0] = [-1627, 0]: the support spans that whole range (a trained policy's
# values sit near the top, a random one's around -600; atoms 33 apart). One update per step with
# Polyak targets and Adam 1e-3 (rl-baselines3-zoo's TD3/DDPG Pendulum rate) learns within the
# 20k steps the zoo gives TD3/DDPG there; exploration 0.1 as theirs.
# InvertedPendulum-v5: reward 1 per step alive, so values lie in [0, 1 / (1 - 0.99)] = [0, 100];
# updates as Pendulum's preset.
# HalfCheetah-v5: rewards up to about 12 per step; [-200, 1200] covers a good policy's values.
PRESETS: dict[str, dict[str, Any]] = {
    "gym:Pendulum-v1": dict(
        v_min=-1650.0, v_max=0.0, learning_rate=1e-3, train_freq=1, gradient_steps=1,
        target_update_period=1, tau=0.005, exploration_noise=0.1,
    ),
    "gym:InvertedPendulum-v5": dict(
        v_min=0.0, v_max=100.0, learning_rate=1e-3, train_freq=1, gradient_steps=1,
        target_update_period=1, tau=0.005, exploration_noise=0.1,
    ),
    "gym:HalfCheetah-v5": dict(v_min=-200.0, v_max=1200.0),
}


def config_for(env_id: str, values: Mapping[str, Any] | None = None) -> Config:
    """Acme's defaults, then the preset for `env_id` if there is one, then `values`.

    `flat_optimizer` follows the process's XLA threading (`qrl.runtime`) unless given.
    """
    return qrl_config.config_for(Config, PRESETS, env_id, values)
