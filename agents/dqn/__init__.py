"""Double DQN with target network, epsilon-greedy exploration, n-step returns, uniform replay.

See README.md in this folder for the papers, defaults and deviations.
"""

import jax
import jax.numpy as jnp

from agents.dqn import acting, learning
from agents.dqn.config import PRESETS, Config, config_for
from agents.dqn.learning import TrainState
from agents.dqn.training import check_config, check_env, train
from qrl import envs
from qrl.quant.sweep import PolicySpec


def init_state(config: Config, observation_spec, action_spec, seed: int = 0) -> TrainState:
    """A train state shaped like one trained on these specs (to restore checkpoints into)."""
    return learning.init(
        jax.random.PRNGKey(seed), config, tuple(observation_spec.shape), observation_spec.dtype,
        envs.num_actions(action_spec),
    )


def policy_params(state: TrainState) -> dict:
    """The online Q-network's params: what the policy runs on."""
    return state.params


def policy_spec(config: Config, observation_spec, action_spec) -> PolicySpec:
    """Greedy policy over Q-values; divergence is measured on softmax(Q) (QuaRL's KL)."""
    shape, num_actions = tuple(observation_spec.shape), envs.num_actions(action_spec)
    return PolicySpec(
        build_network=lambda precision: learning.make_network(config, shape, num_actions, precision),
        outputs_to_actions=lambda q_values: jnp.argmax(q_values, axis=-1).astype(jnp.int32),
        divergence="categorical",
    )


__all__ = [
    "PRESETS", "Config", "TrainState", "acting", "check_config", "check_env", "config_for", "init_state", "learning",
    "policy_params", "policy_spec", "train",
]
