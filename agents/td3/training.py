"""TD3 training: builds the agent's functions for `qrl.offpolicy`'s host and on-device loops."""

from typing import Optional

from agents.td3 import acting, learning
from agents.td3.config import Config
from qrl import offpolicy
from qrl.networks.continuous import bounds as action_bounds

NAME = "td3"


def check_env(env_id: str, action_spec) -> None:
    """TD3 needs continuous actions."""
    offpolicy.check_continuous(NAME, env_id, action_spec)


def build(config: Config, observation_spec, action_spec) -> offpolicy.OffPolicyAgent:
    """TD3's pure functions for these specs (see `qrl.offpolicy.OffPolicyAgent`)."""
    bounds = action_bounds(action_spec)
    observation_size = int(observation_spec.shape[-1])
    return offpolicy.OffPolicyAgent(
        name=NAME,
        init=lambda key: learning.init(key, config, observation_size, bounds),
        act=lambda precision: acting.make_act(config, bounds, precision),
        policy=lambda precision: acting.make_policy(config, bounds, precision),
        update=lambda precision: learning.make_update(config, bounds, precision),
        policy_params=lambda state: state.actor_params,
        update_count=lambda state: state.updates,
    )


def train(
    env_id: str,
    config: Config,
    steps: int,
    seed: int = 0,
    workdir: Optional[str] = None,
    num_envs: int = 1,
    eval_episodes: int = 10,
    eval_every: int = 0,
    checkpoint_every: int = 0,
    log_every: int = 1_000,
    progress: bool = True,
    env_options: Optional[dict] = None,
) -> tuple[learning.TrainState, dict]:
    """Trains TD3 for `steps` environment steps; returns the final state and a results dict.

    Host ids (gym, dmc) run `qrl.offpolicy.train_host`, device ids (brax, gymnax)
    `qrl.offpolicy.make_train` under one jit. See `qrl.offpolicy.train` for the arguments.
    """
    return offpolicy.train(
        build, check_env, config, env_id, steps, seed, workdir, num_envs, eval_episodes, eval_every,
        checkpoint_every, log_every, progress, env_options,
    )
