"""SAC acting: a reparameterized tanh-Gaussian sample to explore, `scale(tanh(mean))` to evaluate."""

from typing import Callable, Optional

import jax
import jax.numpy as jnp

from agents.sac import learning
from agents.sac.config import Config
from qrl import offpolicy
from qrl.networks.continuous import compute_params, scale_actions
from qrl.quant import Precision


def make_act(config: Config, bounds, precision: Optional[Precision] = None) -> Callable[..., jax.Array]:
    """`act(actor_params, observations [N, D], noise [N, A]) -> actions [N, A]`: the sample
    `scale(tanh(mean + std * noise))` for standard-normal `noise` (drawn by the caller)."""
    precision = precision or learning.training_precision(config)
    actor = learning.make_actor(config, bounds, precision)
    low, high = bounds

    def act(params, observations, noise):
        mean, log_std = actor.apply({"params": compute_params(params, precision)}, observations)
        return scale_actions(jnp.tanh(mean + jnp.exp(log_std) * noise), low, high)

    return act


def make_policy(config: Config, bounds, precision: Optional[Precision] = None) -> Callable[..., jax.Array]:
    """`policy(actor_params, observations [N, D]) -> actions [N, A]`, deterministic."""
    return offpolicy.deterministic_policy(learning.policy_network, config, bounds, precision)
