"""Acting with PPO's actor: stochastic policies for training, greedy ones for evaluation.

Discrete actions sample the categorical over logits (greedy: argmax); continuous actions
sample the diagonal Gaussian around the actor's mean with the state-independent log-std and
are clipped to the action spec's bounds for the environment (greedy: the clipped mean).
"""

from typing import Callable

import jax
import numpy as np

from qrl.onpolicy import ActorCritic, acting_params


def make_policy(actor_critic: ActorCritic) -> Callable[[dict, jax.Array, jax.Array], jax.Array]:
    """`policy(params, observations [B, ...], key) -> environment actions [B, ...]`, sampled. Pure."""

    def policy(params, observations, key):
        actions, _ = actor_critic.sample(params, observations, key)
        return actor_critic.head.to_env(actions)

    return policy


def make_greedy_policy(actor_critic: ActorCritic) -> Callable[[dict, jax.Array], jax.Array]:
    """`policy(params, observations [B, ...]) -> environment actions [B, ...]`, deterministic. Pure."""
    return actor_critic.greedy


def make_greedy_policy_fn(actor_critic: ActorCritic, params_ref: Callable[[], dict]) -> Callable[[np.ndarray], np.ndarray]:
    """A numpy-in/numpy-out greedy policy reading the current params through `params_ref`."""
    greedy = jax.jit(actor_critic.greedy)
    return lambda observations: np.asarray(greedy(acting_params(params_ref()), observations))
