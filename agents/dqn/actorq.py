"""DQN for ActorQ's distributed actor-learner training (Ape-X style: epsilon per actor)."""

import jax.numpy as jnp

from agents.dqn import learning
from agents.dqn.config import Config
from agents.dqn.training import check_env
from qrl import envs
from qrl.distributed.agent import (
    DistributedAgent, epsilon_greedy_explorer, fuse_weighted, replay_settings,
)
from qrl.distributed.run import ActorQPreset
from qrl.quant import FP32

# Ape-X (Horgan et al., 2018): actor i of N explores with epsilon 0.4^(1 + 7 i / (N - 1)).
APEX_EPSILONS = (0.4, 0.4**8)

# QuaRL's ActorQ DQN (harvard-edge/QuaRL, actorQ/dqn/): each value and the file it comes from.
QUARL = ActorQPreset(
    name="quarl",
    run=dict(
        rate_limiter="min_size",  # dqn_learner.py: reverb MinSize limiter only.
        max_times_sampled=16,  # run_multiprocess.sh spi=16 (dqn_args.py's default: 8).
        min_replay_size=100_000,  # dqn_args.py --min_replay_size.
        replay_capacity=200_000,  # dqn_args.py --replay_table_max_replay_size.
        prioritized=True, priority_exponent=0.6, importance_exponent=0.2,  # dqn_learner.py Prioritized(0.6), IS 0.2.
        num_actors=4,  # run_multiprocess.sh n_actors.
        actor_update_period=100,  # run_multiprocess.sh actor_update_period.
        # utils.py get_actor_sigma(sigma=0.01, dqn_args.py): actor i of N explores with epsilon 0.01 i/N.
        exploration_first=0.0, exploration_last=0.0075, exploration_spacing="linear",
        actor_int8_scheme="quarl_dyn8",  # pytorch_actors.py: dynamic-range int8 actors.
    ),
    agent=dict(
        architecture="quarl",  # utils.py make_networks: tanh torso, linear last hidden layer, near-zero head.
        hidden_sizes=(2048, 2048, 2048),  # run_multiprocess.sh modelstr (dqn_args.py: 4096^3).
        dueling=False, separate_value_stream=False, layer_norm=False,
        batch_size=256,  # run_multiprocess.sh batch.
        n_step=5, gamma=0.99,  # dqn_args.py --n_step, --discount (see the README's deviations).
        learning_rate=1e-3,  # dqn_learner.py learning_rate.
        target_update_period=100, tau=1.0,  # dqn_learner.py target_update_period: a hard copy.
        double_q=True, huber_delta=1.0,  # Acme's TF DQNLearner: double Q-learning, Huber 1.
        max_grad_norm=1e10,  # Acme's TF DQNLearner: max_gradient_norm None -> 1e10 (no clipping).
        gradient_steps=1,  # one update per learner step.
    ),
)
ACTORQ_PRESETS = {QUARL.name: QUARL}


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
