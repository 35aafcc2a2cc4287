"""D4PG for ActorQ's distributed actor-learner training (the paper's DM Control agent)."""

from agents.d4pg import learning
from agents.d4pg.config import Config
from agents.d4pg.training import check_env
from qrl.distributed.agent import DistributedAgent, fuse_weighted, gaussian_explorer, replay_settings
from qrl.distributed.run import ActorQPreset
from qrl.networks.continuous import bounds as action_bounds

# Acme's distributed D4PG gives every actor sigma 0.3; here actor 0 explores with the config's
# sigma and the last actor with a sixth of it, log-spaced between (an Ape-X-like spread).
LAST_ACTOR_SIGMA_FRACTION = 1 / 6

# QuaRL's ActorQ D4PG (harvard-edge/QuaRL, actorQ/d4pg/): each value and the file it comes from.
QUARL = ActorQPreset(
    name="quarl",
    run=dict(
        rate_limiter="min_size",  # d4pg_learner.py: reverb MinSize limiter only.
        max_times_sampled=16,  # run_multiprocess.sh spi=16 (d4pg_args.py's default: 8).
        min_replay_size=2_000,  # d4pg_args.py --min_replay_size.
        replay_capacity=100_000,  # d4pg_args.py --replay_table_max_replay_size.
        prioritized=False,  # d4pg_learner.py: Uniform sampler, Fifo remover.
        num_actors=4,  # run_multiprocess.sh n_actors.
        actor_update_period=30,  # run_multiprocess.sh actor_update_period.
        # utils.py get_actor_sigma(sigma=1, d4pg_args.py): actor i of N explores with sigma i/N.
        exploration_first=0.0, exploration_last=0.75, exploration_spacing="linear",
        actor_int8_scheme="quarl_dyn8",  # pytorch_actors.py: dynamic-range int8 actors.
    ),
    agent=dict(
        architecture="quarl",  # utils.py make_networks: tanh policy torso, near-zero head; LayerNormMLP critic.
        actor_hidden_sizes=(2048, 2048, 2048),  # run_multiprocess.sh modelstr (d4pg_args.py: 4096^3).
        critic_hidden_sizes=(512, 512, 256),  # utils.py make_networks.
        num_atoms=51, v_min=-150.0, v_max=150.0,  # utils.py make_networks.
        batch_size=256,  # run_multiprocess.sh batch.
        n_step=5, gamma=0.99,  # d4pg_args.py --n_step, --discount.
        learning_rate=1e-4,  # d4pg_learner.py: Adam 1e-4 for policy and critic.
        target_update_period=100, tau=1.0,  # d4pg_learner.py: a hard copy every 100 updates.
        dqda_clipping=1.0, max_grad_norm=40.0,  # d4pg_learner.py clipping=True (Acme's TF D4PG learner).
        gradient_steps=1,  # one update per learner step.
    ),
)
ACTORQ_PRESETS = {QUARL.name: QUARL}


def actorq_agent(config: Config, observation_spec, action_spec, env_id: str = "") -> DistributedAgent:
    """D4PG's learner update (importance-weighted critic loss, per-transition critic losses as
    priorities), deterministic actor and Gaussian exploration for these specs."""
    check_env(env_id or "this environment", action_spec)
    bounds = action_bounds(action_spec)
    observation_size = int(observation_spec.shape[-1])
    sigma = float(config.exploration_noise)
    return DistributedAgent(
        name="d4pg",
        config=config,
        init=lambda key: learning.init(key, config, observation_size, bounds),
        update=fuse_weighted(learning.make_weighted_one_update(config, bounds)),
        policy_params=lambda state: state.actor_params,
        policy_network=lambda precision: learning.make_actor(config, bounds, precision),
        outputs_to_actions=lambda actions: actions,
        make_explorer=gaussian_explorer(*bounds),
        exploration_range=(sigma, sigma * LAST_ACTOR_SIGMA_FRACTION),
        replay=replay_settings(config),
    )
