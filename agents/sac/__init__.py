"""Soft Actor-Critic with twin critics and automatic entropy tuning (Haarnoja et al., 2018).

See README.md in this folder for the papers, defaults and deviations.
"""

import jax

from agents.sac import acting, learning
from agents.sac.config import PRESETS, Config, config_for
from agents.sac.learning import TrainState
from agents.sac.training import build, check_env, train
from qrl.networks.continuous import bounds as action_bounds
from qrl.quant.sweep import PolicySpec


def init_state(config: Config, observation_spec, action_spec, seed: int = 0) -> TrainState:
    """A train state shaped like one trained on these specs (to restore checkpoints into)."""
    return learning.init(
        jax.random.PRNGKey(seed), config, int(observation_spec.shape[-1]), action_bounds(action_spec)
    )


def policy_params(state: TrainState) -> dict:
    """The actor's params: what the deterministic policy runs on."""
    return state.actor_params


def policy_spec(config: Config, observation_spec, action_spec) -> PolicySpec:
    """The deterministic policy `scale(tanh(mean))`; divergence is the mean action distance."""
    bounds = action_bounds(action_spec)
    return PolicySpec(
        build_network=lambda precision: learning.policy_network(config, bounds, precision),
        outputs_to_actions=lambda actions: actions,
        divergence="deterministic",
    )


__all__ = [
    "PRESETS", "Config", "TrainState", "acting", "build", "check_env", "config_for", "init_state", "learning",
    "policy_params", "policy_spec", "train",
]
