"""The evaluator node: runs the learner's current policy on a schedule, at fp32 and at the
actors' precision, and keeps `(wall time, learner steps, actor steps, returns)` records.

fp32 params come from the learner (`get_variables_version`, the latest publish); the actors'
precision from the broadcaster's blob of the same publish, decoded and loaded as an actor
does. Episodes are greedy (no exploration) and seeded from `seed + EVAL_SEED_OFFSET`.
"""

import os
import threading
import time
from typing import Any, Callable, Optional


from qrl import evaluation, runtime as jax_runtime
from qrl.distributed import weights
from qrl.distributed.agent import DistributedAgent
from qrl.distributed.counting import process_cpu_seconds
from qrl.distributed.actor import PolicyCache
from qrl.run_monitor import EVAL_SEED_OFFSET


class Evaluator:
    """Evaluates every `every_seconds` (and on `evaluate_now`); see the module docstring.

    Args:
      agent_factory: `(observation_spec, action_spec) -> DistributedAgent`, picklable.
      observation_spec, action_spec: the environment's specs.
      env_id, env_options: the environment.
      seed: evaluation episodes are seeded `seed + EVAL_SEED_OFFSET + i`.
      actor_precision: the actors' precision, evaluated beside fp32.
      learner, broadcaster, counter: handles of those nodes.
      episodes: episodes per evaluation; `max_episode_steps` caps each (None: the env's limit).
      every_seconds: wall-clock seconds between evaluations in `run`.
      start_time: the program's start (`time.time()`), so records share one clock.
      runtime: what runs both evaluated policies, the actors' runtime (`jax` or `onnx`): the actor
        precision's policy is then evaluated as the actors run it, and a slow JAX int8 call at
        batch 1 does not take the cores the actors need.
    """

    def __init__(
        self,
        agent_factory: Callable[[Any, Any], DistributedAgent],
        observation_spec,
        action_spec,
        env_id: str,
        env_options: Optional[dict],
        seed: int,
        actor_precision: str,
        learner,
        broadcaster,
        counter,
        episodes: int = 5,
        every_seconds: float = 10.0,
        start_time: Optional[float] = None,
        max_episode_steps: Optional[int] = None,
        xla_threads: int = 1,
        runtime: str = "jax",
    ):
        jax_runtime.configure_jax(xla_threads)
        self._agent = agent_factory(observation_spec, action_spec)
        self._env_id, self._env_options = env_id, dict(env_options or {})
        self._seed = seed + EVAL_SEED_OFFSET
        self._actor_precision = weights.check_precision(actor_precision, weights.ACTOR_PRECISIONS, "actor precision")
        observation = (observation_spec.shape, observation_spec.dtype)
        self._fp32_policies = PolicyCache(self._agent, "fp32", runtime, *observation)
        self._actor_policies = PolicyCache(self._agent, self._actor_precision, runtime, *observation)
        self._weight_spec = weights.policy_weight_spec(self._agent, observation_spec)
        self._learner, self._broadcaster, self._counter = learner, broadcaster, counter
        self._episodes, self._every_seconds = int(episodes), float(every_seconds)
        self._max_episode_steps = max_episode_steps
        self._start_time = time.time() if start_time is None else float(start_time)
        self._lock = threading.Lock()
        self._records: list[dict] = []
        self._evaluated_version = -1
        self._stop = threading.Event()
        self._seconds = 0.0

    def evaluate_now(self) -> Optional[dict]:
        """Evaluates the latest publish (if any) and returns its record (None before the first)."""
        version, fp32_params = self._learner.call("get_variables_version")
        if fp32_params is None:
            return None
        tick = time.perf_counter()
        counts = self._counter.call("get_counts")
        wall_seconds = time.time() - self._start_time
        fp32_return = self._evaluate(self._fp32_policies, fp32_params, weights.DEFAULT_ACTOR_INT8_SCHEME)
        published = self._broadcaster.call("pull", -1)
        message = (self._weight_spec.check(weights.decode(published[1], self._weight_spec.max_message_bytes))
                   if published is not None else None)
        if message is None or (self._actor_precision == "fp32" and message.precision == "fp32"):
            actor_return = fp32_return  # the actors run exactly the fp32 params
        else:
            actor_return = self._evaluate(self._actor_policies, weights.load(message, self._actor_precision),
                                          message.int8_scheme)
        record = {
            "wall_seconds": wall_seconds,
            "learner_steps": int(counts.get("learner_steps", 0)),
            "actor_steps": int(counts.get("actor_steps", 0)),
            "episodes": int(counts.get("episodes", 0)),
            "version": int(version),
            "return_fp32": fp32_return,
            "return_actor": actor_return,
        }
        with self._lock:
            self._records.append(record)
            self._evaluated_version = version
        self._counter.notify("set", last_return_fp32=fp32_return, last_return_actor=actor_return)
        self._seconds += time.perf_counter() - tick
        return record

    def set_start_time(self, start_time: float) -> None:
        """The program's start on the `time.time()` clock (set once every node is ready)."""
        self._start_time = float(start_time)

    def records(self, since: int = 0) -> list[dict]:
        """Records from index `since` on (the driver polls new ones)."""
        with self._lock:
            return list(self._records[since:])

    def run(self) -> None:
        """Evaluates every `every_seconds` until `stop()`."""
        while not self._stop.wait(self._every_seconds):
            self.evaluate_now()

    def stop(self) -> None:
        self._stop.set()

    def pid(self) -> int:
        return os.getpid()

    def stats(self) -> dict:
        return {
            "evaluations": len(self._records),
            "seconds": self._seconds,
            "process_cpu_seconds": process_cpu_seconds(),
        }

    def _evaluate(self, policies: PolicyCache, params: dict, int8_scheme: str) -> float:
        policy, _ = policies.for_scheme(int8_scheme, params)
        params = policy.prepare(params)
        result = evaluation.evaluate(
            lambda observations: policy(params, observations),
            self._env_id, self._episodes, self._seed, self._max_episode_steps, self._env_options,
        )
        return float(result.mean)
