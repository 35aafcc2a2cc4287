"""DQN configuration: defaults from the papers, presets for small tasks.

Defaults follow Nature DQN (Mnih et al., 2015, "Human-level control through deep reinforcement
learning") with double Q-learning (van Hasselt et al., 2016) and the Adam/Huber settings of
modern re-implementations (CleanRL's dqn_atari: Adam 1e-4, Huber, 0.01 final epsilon over 10%
of training). `PRESETS` hold tuned values for classic-control tasks from rl-baselines3-zoo
(hyperparams/dqn.yml), so runs compare with SB3/sbx at the same hyperparameters, and named
presets (`"<env id>@<name>"`, chosen with the override `preset=<name>`): `gym:CartPole-v1@quarl`
is DQN as QuaRL (Krishnan et al., 2019) trained it.
"""

import dataclasses
from typing import Any, Mapping

from qrl import config as qrl_config
from qrl.errors import QrlInputError

LEARNING_RATE_SCHEDULES = ("constant", "linear")
# "default": `hidden_sizes` ReLU MLP (or the CNN for frames) with the options below; "quarl":
# QuaRL's ActorQ Q-network (actorQ/dqn/utils.py make_networks): a tanh MLP whose last hidden
# layer is linear, Acme's uniform fan-out initialization, a near-zero-initialized head.
ARCHITECTURES = ("default", "quarl")


def validate(config: "Config") -> None:
    """Rejects values that cannot train."""
    qrl_config.check_positive(
        config, ("learning_rate", "adam_eps", "max_grad_norm", "huber_delta", "batch_size", "buffer_size",
                 "train_freq", "gradient_steps", "target_update_period", "n_step"), "dqn",
    )
    qrl_config.check_minimum(config, ("learning_starts",), "dqn")
    qrl_config.check_fraction(
        config, ("exploration_initial_eps", "exploration_final_eps", "exploration_fraction"), "dqn",
    )
    qrl_config.check_choice(config, "learning_rate_schedule", LEARNING_RATE_SCHEDULES, "dqn")
    qrl_config.check_choice(config, "architecture", ARCHITECTURES, "dqn")
    if config.architecture == "quarl" and (config.dueling or config.layer_norm):
        raise QrlInputError("DQN architecture=quarl is QuaRL's plain tanh MLP: it takes neither dueling nor layer_norm")
    qrl_config.check_fraction(config, ("tau",), "dqn", low_open=True)
    qrl_config.check_fraction(config, ("gamma",), "dqn")
    qrl_config.check_qat_fields(config, "dqn")
    if config.separate_value_stream and not config.dueling:
        raise QrlInputError("DQN config separate_value_stream needs dueling=true")


@dataclasses.dataclass(frozen=True)
class Config(qrl_config.ConfigMethods, agent="dqn", validate=validate):
    """DQN hyperparameters. Periods count environment steps unless the name says updates."""

    architecture: str = "default"  # or "quarl" (ARCHITECTURES).
    hidden_sizes: tuple[int, ...] = (256, 256)  # MLP torso; image observations use Nature CNN.
    layer_norm: bool = False  # MLP hidden layers as dense -> LayerNorm (float32) -> ReLU (OpenAI baselines).
    learning_rate: float = 1e-4  # CleanRL dqn_atari (Adam).
    learning_rate_schedule: str = "constant"  # or "linear": decay to 0 over training's updates.
    adam_eps: float = 1e-8
    max_grad_norm: float = 10.0  # SB3 / CleanRL.
    flat_optimizer: bool = False  # Adam on one flat vector: faster with one XLA thread (qrl.runtime).
    huber_delta: float = 1.0  # Mnih et al. 2015 clip the TD error to [-1, 1].
    batch_size: int = 32  # Mnih et al. 2015.
    buffer_size: int = 1_000_000  # Mnih et al. 2015.
    learning_starts: int = 80_000  # CleanRL dqn_atari.
    train_freq: int = 4  # Mnih et al. 2015: one update every 4 agent steps.
    gradient_steps: int = 1  # updates per training phase, fused into one jitted call.
    target_update_period: int = 2_500  # updates; 10k agent steps at train_freq 4 (Mnih et al.).
    tau: float = 1.0  # 1.0 = hard target copy every period; < 1 = Polyak averaging.
    gamma: float = 0.99
    n_step: int = 1
    double_q: bool = True  # van Hasselt et al. 2016.
    dueling: bool = False  # Wang et al. 2016, "Dueling Network Architectures for Deep RL".
    separate_value_stream: bool = False  # dueling V on its own torso, as baselines' dueling MLPs.
    exploration_initial_eps: float = 1.0
    exploration_final_eps: float = 0.01  # CleanRL dqn_atari.
    exploration_fraction: float = 0.10  # of the training steps; CleanRL dqn_atari.
    qat_bits: int = 0  # quantization-aware training of the Q-network at this many bits; 0 = off.
    quant_delay: int = 0  # updates (gradient steps) of float training before fake quantization; ranges tracked meanwhile.
    qat_backend: str = "qrl"  # "qrl" (fake quant on the int<N> grids) or "aqt" (AQT's fake-quantized matmul).


# rl-baselines3-zoo hyperparams/dqn.yml (tuned); target_update_interval=10 env steps there
# syncs the target once per training phase, i.e. every `gradient_steps` updates here; other
# target intervals are converted from environment steps to updates; SB3's gradient_steps=-1
# (one update per environment step) is written out. These presets are not dueling: SB3's DQN
# has no dueling head, and they exist to compare with SB3/sbx at identical settings.
#
# "gym:CartPole-v1@quarl" is the network and hyperparameters of QuaRL's CartPole DQN. QuaRL
# quantized rl-baselines-zoo's (stable-baselines 2) trained agents: hyperparams/dqn.yml
# CartPole-v1 (policy CustomDQNPolicy, 1e5 steps, learning rate 1e-3, buffer 50k, exploration
# to 0.02 over 10%, prioritized replay) with stable-baselines' DQN defaults for the rest (batch
# 32, one update per step after 1000 steps, target copied every 500 steps, gamma 0.99, double Q,
# Adam, Huber, gradient norm clipped at 10). CustomDQNPolicy (utils/utils.py) is stable-baselines'
# deepq FeedForwardPolicy with layers=[64], layer_norm=True and its default dueling=True, whose
# state value has its own 64-unit stream: it is dueling because QuaRL's network was, and a
# dueling head also keeps the action gap in its own small-valued layer, which quantizes better.
# Not reproduced: prioritized replay (qrl's host loop replays uniformly).
PRESETS: dict[str, dict[str, Any]] = {
    "gym:CartPole-v1": dict(
        learning_rate=2.3e-3, batch_size=64, buffer_size=100_000, learning_starts=1_000,
        train_freq=256, gradient_steps=128, target_update_period=128,
        exploration_fraction=0.16, exploration_final_eps=0.04, hidden_sizes=(256, 256), dueling=False,
    ),
    "gym:CartPole-v1@quarl": dict(
        hidden_sizes=(64,), layer_norm=True, dueling=True, separate_value_stream=True,
        learning_rate=1e-3, batch_size=32, buffer_size=50_000, learning_starts=1_000,
        train_freq=1, gradient_steps=1, target_update_period=500,
        exploration_fraction=0.1, exploration_final_eps=0.02,
    ),
    "gym:MountainCar-v0": dict(
        learning_rate=4e-3, batch_size=128, buffer_size=10_000, learning_starts=1_000, gamma=0.98,
        train_freq=16, gradient_steps=8, target_update_period=300,
        exploration_fraction=0.2, exploration_final_eps=0.07, hidden_sizes=(256, 256), dueling=False,
    ),
    "gym:Acrobot-v1": dict(
        learning_rate=6.3e-4, batch_size=128, buffer_size=50_000, learning_starts=0,
        train_freq=4, gradient_steps=4, target_update_period=250,
        exploration_fraction=0.12, exploration_final_eps=0.1, hidden_sizes=(256, 256), dueling=False,
    ),
}
# gymnax's CartPole-v1 is the same task (dynamics, reward, 500-step limit), trained on device.
PRESETS["gymnax:CartPole-v1"] = PRESETS["gym:CartPole-v1"]


def config_for(env_id: str, values: Mapping[str, Any] | None = None) -> Config:
    """Paper defaults, then the preset for `env_id` if there is one (the named preset
    `"<env_id>@<name>"` when `values` hold `preset=<name>`), then `values`.

    `flat_optimizer` follows the process's XLA threading (`qrl.runtime`) unless given.
    """
    return qrl_config.config_for(Config, PRESETS, env_id, values)
