"""PPO configuration: defaults from the paper, presets for small tasks.

Defaults follow Schulman et al. 2017, "Proximal Policy Optimization Algorithms", Table 3
(MuJoCo: horizon 2048, Adam 3e-4, 10 epochs, minibatch 64, γ 0.99, λ 0.95, ε 0.2, one actor,
64-64 tanh networks) with Stable-Baselines3's PPO details (Adam eps 1e-5, gradient-norm
clipping 0.5, value coefficient 0.5, per-minibatch advantage normalization, orthogonal
initialization). `PRESETS` hold rl-baselines3-zoo's tuned values (hyperparams/ppo.yml) for
gymnasium tasks and PureJaxRL's defaults (purejaxrl/ppo.py) for gymnax CartPole.
"""

import dataclasses
from typing import Any, Mapping

from qrl import config as qrl_config
from qrl.errors import QrlInputError

SCHEDULES = ("constant", "linear")
ACTIVATIONS = ("tanh", "relu")


def validate(config: "Config") -> None:
    """Rejects values that cannot train."""
    qrl_config.check_positive(
        config, ("num_envs", "num_steps", "batch_size", "num_epochs", "learning_rate", "adam_eps",
                 "max_grad_norm", "clip_range"), "ppo",
    )
    qrl_config.check_fraction(config, ("gamma", "gae_lambda"), "ppo")
    qrl_config.check_choice(config, "learning_rate_schedule", SCHEDULES, "ppo")
    qrl_config.check_choice(config, "clip_range_schedule", SCHEDULES, "ppo")
    qrl_config.check_choice(config, "activation", ACTIVATIONS, "ppo")
    qrl_config.check_minimum(config, ("clip_range_vf", "ent_coef", "vf_coef"), "ppo")
    if config.batch_size > config.rollout_size:
        raise QrlInputError(
            f"PPO config batch_size {config.batch_size} exceeds a rollout of num_steps x num_envs = "
            f"{config.num_steps} x {config.num_envs} = {config.rollout_size} transitions"
        )
    qrl_config.check_qat_fields(config, "ppo")


@dataclasses.dataclass(frozen=True)
class Config(qrl_config.ConfigMethods, agent="ppo", validate=validate):
    """PPO hyperparameters. One iteration collects `num_steps` steps of `num_envs` envs."""

    num_envs: int = 1  # Schulman et al. 2017 MuJoCo: one actor (SB3 n_envs=1).
    num_steps: int = 2048  # horizon T per env and iteration (paper, MuJoCo).
    batch_size: int = 64  # minibatch size (paper, MuJoCo); num_steps * num_envs // batch_size minibatches.
    num_epochs: int = 10  # passes over each rollout (paper, MuJoCo).
    learning_rate: float = 3e-4  # Adam stepsize (paper, MuJoCo).
    learning_rate_schedule: str = "constant"  # or "linear": to 0 over the run (paper's Atari α, zoo lin_).
    adam_eps: float = 1e-5  # SB3 / PureJaxRL.
    max_grad_norm: float = 0.5  # SB3 / PureJaxRL.
    gamma: float = 0.99  # paper.
    gae_lambda: float = 0.95  # paper.
    clip_range: float = 0.2  # ε (paper).
    clip_range_schedule: str = "constant"  # or "linear" (paper's Atari ε = 0.1·α; zoo lin_0.2).
    clip_range_vf: float = 0.0  # value clipping ε (baselines ppo2, PureJaxRL); 0 = off (SB3 None).
    normalize_advantage: bool = True  # per minibatch (SB3, PureJaxRL).
    ent_coef: float = 0.0  # c2 (paper MuJoCo: 0; Atari: 0.01).
    vf_coef: float = 0.5  # c1 on ½(v−G)² (SB3 0.5; separate networks make it matter only via clipping).
    hidden_sizes: tuple[int, ...] = (64, 64)  # paper: two hidden layers of 64 units; Nature CNN for images.
    activation: str = "tanh"  # paper / SB3 / PureJaxRL.
    log_std_init: float = 0.0  # state-independent Gaussian log-std at start (SB3).
    flat_optimizer: bool = False  # Adam on one flat vector: faster with one XLA thread (qrl.runtime).
    qat_bits: int = 0  # quantization-aware training of the actor at this many bits; 0 = off.
    quant_delay: int = 0  # updates (gradient steps) of float training before fake quantization; ranges tracked meanwhile.
    qat_backend: str = "qrl"  # "qrl" (fake quant on the int<N> grids) or "aqt" (AQT's fake-quantized matmul).

    @property
    def rollout_size(self) -> int:
        return self.num_steps * self.num_envs

    @property
    def num_minibatches(self) -> int:
        return self.rollout_size // self.batch_size


PRESETS: dict[str, dict[str, Any]] = {
    # rl-baselines3-zoo hyperparams/ppo.yml (1e5 steps); lin_X = linear decay from X to 0.
    "gym:CartPole-v1": dict(
        num_envs=8, num_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98, num_epochs=20, ent_coef=0.0,
        learning_rate=1e-3, learning_rate_schedule="linear", clip_range=0.2, clip_range_schedule="linear",
    ),
    # rl-baselines3-zoo hyperparams/ppo.yml (1e5 steps), without its gSDE exploration (use_sde).
    "gym:Pendulum-v1": dict(
        num_envs=4, num_steps=1024, gae_lambda=0.95, gamma=0.9, num_epochs=10, ent_coef=0.0,
        learning_rate=1e-3, clip_range=0.2,
    ),
    # PureJaxRL purejaxrl/ppo.py defaults (5e5 steps): 4 envs x 128 steps, 4 epochs of 4 minibatches,
    # annealed LR 2.5e-4, entropy 0.01, value clipping at CLIP_EPS.
    "gymnax:CartPole-v1": dict(
        num_envs=4, num_steps=128, batch_size=128, num_epochs=4, learning_rate=2.5e-4,
        learning_rate_schedule="linear", gamma=0.99, gae_lambda=0.95, clip_range=0.2, clip_range_vf=0.2,
        ent_coef=0.01, vf_coef=0.5, max_grad_norm=0.5,
    ),
    # Schulman et al. 2017's Atari settings (Table 5: 128-step rollouts, 4 epochs, entropy 0.01,
    # annealed Adam 2.5e-4, clipping 0.1 annealed) with 16 envs and 4 minibatches for MinAtar's
    # 10×10 frames (Young & Tian 2019), whose episodes are short and rewards frequent.
    "gymnax:Breakout-MinAtar": dict(
        num_envs=16, num_steps=128, batch_size=512, num_epochs=4, learning_rate=2.5e-4,
        learning_rate_schedule="linear", gamma=0.99, gae_lambda=0.95, clip_range=0.1,
        clip_range_schedule="linear", ent_coef=0.01, vf_coef=0.5, max_grad_norm=0.5, activation="relu",
    ),
}


def config_for(env_id: str, values: Mapping[str, Any] | None = None) -> Config:
    """Paper defaults, then the preset for `env_id` if there is one, then `values`.

    `flat_optimizer` follows the process's XLA threading (`qrl.runtime`) unless given.
    """
    return qrl_config.config_for(Config, PRESETS, env_id, values)
