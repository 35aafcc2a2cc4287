"""BCQ (Fujimoto, Meger, Precup, "Off-Policy Deep Reinforcement Learning without Exploration",
ICML 2019), continuous, over `qrl.offline`'s training loop.

    config = bcq.config_for({"target_matmul_dtype": "bf16"})
    state, results = bcq.train(dataset, "gym:Hopper-v5", config, steps=1_000_000, seed=0, workdir=D)

`build(..., mask={"vae": ..., "actor": ..., "critic": ...})` trains under fixed pruning masks (any
network may be absent), scored with `learning.scoring_losses(config, bounds, state)` on
`learning.networks_at_init(state)`.
"""

from typing import Optional

from agents.bcq import acting, learning
from agents.bcq.config import Config, config_for
from qrl import offline
from qrl.datasets import Dataset
from qrl.networks.continuous import bounds as action_bounds

NAME = "bcq"


def build(config: Config, observation_spec, action_spec, mask: Optional[dict] = None) -> offline.OfflineAgent:
    """BCQ's pure functions for these specs; with `mask={network: mask}` ("vae", "actor",
    "critic", any may be absent) those networks, and the targets of actor and critic, train
    under their masks."""
    bounds = action_bounds(action_spec)
    observation_size = int(observation_spec.shape[-1])
    masks = learning.network_masks(mask)
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
    """Trains BCQ for `steps` gradient steps on `dataset`, evaluating in `env_id`, with `mask=
    {network: mask}` if given; `options` are `qrl.offline.train_offline`'s (workdir, eval_every,
    eval_episodes, reference, log_every, checkpoint_every, progress, env_options). Returns
    `(state, results)` (batch size, K and observation normalization from `config`)."""
    return offline.train_agent(build, dataset, env_id, config, steps, seed, mask=mask, **options)


__all__ = ["Config", "NAME", "acting", "build", "config_for", "learning", "train"]
