"""TD3+BC acting: the deterministic actor."""

from agents.td3_bc import learning
from agents.td3_bc.config import Config
from qrl.offline import PolicyFn


def make_policy(config: Config, bounds) -> PolicyFn:
    """`policy(actor_params, observations [N, D]) -> actions [N, A]` in environment units:
    `scale(tanh(head))`."""
    actor = learning.make_actor(config, bounds)
    return lambda params, observations: actor.apply({"params": params}, observations)
