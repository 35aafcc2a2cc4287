"""What an algorithm hands the ActorQ nodes: pure functions built for one config and env specs.

`qrl.distributed` imports no agent; each agent package that runs distributed provides
`actorq_agent(config, observation_spec, action_spec) -> DistributedAgent` (see
`agents/dqn/actorq.py`, `agents/d4pg/actorq.py`), and the nodes receive a picklable factory
that builds it in their own process (`agents.actorq.AgentFactory`).
"""

import dataclasses
from typing import Any, Callable, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from qrl.quant import Precision
from qrl.replay import Transition

# `update(state, batches [K, B, ...], weights [K, B]) -> (state, metrics, priorities [K, B])`.
WeightedUpdateFn = Callable[[Any, Transition, jax.Array], tuple[Any, dict, jax.Array]]
Explorer = Callable[[np.ndarray], np.ndarray]


@dataclasses.dataclass(frozen=True)
class ReplaySettings:
    """How the learner consumes data: `updates_per_step` fused updates on batches of
    `batch_size`, `samples_per_insert` sampled items per inserted item (the rate limiter's
    ratio; the agent's own `gradient_steps * batch_size / train_freq`), `min_size` items before
    the first sample, and `n_step`-step transitions discounted by `gamma` (actors accumulate them)."""

    capacity: int
    batch_size: int
    updates_per_step: int
    samples_per_insert: float
    min_size: int
    n_step: int
    gamma: float


@dataclasses.dataclass(frozen=True)
class DistributedAgent:
    """An algorithm's functions for the learner, actors and evaluator.

    Attributes:
      name: the agent's name.
      config: the agent's config dataclass (`to_dict()`).
      init: `key -> train state` (float32 parameters).
      update: see `WeightedUpdateFn`; pure, the learner jits it.
      policy_params: `state -> the policy network's params` (a nested dict).
      policy_network: `precision -> module` mapping observations `[N, ...]` to outputs.
      outputs_to_actions: the network's outputs `[N, ...]` -> actions `[N, ...]` (greedy).
      make_explorer: `(noise_scale, rng) -> explore(actions [N, ...]) -> actions`, in numpy.
      exploration_range: `(noise at actor 0, noise at actor N-1)` of the actors' schedule.
      replay: the agent's `ReplaySettings`.
    """

    name: str
    config: Any
    init: Callable[[jax.Array], Any]
    update: WeightedUpdateFn
    policy_params: Callable[[Any], dict]
    policy_network: Callable[[Precision], nn.Module]
    outputs_to_actions: Callable[[jax.Array], jax.Array]
    make_explorer: Callable[[float, np.random.Generator], Explorer]
    exploration_range: tuple[float, float]
    replay: ReplaySettings

    def policy(self, precision: Precision) -> Callable[[dict, jax.Array], jax.Array]:
        """`policy(params, observations [N, ...]) -> greedy actions [N, ...]` at `precision`
        (params as `qrl.distributed.weights.load` makes them for that precision). Not jitted."""
        network = self.policy_network(precision)
        return lambda params, observations: self.outputs_to_actions(network.apply({"params": params}, observations))


def fuse_weighted(one_update: Callable[[Any, Transition, jax.Array], tuple[Any, dict, jax.Array]]) -> WeightedUpdateFn:
    """K weighted updates under one `lax.scan`: metrics averaged over them, priorities `[K, B]`."""

    def update(state, batches: Transition, weights: jax.Array):
        def step(state, inputs):
            batch, batch_weights = inputs
            state, metrics, priorities = one_update(state, batch, batch_weights)
            return state, (metrics, priorities)

        state, (metrics, priorities) = jax.lax.scan(step, state, (batches, weights))
        return state, jax.tree.map(jnp.mean, metrics), priorities

    return update


def exploration_schedule(num_actors: int, first: float, last: float, spacing: str = "log") -> list[float]:
    """Each actor's exploration noise from `first` (actor 0) to `last` (actor N-1), log-spaced
    or `linear`. One actor gets `first`.

    Ape-X (Horgan et al., 2018) gives actor i of N the epsilon `0.4^(1 + 7 i / (N - 1))`: that
    is `first=0.4, last=0.4^8`, log-spaced. QuaRL's ActorQ (`get_actor_sigma` in its
    actorQ/*/utils.py) gives actor i the noise `i / N * maximum`: `first=0`,
    `last=(N - 1) / N * maximum`, linear.
    """
    if num_actors == 1 or first == last:
        return [float(first)] * num_actors
    fractions = np.arange(num_actors) / (num_actors - 1)
    if spacing == "linear":
        return [float(first + (last - first) * fraction) for fraction in fractions]
    return [float(first * (last / first) ** fraction) for fraction in fractions]


def epsilon_greedy_explorer(num_actions: int) -> Callable[[float, np.random.Generator], Explorer]:
    """`(epsilon, rng) -> explore`: each row's action replaced by a uniform one with probability epsilon."""

    def make(epsilon: float, rng: np.random.Generator) -> Explorer:
        def explore(actions: np.ndarray) -> np.ndarray:
            replace = rng.random(actions.shape[0]) < epsilon
            if not replace.any():
                return actions
            return np.where(replace, rng.integers(0, num_actions, actions.shape[0]), actions).astype(actions.dtype)

        return explore

    return make


def gaussian_explorer(low: np.ndarray, high: np.ndarray) -> Callable[[float, np.random.Generator], Explorer]:
    """`(sigma, rng) -> explore`: Gaussian noise of `sigma` half action ranges added, then clipped
    to the bounds (as `qrl.offpolicy.gaussian_exploration`, in numpy on the actor's host)."""
    low, high = np.asarray(low, np.float32), np.asarray(high, np.float32)
    half_range = 0.5 * (high - low)

    def make(sigma: float, rng: np.random.Generator) -> Explorer:
        def explore(actions: np.ndarray) -> np.ndarray:
            noise = rng.standard_normal(actions.shape, dtype=np.float32)
            return np.clip(actions + sigma * half_range * noise, low, high).astype(np.float32)

        return explore

    return make


def replay_settings(config, min_size: Optional[int] = None) -> ReplaySettings:
    """An off-policy config's replay schedule (fields `buffer_size, batch_size, gradient_steps,
    train_freq, learning_starts, n_step, gamma`) as `ReplaySettings`."""
    return ReplaySettings(
        capacity=int(config.buffer_size),
        batch_size=int(config.batch_size),
        updates_per_step=int(config.gradient_steps),
        samples_per_insert=config.gradient_steps * config.batch_size / config.train_freq,
        min_size=int(min_size if min_size is not None else max(config.learning_starts, config.batch_size)),
        n_step=int(config.n_step),
        gamma=float(config.gamma),
    )
