"""TD3 acting: the deterministic actor, plus Gaussian exploration noise while training."""

from typing import Callable, Optional

import jax

from agents.td3 import learning
from agents.td3.config import Config
from qrl import offpolicy
from qrl.networks.continuous import compute_params
from qrl.quant import Precision


def make_policy(config: Config, bounds, precision: Optional[Precision] = None) -> Callable[..., jax.Array]:
    """`policy(actor_params, observations [N, D]) -> actions [N, A]`, deterministic."""
    precision = precision or learning.training_precision(config)
    actor = learning.make_actor(config, bounds, precision)
    return lambda params, observations: actor.apply({"params": compute_params(params, precision)}, observations)


def make_act(config: Config, bounds, precision: Optional[Precision] = None) -> Callable[..., jax.Array]:
    """`act(actor_params, observations [N, D], noise [N, A]) -> actions [N, A]`: the policy's
    action plus `exploration_noise * noise` (in half action ranges), clipped to the bounds."""
    return offpolicy.gaussian_exploration(make_policy(config, bounds, precision), *bounds, config.exploration_noise)
