"""BC acting: the deterministic policy (the MSE actor's action; the Gaussian's mean)."""

from agents.bc import learning
from agents.bc.config import Config
from qrl.offline import PolicyFn


def make_policy(config: Config, bounds) -> PolicyFn:
    """`policy(actor_params, observations [N, D]) -> actions [N, A]` in environment units:
    `scale(tanh(head[..., :A]))`."""
    actor = learning.make_actor(config, bounds)
    return lambda params, observations: actor.apply({"params": params}, observations)
