"""Implicit Q-Learning (Kostrikov, Nair, Levine, ICLR 2022) over `qrl.offline`'s training loop.

    config = iql.config_for({"expectile": 0.7, "beta": 3.0})
    state, results = iql.train(dataset, "gym:Hopper-v5", config, steps=1_000_000, seed=0, workdir=D)

`build(..., mask={"actor": ..., "critic": ..., "value": ...})` trains under fixed pruning masks
(any network may be absent), scored with `learning.scoring_losses(config, bounds, state)` on
`learning.networks_at_init(state)`.
"""

from typing import Optional

from agents.iql import acting, learning
from agents.iql.config import Config, config_for
from qrl import offline
from qrl.datasets import Dataset
from qrl.networks.continuous import bounds as action_bounds

NAME = "iql"


def build(config: Config, observation_spec, action_spec, mask: Optional[dict] = None) -> offline.OfflineAgent:
    """IQL's pure functions for these specs; with `mask={network: mask}`, those networks train
    under their masks. Batch rewards are multiplied by `config.reward_scale` as given."""
    bounds = action_bounds(action_spec)
    observation_size = int(observation_spec.shape[-1])
    masks = learning.network_masks(mask)
    learning.actor_learning_rate(config)  # a cosine schedule without a length fails here, not in jit.
    return offline.OfflineAgent(
        name=NAME,
        init=lambda key: learning.init(key, config, observation_size, bounds, masks),
        update=learning.make_update(config, bounds, masks),
        policy=acting.make_policy(config, bounds),
        policy_params=learning.policy_params,
        update_count=learning.update_count,
    )


def config_for_run(config: Config, dataset: Dataset, steps: int) -> Config:
    """`config` with what a run on `dataset` for `steps` updates fills in: `reward_scale` from the
    dataset when `normalize_rewards`, and `actor_lr_decay_steps = steps` when it is 0."""
    changes = {}
    if config.normalize_rewards:
        changes["reward_scale"] = learning.reward_scale(dataset)
    if config.actor_lr_decay_steps == 0:
        changes["actor_lr_decay_steps"] = steps
    return config.replace(**changes)


def train(dataset: Dataset, env_id: str, config: Config, steps: int, seed: int, mask: Optional[dict] = None,
          **options) -> tuple[learning.TrainState, dict]:
    """Trains IQL for `steps` gradient steps on `dataset`, evaluating in `env_id`, with `mask=
    {network: mask}` if given; `options` are `qrl.offline.train_offline`'s (workdir, eval_every,
    eval_episodes, reference, log_every, checkpoint_every, progress, env_options). Returns
    `(state, results)`. The config run (and saved with the checkpoints) is
    `config_for_run(config, dataset, steps)`."""
    config = config_for_run(config, dataset, offline.check_count("steps", steps))
    return offline.train_agent(build, dataset, env_id, config, steps, seed, mask=mask, **options)


__all__ = ["Config", "NAME", "acting", "build", "config_for", "config_for_run", "learning", "train"]
