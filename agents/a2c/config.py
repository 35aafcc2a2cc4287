"""A2C configuration: defaults from the paper, presets for small tasks.

Defaults follow the synchronous advantage actor-critic of Mnih et al. 2016, "Asynchronous
Methods for Deep Reinforcement Learning" (t_max = 5 steps per update, 16 actor-learners,
RMSProp with decay 0.99, entropy β = 0.01, γ 0.99, n-step returns = GAE with λ = 1) with
Stable-Baselines3's A2C details (learning rate 7e-4, RMSProp eps 1e-5, value coefficient 0.5,
gradient-norm clipping 0.5, 64-64 tanh networks). `PRESETS` hold rl-baselines3-zoo's tuned
values (hyperparams/a2c.yml).
"""

import dataclasses
from typing import Any, Mapping

from qrl import config as qrl_config

SCHEDULES = ("constant", "linear")
ACTIVATIONS = ("tanh", "relu")


def validate(config: "Config") -> None:
    """Rejects values that cannot train."""
    qrl_config.check_positive(
        config, ("num_envs", "num_steps", "learning_rate", "rmsprop_eps", "max_grad_norm"), "a2c",
    )
    qrl_config.check_fraction(config, ("gamma", "gae_lambda", "rmsprop_decay"), "a2c")
    qrl_config.check_choice(config, "learning_rate_schedule", SCHEDULES, "a2c")
    qrl_config.check_choice(config, "activation", ACTIVATIONS, "a2c")
    qrl_config.check_minimum(config, ("ent_coef", "vf_coef"), "a2c")
    qrl_config.check_qat_fields(config, "a2c")


@dataclasses.dataclass(frozen=True)
class Config(qrl_config.ConfigMethods, agent="a2c", validate=validate):
    """A2C hyperparameters. One update per `num_steps` steps of `num_envs` envs."""

    num_envs: int = 16  # Mnih et al. 2016: 16 actor-learner threads.
    num_steps: int = 5  # t_max (paper; SB3 n_steps).
    learning_rate: float = 7e-4  # SB3 / OpenAI baselines A2C.
    learning_rate_schedule: str = "constant"  # SB3; or "linear" to 0 over the run (zoo Atari lin_7e-4).
    rmsprop_decay: float = 0.99  # α (paper; SB3).
    rmsprop_eps: float = 1e-5  # SB3 / baselines (added to the root, as torch's RMSprop).
    max_grad_norm: float = 0.5  # SB3 / baselines.
    gamma: float = 0.99  # paper.
    gae_lambda: float = 1.0  # 1 = the paper's n-step returns (SB3 default).
    normalize_advantage: bool = False  # SB3 default.
    ent_coef: float = 0.01  # β (paper); SB3's default is 0.
    vf_coef: float = 0.5  # SB3 / baselines, on ½(v−G)².
    hidden_sizes: tuple[int, ...] = (64, 64)  # SB3 MlpPolicy; Nature CNN for images.
    activation: str = "tanh"  # SB3.
    log_std_init: float = 0.0  # state-independent Gaussian log-std at start (SB3).
    flat_optimizer: bool = False  # RMSProp on one flat vector: faster with one XLA thread (qrl.runtime).
    qat_bits: int = 0  # quantization-aware training of the actor at this many bits; 0 = off.
    quant_delay: int = 0  # updates (gradient steps) of float training before fake quantization; ranges tracked meanwhile.
    qat_backend: str = "qrl"  # "qrl" (fake quant on the int<N> grids) or "aqt" (AQT's fake-quantized matmul).


PRESETS: dict[str, dict[str, Any]] = {
    # rl-baselines3-zoo hyperparams/a2c.yml (5e5 steps): SB3 defaults otherwise.
    "gym:CartPole-v1": dict(num_envs=8, ent_coef=0.0),
    "gymnax:CartPole-v1": dict(num_envs=8, ent_coef=0.0),  # the same task in gymnax: the zoo's values.
}


def config_for(env_id: str, values: Mapping[str, Any] | None = None) -> Config:
    """Paper defaults, then the preset for `env_id` if there is one, then `values`.

    `flat_optimizer` follows the process's XLA threading (`qrl.runtime`) unless given.
    """
    return qrl_config.config_for(Config, PRESETS, env_id, values)
