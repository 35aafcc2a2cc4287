"""D4PG for ActorQ's distributed actor-learner training (the paper's DM Control agent)."""

from agents.d4pg import learning
from agents.d4pg.config import Config
from agents.d4pg.training import check_env
from qrl.distributed.agent import DistributedAgent, fuse_weighted, gaussian_explorer, replay_settings
from qrl.networks.continuous import bounds as action_bounds

# Acme's distributed D4PG gives every actor sigma 0.3; here actor 0 explores with the config's
# sigma and the last actor with a sixth of it, log-spaced between (an Ape-X-like spread).
LAST_ACTOR_SIGMA_FRACTION = 1 / 6


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
