"""The actor node: N host environments, a policy at the actor's precision (run by JAX or ONNX
Runtime), weights pulled from the broadcaster, n-step transitions inserted into the replay node
in chunks.

Acme's actor interface (`select_action`, `observe_first`, `observe`, `update`) drives one
environment, for `acme.EnvironmentLoop`; `run` drives the actor's vector of environments with
one batched policy call per step, which is how ActorQ runs it. Every phase of a step is timed
for the paper's breakdown: environment step, inference (policy call and exploration), weight
pull (time blocked waiting for the broadcaster), deserialize (bytes -> arrays), load (arrays at
the actor's precision, on device), insert (time blocked handing chunks to the replay).
"""

import os
import threading
import time
from typing import Any, Callable, Optional

import numpy as np

from qrl import envs, runtime as qrl_runtime
from qrl.deploy.live import BACKENDS, policy_backend
from qrl.distributed import weights
from qrl.distributed.agent import DistributedAgent
from qrl.distributed.counting import process_cpu_seconds
from qrl.distributed.handles import Future
from qrl.replay import NStepAccumulator, Transition

TIMED_PHASES = ("env_step", "inference", "pull_wait", "deserialize", "load", "insert")
ACTOR_RUNTIMES = BACKENDS  # jax: the jitted policy; onnx: an ONNX Runtime session fed each update's arrays.
ONE_TIME_PHASES = ("startup_wait", "compile")  # waiting for the first weights; compiling policies
INSERT_TIMEOUT_SECONDS = 1.0  # blocked inserts return this often so the actor can notice stop()
RECENT_EPISODES = 20


def stack_transitions(transitions: list[Transition]) -> dict:
    """A list of single transitions -> the replay node's chunk: a dict of `[n, ...]` arrays."""
    return {
        "observation": np.stack([t.observation for t in transitions]),
        "action": np.stack([np.asarray(t.action) for t in transitions]),
        "reward": np.asarray([t.reward for t in transitions], np.float32),
        "discount": np.asarray([t.discount for t in transitions], np.float32),
        "next_observation": np.stack([t.next_observation for t in transitions]),
    }


def _chunk_tail(chunk: dict, start: int) -> dict:
    return {name: values[start:] for name, values in chunk.items()}


class PolicyCache:
    """The agent's policies at the precisions weights arrive in (int8 at the scheme each message
    names, floats), each in the actor's runtime (`qrl.deploy.live`: jitted JAX, or an ONNX
    Runtime session whose parameters are inputs), built on first use from that message's params."""

    def __init__(self, agent: DistributedAgent, actor_precision: str, runtime: str, observation_shape, observation_dtype):
        self._agent = agent
        self._actor_precision = actor_precision
        self._runtime = runtime
        self._observation = (tuple(observation_shape), observation_dtype)
        self._policies: dict[str, Any] = {}

    def for_scheme(self, int8_scheme: str, params: Any) -> tuple[Any, bool]:
        """The policy backend for `params` loaded from a message of `int8_scheme` (`weights.load`),
        and whether it was just built (its export or compilation is a one-time cost)."""
        precision = weights.actor_network_precision(self._actor_precision, int8_scheme)
        fresh = precision.name not in self._policies
        if fresh:
            self._policies[precision.name] = policy_backend(self._runtime, self._agent.policy(precision), params,
                                                            *self._observation)
        return self._policies[precision.name], fresh


class Actor:
    """One ActorQ actor (see the module docstring).

    Args:
      actor_id: index in the program; seeds environments `seed + 1000 * actor_id + i`.
      agent_factory: `(observation_spec, action_spec) -> DistributedAgent`, picklable.
      env_id, env_options: the environments (host families: gym, dmc, atari).
      num_envs: environments stepped together with one batched policy call.
      actor_precision: fp32, bf16, fp16 or int8.
      noise_scale: this actor's exploration (epsilon or Gaussian sigma), see `exploration_schedule`.
      replay, broadcaster, counter: handles of those nodes.
      update_period: actor steps (environment steps summed over this actor's envs) between pulls.
      sync_pull: wait for each pull to arrive instead of acting on while it travels.
      insert_chunk: transitions per replay insert.
      max_steps: stop `run` after this many actor steps (None: until `stop()`).
      xla_threads: XLA:CPU threads when this actor has its own process.
      runtime: what runs the policy (`ACTOR_RUNTIMES`): `jax` (jitted, params on the device) or
        `onnx` (ONNX Runtime, one intra-op thread; each update's arrays fed to the same session).
    """

    def __init__(
        self,
        actor_id: int,
        agent_factory: Callable[[Any, Any], DistributedAgent],
        env_id: str,
        env_options: Optional[dict],
        num_envs: int,
        seed: int,
        actor_precision: str,
        noise_scale: float,
        replay,
        broadcaster,
        counter,
        update_period: int = 1000,
        sync_pull: bool = False,
        insert_chunk: int = 64,
        max_steps: Optional[int] = None,
        xla_threads: int = 1,
        runtime: str = "jax",
    ):
        qrl_runtime.configure_jax(xla_threads)
        if runtime not in ACTOR_RUNTIMES:
            raise ValueError(f"actor runtime must be one of {', '.join(ACTOR_RUNTIMES)}, got {runtime!r}")
        self.runtime = runtime
        self.actor_id = int(actor_id)
        self._precision_name = weights.check_precision(actor_precision, weights.ACTOR_PRECISIONS, "actor precision")
        self._env_seed = seed + 1000 * self.actor_id
        self._vector_env = envs.make_vector(env_id, num_envs, self._env_seed, **(env_options or {}))
        self._num_envs = num_envs
        observation_spec = self._vector_env.observation_spec()
        action_spec = self._vector_env.action_spec()
        self._agent = agent_factory(observation_spec, action_spec)
        self._observation_shape = tuple(observation_spec.shape)
        self._observation_dtype = observation_spec.dtype
        settings = self._agent.replay
        self._accumulators = [NStepAccumulator(settings.n_step, settings.gamma) for _ in range(num_envs + 1)]
        self._explore = self._agent.make_explorer(float(noise_scale), np.random.default_rng(self._env_seed))
        self.noise_scale = float(noise_scale)
        self._policies = PolicyCache(self._agent, self._precision_name, runtime, observation_spec.shape,
                                     observation_spec.dtype)
        self._weight_spec = weights.policy_weight_spec(self._agent, observation_spec)
        self._replay, self._broadcaster, self._counter = replay, broadcaster, counter
        self._update_period = int(update_period)
        self._sync_pull = bool(sync_pull)
        self._insert_chunk = int(insert_chunk)
        self._max_steps = max_steps

        self._params = None
        self._policy = None
        self._version = -1
        self._pull: Optional[Future] = None
        self._steps_since_pull = 0
        self._pending: list[Transition] = []
        self._insert: Optional[tuple[Future, dict]] = None
        self._unreported_steps = 0
        self._unreported_episodes = 0
        self._episode_returns = np.zeros(num_envs + 1)
        self._recent_returns: list[float] = []
        self._single_observation = None
        self._stop = threading.Event()
        self._seconds = {phase: 0.0 for phase in TIMED_PHASES + ONE_TIME_PHASES}
        self._counts = {"steps": 0, "episodes": 0, "pulls": 0, "loads": 0, "inserts": 0}
        self._run_seconds = 0.0
        self._pull_bytes = 0

    # ----- Acme's actor interface (one environment: accumulator index num_envs) ----------------

    def select_action(self, observation: np.ndarray) -> np.ndarray:
        """The exploring action for one observation `[...]` (weights must have arrived: `update`)."""
        self._ensure_weights()
        return self._act(np.asarray(observation)[None])[0]

    def observe_first(self, timestep) -> None:
        """Starts an episode (Acme): remembers its first observation."""
        self._single_observation = np.asarray(timestep.observation)
        self._episode_returns[self._num_envs] = 0.0

    def observe(self, action, next_timestep) -> None:
        """Records one step of the single environment into the n-step accumulator and replay."""
        last = next_timestep.last()
        self._add(self._num_envs, self._single_observation, action, next_timestep.reward or 0.0,
                  1.0 if next_timestep.discount is None else next_timestep.discount,
                  np.asarray(next_timestep.observation), last)
        self._single_observation = np.asarray(next_timestep.observation)
        self._count_steps(1)
        if last:
            self._flush()
        else:
            self._flush_if_full()

    def update(self, wait: bool = False) -> None:
        """Pulls new weights when `update_period` steps have passed (Acme's `update`); with
        `wait` the pull is synchronous."""
        self._maybe_pull(force_wait=wait)

    # ----- the vectorized loop --------------------------------------------------------------

    def run(self) -> None:
        """Steps the environments until `stop()` (or `max_steps`), then flushes what is left."""
        start = time.perf_counter()
        try:
            self._ensure_weights()
            observations = self._vector_env.reset()
            while not self._stop.is_set():
                if self._max_steps is not None and self._counts["steps"] >= self._max_steps:
                    break
                self._maybe_pull()
                actions = self._act(observations)
                tick = time.perf_counter()
                timestep = self._vector_env.step(actions)
                self._seconds["env_step"] += time.perf_counter() - tick
                self._record(observations, actions, timestep)
                observations = timestep.observation
                self._count_steps(self._num_envs)
                self._flush_if_full()
            self._flush(final=True)
        finally:
            self._run_seconds += time.perf_counter() - start
            self._report_counts()

    def stop(self) -> None:
        self._stop.set()

    def pid(self) -> int:
        return os.getpid()

    def stats(self) -> dict:
        """Steps, episodes, pulls and seconds per phase (`other` = run time not in a phase)."""
        timed = sum(self._seconds.values())
        recent = self._recent_returns[-RECENT_EPISODES:]
        return {
            "actor_id": self.actor_id,
            "actor_precision": self._precision_name,
            "runtime": self.runtime,
            "noise_scale": self.noise_scale,
            "num_envs": self._num_envs,
            **self._counts,
            "version": self._version,
            "pull_bytes": self._pull_bytes,
            "run_seconds": self._run_seconds,
            "steps_per_second": self._counts["steps"] / self._run_seconds if self._run_seconds > 0 else 0.0,
            "seconds": {**self._seconds, "other": max(self._run_seconds - timed, 0.0),
                        "total": self._run_seconds - sum(self._seconds[phase] for phase in ONE_TIME_PHASES)},
            "recent_return": float(np.mean(recent)) if recent else None,
            "process_cpu_seconds": process_cpu_seconds(),
        }

    # ----- internals ------------------------------------------------------------------------

    def _act(self, observations: np.ndarray) -> np.ndarray:
        tick = time.perf_counter()
        actions = self._explore(np.asarray(self._policy(self._params, observations)))
        self._seconds["inference"] += time.perf_counter() - tick
        return actions

    def _record(self, observations, actions, timestep) -> None:
        for index in range(self._num_envs):
            if timestep.step_type[index] == 0:  # FIRST: the env had not been reset.
                continue
            self._add(index, observations[index], actions[index], timestep.reward[index], timestep.discount[index],
                      timestep.final_observation[index], bool(timestep.step_type[index] == 2))

    def _add(self, index, observation, action, reward, discount, next_observation, episode_end: bool) -> None:
        self._pending.extend(
            self._accumulators[index].add(observation, action, reward, discount, next_observation, episode_end)
        )
        self._episode_returns[index] += reward
        if episode_end:
            self._recent_returns.append(float(self._episode_returns[index]))
            del self._recent_returns[:-RECENT_EPISODES]
            self._episode_returns[index] = 0.0
            self._counts["episodes"] += 1
            self._unreported_episodes += 1

    def _count_steps(self, steps: int) -> None:
        self._counts["steps"] += steps
        self._steps_since_pull += steps
        self._unreported_steps += steps

    def _report_counts(self) -> None:
        if self._unreported_steps or self._unreported_episodes:
            self._counter.notify("increment", actor_steps=self._unreported_steps, episodes=self._unreported_episodes)
            self._unreported_steps = self._unreported_episodes = 0

    def _flush_if_full(self) -> None:
        if len(self._pending) >= self._insert_chunk:
            self._flush()

    def _flush(self, final: bool = False) -> None:
        """Hands the pending transitions to the replay. At most one insert is in flight, so a
        rate-limited replay holds the actor back here; the final flush waits for its insert."""
        tick = time.perf_counter()
        self._finish_insert()
        if self._pending:
            chunk = stack_transitions(self._pending)
            self._pending = []
            self._insert = (self._replay.call_async("insert", chunk, None, INSERT_TIMEOUT_SECONDS), chunk)
            self._counts["inserts"] += 1
            if final:
                self._finish_insert()
        self._seconds["insert"] += time.perf_counter() - tick
        self._report_counts()

    def _finish_insert(self) -> None:
        """Waits for the insert in flight; resends what a timed-out insert left, until stopped."""
        while self._insert is not None:
            future, chunk = self._insert
            inserted = int(future.result())
            self._insert = None
            if inserted < len(chunk["reward"]) and not self._stop.is_set():
                rest = _chunk_tail(chunk, inserted)
                self._insert = (self._replay.call_async("insert", rest, None, INSERT_TIMEOUT_SECONDS), rest)

    def _ensure_weights(self) -> None:
        """Blocks until the first weights have arrived (the learner publishes at start); the wait
        is startup, not the steady-state pull cost the breakdown reports."""
        if self._params is not None:
            return
        tick = time.perf_counter()
        pull_wait = self._seconds["pull_wait"]
        while self._params is None and not self._stop.is_set():
            self._maybe_pull(force_wait=True)
            if self._params is None:
                self._stop.wait(0.05)
        self._seconds["pull_wait"] = pull_wait
        loading = self._seconds["deserialize"] + self._seconds["load"] + self._seconds["compile"]  # all from this first load
        self._seconds["startup_wait"] += time.perf_counter() - tick - loading
        if self._params is None:
            raise RuntimeError("actor stopped before any weights arrived")

    def _maybe_pull(self, force_wait: bool = False) -> None:
        if self._pull is None and (force_wait or self._params is None or self._steps_since_pull >= self._update_period):
            self._pull = self._broadcaster.call_async("pull", self._version)
            self._steps_since_pull = 0
            self._counts["pulls"] += 1
        if self._pull is None:
            return
        if not (force_wait or self._sync_pull or self._pull.done()):
            return
        tick = time.perf_counter()
        published = self._pull.result()
        self._seconds["pull_wait"] += time.perf_counter() - tick
        self._pull = None
        if published is not None:
            self._load(*published)

    def _load(self, version: int, blob: bytes) -> None:
        tick = time.perf_counter()
        message = self._weight_spec.check(weights.decode(blob, self._weight_spec.max_message_bytes))
        decoded = time.perf_counter()
        numpy_params = weights.load(message, self._precision_name)
        converted = time.perf_counter()
        policy, fresh = self._policies.for_scheme(message.int8_scheme, numpy_params)
        built = time.perf_counter()
        params = policy.prepare(numpy_params)
        loaded = time.perf_counter()
        self._seconds["deserialize"] += decoded - tick
        self._seconds["load"] += (converted - decoded) + (loaded - built)
        if fresh:  # building and compiling outside the timed phases: a one-time cost, not the paper's "load".
            dummy = np.zeros((self._num_envs, *self._observation_shape), self._observation_dtype)
            policy(params, dummy)
            self._seconds["compile"] += (built - converted) + (time.perf_counter() - loaded)
        self._params, self._policy, self._version = params, policy, int(version)
        self._counts["loads"] += 1
        self._pull_bytes += len(blob)
