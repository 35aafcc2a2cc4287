"""A2C's two training paths over one update (see `qrl.onpolicy`).

`train` runs the host loop for gymnasium / dm_control / Atari ids and the on-device loop for
brax / gymnax ids; `make_train(config, env_id, steps) -> train(key)` is the whole on-device
run as one pure, vmappable function.
"""

from typing import Callable, Optional

import jax

from agents.a2c import learning, networks
from agents.a2c.config import Config, validate
from qrl import onpolicy

AGENT = onpolicy.OnPolicyAgent(
    name="a2c",
    make_actor_critic=networks.make_actor_critic,
    init=learning.init,
    make_update=learning.make_update,
    validate=validate,
)


def check_env(env_id: str, action_spec) -> None:
    """A2C takes discrete actions or a bounded continuous action vector."""
    onpolicy.check_action_spec("a2c", env_id, action_spec)


def train(
    env_id: str,
    config: Config,
    steps: int,
    seed: int = 0,
    workdir: Optional[str] = None,
    num_envs: Optional[int] = None,
    eval_episodes: int = 10,
    eval_every: int = 0,
    checkpoint_every: int = 0,
    log_every: int = 1_000,
    progress: bool = True,
    env_options: Optional[dict] = None,
) -> tuple[onpolicy.TrainState, dict]:
    """Trains A2C for `steps` environment steps; returns the final state and a results dict.

    `num_envs` (when given) replaces `config.num_envs`. With a `workdir`, writes
    `metrics.csv`, TensorBoard events and orbax checkpoints (every `checkpoint_every` steps
    when > 0, and at the end). The greedy policy is evaluated every `eval_every` steps (when
    > 0) and at the end over `eval_episodes` episodes seeded from `seed + 1_000_000`.
    """
    return onpolicy.train(
        AGENT, check_env, env_id, config, steps, seed=seed, workdir=workdir, num_envs=num_envs,
        eval_episodes=eval_episodes, eval_every=eval_every, checkpoint_every=checkpoint_every,
        log_every=log_every, progress=progress, env_options=env_options,
    )


def make_train(
    config: Config, env_id: str, steps: int, env_options: Optional[dict] = None
) -> Callable[[jax.Array], tuple[onpolicy.TrainState, dict]]:
    """`train(key) -> (state, per-iteration metrics)` for a brax or gymnax id: one jit over a
    `lax.scan` of rollout + update iterations; `jax.jit(jax.vmap(train))(keys)` trains seeds
    side by side."""
    return onpolicy.make_train(AGENT, config, env_id, steps, env_options)
