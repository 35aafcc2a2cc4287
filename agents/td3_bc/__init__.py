"""TD3+BC (Fujimoto & Gu, "A Minimalist Approach to Offline Reinforcement Learning", NeurIPS 2021)
over `qrl.offline`'s training loop.

    config = td3_bc.config_for({"alpha": 2.5})
    state, results = td3_bc.train(dataset, "gym:Hopper-v5", config, steps=1_000_000, seed=0, workdir=D)

`build(..., mask={"actor": actor_mask, "critic": critic_mask})` trains under fixed pruning masks
(`pruning.masks_from_scores`), scored with `learning.scoring_losses`.
"""

from typing import Optional

from agents.td3_bc import acting, learning
from agents.td3_bc.config import Config, config_for
from qrl import offline
from qrl.datasets import Dataset
from qrl.networks.continuous import bounds as action_bounds

NAME = "td3_bc"


def build(config: Config, observation_spec, action_spec, mask: Optional[dict] = None) -> offline.OfflineAgent:
    """TD3+BC's pure functions for these specs; with `mask={network: mask}` ("actor", "critic",
    either may be absent) those networks and their targets train under their masks."""
    bounds = action_bounds(action_spec)
    observation_size = int(observation_spec.shape[-1])
    masks = offline.network_masks(NAME, mask, learning.NETWORKS)
    return offline.OfflineAgent(
        name=NAME,
        init=lambda key: learning.init(key, config, observation_size, bounds, masks),
        update=learning.make_update(config, bounds, masks),
        policy=acting.make_policy(config, bounds),
        policy_params=learning.policy_params,
        update_count=learning.update_count,
    )


def train(dataset: Dataset, env_id: str, config: Config, steps: int, seed: int, mask: Optional[dict] = None,
          **options) -> tuple[learning.TrainState, dict]:
    """Trains TD3+BC for `steps` gradient steps on `dataset`, evaluating in `env_id`, with `mask=
    {network: mask}` if given; `options` are `qrl.offline.train_offline`'s (workdir, eval_every,
    eval_episodes, reference, log_every, checkpoint_every, progress, env_options). Returns
    `(state, results)` (batch size, K and observation normalization from `config`)."""
    return offline.train_agent(build, dataset, env_id, config, steps, seed, mask=mask, **options)


__all__ = ["Config", "NAME", "acting", "build", "config_for", "learning", "train"]
