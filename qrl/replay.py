"""Replay: n-step accumulation and uniform ring buffers, on the host and on device.

Host loops use `NStepAccumulator` and `UniformReplay`: the buffer lives in preallocated numpy
arrays, inserting one transition is a few row writes (about a microsecond), and sampling `K`
batches for `K` fused updates is one fancy-indexing gather, handed to the jitted update as
`[K, B, ...]` arrays. A device-resident buffer would cost a jitted call per insert (tens of
microseconds on CPU), more than the environment step.

On-device loops (brax, gymnax under one `jit`) use `DeviceReplay` and `NStepWindow`, pure
functions over state that lives in the loop's carry."""

import collections
import dataclasses
from typing import Optional

import flax
import jax
import jax.numpy as jnp
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

    def add_batch(self, transitions: Transition) -> None:
        """Adds `[N, ...]` transitions in order, as N calls of `add` would (the last `capacity`
        of them stay when N exceeds it)."""
        fields = {name: np.asarray(getattr(transitions, name)) for name in _FIELDS}
        count = len(fields["reward"])
        if count == 0:
            return
        if self._storage is None:
            self._storage = {
                name: np.zeros((self.capacity,) + value.shape[1:], value.dtype) for name, value in fields.items()
            }
        if count > self.capacity:
            self._next = (self._next + count - self.capacity) % self.capacity
            fields = {name: value[count - self.capacity:] for name, value in fields.items()}
            count = self.capacity
        rows = (self._next + np.arange(count)) % self.capacity
        for name, value in fields.items():
            self._storage[name][rows] = value
        self._next = (self._next + count) % self.capacity
        self._size = min(self._size + count, self.capacity)

    def sample(self, batch_size: int, num_batches: Optional[int] = None) -> Transition:
        """Uniform sample `[B, ...]`, or `[num_batches, B, ...]` when num_batches is given."""
        if self._size == 0:
            raise ValueError("cannot sample from an empty replay buffer")
        shape = (batch_size,) if num_batches is None else (num_batches, batch_size)
        indices = self._rng.integers(0, self._size, size=shape)
        return Transition(**{name: array[indices] for name, array in self._storage.items()})


# ---------------------------------------------------------------------------------------------
# Device-resident replay for on-device training loops (everything below runs under jit/scan).
# ---------------------------------------------------------------------------------------------


@flax.struct.dataclass
class DeviceReplayState:
    """A ring buffer of transitions in device arrays: `storage` fields are `[capacity, ...]`;
    `position` (int32) is the next row to write and `size` (int32) the rows filled."""

    storage: Transition
    position: jax.Array
    size: jax.Array


class DeviceReplay:
    """Uniform replay whose state lives in a jitted loop's carry.

    Every `add` writes one batch of `insert_size` transitions (one row per environment) with
    `lax.dynamic_update_slice`, which XLA performs in place inside a loop; `.at[index].set`
    copied the whole buffer per insert on CPU. The capacity is rounded up to a multiple of
    `insert_size`, so a write never wraps around the end.
    """

    def __init__(self, capacity: int, insert_size: int):
        if capacity < 1 or insert_size < 1:
            raise ValueError(f"replay capacity and insert size must be >= 1, got {capacity} and {insert_size}")
        self.insert_size = int(insert_size)
        self.capacity = -(-int(capacity) // self.insert_size) * self.insert_size

    def init(self, example: Transition) -> DeviceReplayState:
        """An empty buffer shaped for transitions like `example` (one transition, no batch axis)."""
        storage = jax.tree.map(
            lambda leaf: jnp.zeros((self.capacity,) + jnp.shape(leaf), jnp.asarray(leaf).dtype), example
        )
        return DeviceReplayState(storage, jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32))

    def add(self, state: DeviceReplayState, transitions: Transition, valid: jax.Array = True) -> DeviceReplayState:
        """Writes `transitions [insert_size, ...]`; where `valid` is False the rows are written
        but neither counted nor kept (the next add overwrites them)."""
        storage = jax.tree.map(
            lambda buffer, rows: jax.lax.dynamic_update_slice_in_dim(
                buffer, rows.astype(buffer.dtype), state.position, 0
            ),
            state.storage,
            transitions,
        )
        advance = jnp.where(valid, self.insert_size, 0).astype(jnp.int32)
        return DeviceReplayState(
            storage=storage,
            position=(state.position + advance) % self.capacity,
            size=jnp.minimum(state.size + advance, self.capacity),
        )

    def sample(self, state: DeviceReplayState, key: jax.Array, batch_size: int, num_batches: int) -> Transition:
        """`[num_batches, batch_size, ...]` transitions drawn uniformly (with replacement) from the
        filled rows; the buffer must not be empty."""
        indices = jax.random.randint(key, (num_batches, batch_size), 0, jnp.maximum(state.size, 1))
        return jax.tree.map(lambda buffer: buffer[indices], state.storage)


@flax.struct.dataclass
class NStepWindow:
    """The last n steps of N environments, oldest first: `[n, N, ...]` arrays and a step count."""

    observation: jax.Array
    action: jax.Array
    reward: jax.Array
    discount: jax.Array
    done: jax.Array
    next_observation: jax.Array
    count: jax.Array


def nstep_window_init(n_step: int, observation: jax.Array, action: jax.Array) -> NStepWindow:
    """An empty window for observations like `observation [N, ...]` and actions `[N, ...]`."""
    if n_step < 1:
        raise ValueError(f"n_step must be >= 1, got {n_step}")
    num_envs = observation.shape[0]
    zeros = lambda like: jnp.zeros((n_step,) + like.shape, like.dtype)
    return NStepWindow(
        observation=zeros(observation),
        action=zeros(action),
        reward=jnp.zeros((n_step, num_envs), jnp.float32),
        discount=jnp.zeros((n_step, num_envs), jnp.float32),
        done=jnp.zeros((n_step, num_envs), jnp.float32),
        next_observation=zeros(observation),
        count=jnp.zeros((), jnp.int32),
    )


def nstep_window_push(
    window: NStepWindow, observation, action, reward, discount, done, next_observation, gamma: float
) -> tuple[NStepWindow, Transition, jax.Array]:
    """Appends one step of N envs (`[N, ...]`; `done` True where the episode ended, by
    termination or truncation; `discount` 0 at termination) and returns the n-step transition
    `[N, ...]` that starts at the window's oldest step, and whether it is complete (False for the
    first n-1 pushes).

    The transition sums rewards up to the end of the oldest step's episode or n steps, whichever
    comes first, and bootstraps from the observation reached there; its `discount` is gamma^k
    times the environment discounts, as `NStepAccumulator` emits. A step that starts within the
    last n-1 steps of an episode is emitted once it becomes the oldest, so every step starts
    exactly one transition, as on the host.
    """
    def shift(old, new):
        return jnp.concatenate([old[1:], jnp.asarray(new, old.dtype)[None]], axis=0)

    window = NStepWindow(
        observation=shift(window.observation, observation),
        action=shift(window.action, action),
        reward=shift(window.reward, reward),
        discount=shift(window.discount, discount),
        done=shift(window.done, done),
        next_observation=shift(window.next_observation, next_observation),
        count=window.count + 1,
    )
    n_step = window.reward.shape[0]
    ones = jnp.ones_like(window.reward[:1])
    # alive[k]: step k belongs to the oldest step's episode (no episode end before it).
    alive = jnp.concatenate([ones, jnp.cumprod(1.0 - window.done, axis=0)[:-1]], axis=0)
    multipliers = jnp.cumprod(gamma * window.discount, axis=0)  # inclusive: prod_{j<=k} gamma d_j
    before = jnp.concatenate([ones, multipliers[:-1]], axis=0)  # exclusive: prod_{j<k} gamma d_j
    total = jnp.sum(alive * before * window.reward, axis=0)
    last = (jnp.sum(alive, axis=0) - 1).astype(jnp.int32)  # [N]: the last step inside the episode
    columns = jnp.arange(window.reward.shape[1])
    transition = Transition(
        observation=window.observation[0],
        action=window.action[0],
        reward=total,
        discount=multipliers[last, columns],
        next_observation=window.next_observation[last, columns],
    )
    return window, transition, window.count >= n_step
