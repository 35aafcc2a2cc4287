"""Proximal Policy Optimization (clipped surrogate, GAE, minibatch epochs), discrete and continuous.

See README.md in this folder for the paper, defaults and deviations.
"""

import jax

from agents.ppo import acting, learning, networks
from agents.ppo.config import PRESETS, Config, config_for
from agents.ppo.training import AGENT, check_env, make_train, train
from qrl import envs
from qrl.onpolicy import PolicyHead, TrainState
from qrl.quant.sweep import PolicySpec


def init_state(config: Config, observation_spec, action_spec, seed: int = 0) -> TrainState:
    """A train state shaped like one trained on these specs (to restore checkpoints into)."""
    return learning.init(jax.random.PRNGKey(seed), config, observation_spec, action_spec)


def policy_params(state: TrainState) -> dict:
    """The actor's params: what the deployed policy runs on."""
    return state.params["actor"]


def policy_spec(config: Config, observation_spec, action_spec) -> PolicySpec:
    """Logits -> argmax (divergence on softmax(logits)), or Gaussian mean -> clipped action."""
    return PolicySpec(
        build_network=lambda precision: networks.make_actor(config, observation_spec, action_spec, precision),
        outputs_to_actions=PolicyHead.from_spec(action_spec).greedy,
        divergence="categorical" if envs.is_discrete(action_spec) else "deterministic",
    )


__all__ = [
    "AGENT", "PRESETS", "Config", "TrainState", "acting", "check_env", "config_for", "init_state", "learning",
    "make_train", "networks", "policy_params", "policy_spec", "train",
]
