"""Host-side replay for host-loop agents: n-step accumulation and a uniform ring buffer.

The buffer lives in preallocated numpy arrays: inserting one transition is a few row writes
(about a microsecond), and sampling `K` batches for `K` fused updates is one fancy-indexing
gather, handed to the jitted update as `[K, B, ...]` arrays. A device-resident buffer would
cost a jitted call per insert (tens of microseconds on CPU), more than the environment step.
"""

import collections
import dataclasses
from typing import Optional

import flax
import numpy as np


@flax.struct.dataclass
class Transition:
    """One (n-step) transition; in a batch every field gains leading axes `[K, B, ...]`.

    `discount` is the full bootstrap multiplier: gamma^k times the product of the environment
    discounts over the k steps summed into `reward`, so targets are `reward + discount * V(next)`.
    """

    observation: np.ndarray
    action: np.ndarray
    reward: np.ndarray
    discount: np.ndarray
    next_observation: np.ndarray


_FIELDS = tuple(field.name for field in dataclasses.fields(Transition))


class NStepAccumulator:
    """Turns a stream of environment steps into n-step transitions for one environment.

    Call `add(observation, action, reward, discount, next_observation, episode_end)` every
    step; it returns the transitions that became complete (zero, one, or at an episode end
    the remaining tail). `discount` is the environment's (0 at termination, 1 otherwise).
    """

    def __init__(self, n_step: int, gamma: float):
        if n_step < 1:
            raise ValueError(f"n_step must be >= 1, got {n_step}")
        self._n_step = n_step
        self._gamma = gamma
        self._pending: collections.deque = collections.deque()

    def add(self, observation, action, reward, discount, next_observation, episode_end: bool) -> list[Transition]:
        self._pending.append((observation, action, float(reward), float(discount)))
        ready = []
        if len(self._pending) == self._n_step:
            ready.append(self._emit(next_observation))
        if episode_end:
            while self._pending:
                ready.append(self._emit(next_observation))
        return ready

    def _emit(self, next_observation) -> Transition:
        observation, action, _, _ = self._pending[0]
        total, multiplier = 0.0, 1.0
        for _, _, reward, discount in self._pending:
            total += multiplier * reward
            multiplier *= discount * self._gamma
        self._pending.popleft()
        return Transition(observation, action, np.float32(total), np.float32(multiplier), next_observation)


class UniformReplay:
    """Fixed-capacity ring buffer of transitions with uniform sampling.

    Arrays are allocated at the first insert from that transition's shapes and dtypes
    (uint8 frames stay uint8).
    """

    def __init__(self, capacity: int, seed: int = 0):
        if capacity < 1:
            raise ValueError(f"replay capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._storage: Optional[dict] = None
        self._next = 0
        self._size = 0
        self._rng = np.random.default_rng(seed)

    def __len__(self) -> int:
        return self._size

    def add(self, transition: Transition) -> None:
        fields = {name: getattr(transition, name) for name in _FIELDS}
        if self._storage is None:
            self._storage = {
                name: np.zeros((self.capacity,) + np.shape(value), np.asarray(value).dtype)
                for name, value in fields.items()
            }
        for name, value in fields.items():
            self._storage[name][self._next] = value
        self._next = (self._next + 1) % self.capacity
        self._size = min(self._size + 1, self.capacity)

    def sample(self, batch_size: int, num_batches: Optional[int] = None) -> Transition:
        """Uniform sample `[B, ...]`, or `[num_batches, B, ...]` when num_batches is given."""
        if self._size == 0:
            raise ValueError("cannot sample from an empty replay buffer")
        shape = (batch_size,) if num_batches is None else (num_batches, batch_size)
        indices = self._rng.integers(0, self._size, size=shape)
        return Transition(**{name: array[indices] for name, array in self._storage.items()})
