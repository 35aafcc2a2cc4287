"""DQN for ActorQ's distributed actor-learner training (Ape-X style: epsilon per actor)."""

import jax.numpy as jnp

from agents.dqn import learning
from agents.dqn.config import Config
from agents.dqn.training import check_env
from qrl import envs
from qrl.distributed.agent import (
    DistributedAgent, epsilon_greedy_explorer, fuse_weighted, replay_settings,
)
from qrl.quant import FP32

# Ape-X (Horgan et al., 2018): actor i of N explores with epsilon 0.4^(1 + 7 i / (N - 1)).
APEX_EPSILONS = (0.4, 0.4**8)


def actorq_agent(config: Config, observation_spec, action_spec, env_id: str = "") -> DistributedAgent:
    """DQN's learner update (importance-weighted, |TD| priorities), greedy Q policy and
    epsilon-greedy exploration for these specs."""
    check_env(env_id or "this environment", action_spec)
    shape, num_actions = tuple(observation_spec.shape), envs.num_actions(action_spec)

    def network(precision):
        return learning.make_network(config, shape, num_actions, precision)

    return DistributedAgent(
        name="dqn",
        config=config,
        init=lambda key: learning.init(key, config, shape, observation_spec.dtype, num_actions),
        update=fuse_weighted(learning.make_weighted_one_update(network(FP32), config)),
        policy_params=lambda state: state.params,
        policy_network=network,
        outputs_to_actions=lambda q_values: jnp.argmax(q_values, axis=-1).astype(jnp.int32),
        make_explorer=epsilon_greedy_explorer(num_actions),
        exploration_range=APEX_EPSILONS,
        replay=replay_settings(config),
    )
