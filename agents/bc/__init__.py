"""Behaviour cloning (the D4RL baseline, and the BC of single-shot pruning for offline RL) over
`qrl.offline`'s training loop.

    config = bc.config_for({"loss": "gaussian"})
    state, results = bc.train(dataset, "gym:Hopper-v5", config, steps=100_000, seed=0, workdir=D)

`build(..., mask={"actor": actor_mask})` trains under a fixed pruning mask
(`pruning.masks_from_scores`), scored with `learning.scoring_losses`.
"""

from typing import Optional

from agents.bc import acting, learning
from agents.bc.config import Config, config_for
from qrl import offline
from qrl.datasets import Dataset
from qrl.networks.continuous import bounds as action_bounds

NAME = "bc"


def build(config: Config, observation_spec, action_spec, mask: Optional[dict] = None) -> offline.OfflineAgent:
    """BC's pure functions for these specs; with `mask={"actor": actor_mask}`, the actor trains under it."""
    bounds = action_bounds(action_spec)
    observation_size = int(observation_spec.shape[-1])
    actor_mask = offline.network_masks(NAME, mask, learning.NETWORKS)["actor"]
    return offline.OfflineAgent(
        name=NAME,
        init=lambda key: learning.init(key, config, observation_size, bounds, actor_mask),
        update=learning.make_update(config, bounds, actor_mask),
        policy=acting.make_policy(config, bounds),
        policy_params=learning.policy_params,
        update_count=learning.update_count,
    )


def train(dataset: Dataset, env_id: str, config: Config, steps: int, seed: int, mask: Optional[dict] = None,
          **options) -> tuple[learning.TrainState, dict]:
    """Trains BC for `steps` gradient steps on `dataset`, evaluating in `env_id`, with `mask=
    {network: mask}` if given; `options` are `qrl.offline.train_offline`'s (workdir, eval_every,
    eval_episodes, reference, log_every, checkpoint_every, progress, env_options). Returns
    `(state, results)` (batch size, K and observation normalization from `config`)."""
    return offline.train_agent(build, dataset, env_id, config, steps, seed, mask=mask, **options)


__all__ = ["Config", "NAME", "acting", "build", "config_for", "learning", "train"]
