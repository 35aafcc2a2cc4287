"""An offline dataset on device: transitions as one pytree, batches sampled inside jit."""

import flax
import jax
import jax.numpy as jnp
import numpy as np

from qrl.replay import Transition

OBSERVATION_STD_FLOOR = 1e-3  # D4RL-style normalization (TD3+BC uses 1e-3 too)


@flax.struct.dataclass
class Dataset:
    """N transitions `[N, ...]` (`discount` is 0 at terminals, 1 elsewhere) and the observation
    statistics `observation_mean [D]`, `observation_std [D]` computed once at load."""

    transitions: Transition
    observation_mean: jax.Array
    observation_std: jax.Array

    @property
    def size(self) -> int:
        return int(self.transitions.reward.shape[0])


def from_qlearning(arrays: dict) -> Dataset:
    """A device `Dataset` from `qlearning_arrays`' numpy dict."""
    observations = np.asarray(arrays["observations"], np.float32)
    transitions = Transition(
        observation=jnp.asarray(observations),
        action=jnp.asarray(arrays["actions"], jnp.float32),
        reward=jnp.asarray(arrays["rewards"], jnp.float32),
        discount=jnp.asarray(1.0 - np.asarray(arrays["terminals"], np.float32)),
        next_observation=jnp.asarray(arrays["next_observations"], jnp.float32),
    )
    mean = observations.mean(axis=0)
    std = np.maximum(observations.std(axis=0), OBSERVATION_STD_FLOOR)
    return Dataset(transitions, jnp.asarray(mean), jnp.asarray(std))


def sample(dataset: Dataset, key: jax.Array, batch_size: int, num_batches: int = 1) -> Transition:
    """`[num_batches, batch_size, ...]` transitions drawn uniformly with replacement; pure, for jit."""
    indices = jax.random.randint(key, (num_batches, batch_size), 0, dataset.transitions.reward.shape[0])
    return jax.tree.map(lambda values: values[indices], dataset.transitions)


def normalize_observations(dataset: Dataset, observations: jax.Array) -> jax.Array:
    """`(observations - mean) / std` with the dataset's statistics."""
    return (observations - dataset.observation_mean) / dataset.observation_std
