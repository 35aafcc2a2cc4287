"""IQL acting: the deterministic policy, the Gaussian actor's mean."""

from agents.iql import learning
from agents.iql.config import Config
from qrl.offline import PolicyFn


def make_policy(config: Config, bounds) -> PolicyFn:
    """`policy(policy_params, observations [N, D]) -> actions [N, A]` in environment units:
    `scale(tanh(h))` on `learning.policy_params(state)`."""
    actor = learning.make_actor(config, bounds)
    return lambda params, observations: actor.apply({"params": params}, observations)
