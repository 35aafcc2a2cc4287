"""TD3 acting: the deterministic actor, plus Gaussian exploration noise while training."""

from typing import Optional

from agents.td3 import learning
from agents.td3.config import Config
from qrl import offpolicy
from qrl.quant import Precision


def make_policy(config: Config, bounds, precision: Optional[Precision] = None) -> offpolicy.PolicyFn:
    """`policy(actor_params, observations [N, D]) -> actions [N, A]`, deterministic."""
    return offpolicy.deterministic_policy(learning.make_actor, config, bounds, precision)


def make_act(config: Config, bounds, precision: Optional[Precision] = None) -> offpolicy.ActFn:
    """`act(actor_params, observations [N, D], noise [N, A]) -> actions [N, A]`: the policy's
    action plus `exploration_noise * noise` (in half action ranges), clipped to the bounds."""
    return offpolicy.deterministic_act(learning.make_actor, config, bounds, precision)
