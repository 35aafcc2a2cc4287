"""Acting with a Q-network: greedy and epsilon-greedy action selection, epsilon schedule."""

from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from agents.dqn.config import Config


def make_greedy_policy(network: nn.Module) -> Callable[[dict, jax.Array], jax.Array]:
    """`policy(params, observations [B, ...]) -> actions [B]` (int32), the argmax of Q."""

    def policy(params, observations):
        q_values = network.apply({"params": params}, observations)
        return jnp.argmax(q_values, axis=-1).astype(jnp.int32)

    return policy


def make_epsilon_greedy_policy(network: nn.Module) -> Callable[..., jax.Array]:
    """`policy(params, observations [B, ...], key, epsilon) -> actions [B]`: with probability
    epsilon a uniformly random action, otherwise the greedy one. Pure, for on-device actors."""

    def policy(params, observations, key, epsilon):
        q_values = network.apply({"params": params}, observations)
        greedy = jnp.argmax(q_values, axis=-1).astype(jnp.int32)
        explore_key, action_key = jax.random.split(key)
        random_actions = jax.random.randint(action_key, greedy.shape, 0, q_values.shape[-1], jnp.int32)
        explore = jax.random.uniform(explore_key, greedy.shape) < epsilon
        return jnp.where(explore, random_actions, greedy)

    return policy


def epsilon_schedule(config: Config, total_steps: int, minimum: Callable = min) -> Callable[[int], float]:
    """Linear decay from the initial to the final epsilon over `exploration_fraction` of the
    training steps, then constant (Mnih et al. 2015; SB3's schedule).

    Plain Python arithmetic by default: the host loop asks every step, and an optax schedule
    there costs a few hundred microseconds of JAX dispatch per call. `minimum=jnp.minimum` gives
    the same schedule over traced step counts (the on-device loop).
    """
    decay_steps = max(1, int(config.exploration_fraction * total_steps))
    initial, final = config.exploration_initial_eps, config.exploration_final_eps

    def epsilon(step: int) -> float:
        return initial + (final - initial) * minimum(step / decay_steps, 1.0)

    return epsilon
