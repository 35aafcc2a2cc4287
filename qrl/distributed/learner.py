"""The learner node: full-precision updates on batches sampled from the replay node, and weight
publishes quantized once for all actors.

Each `step` samples `[K, B]` transitions (blocking while the rate limiter says the actors have
not inserted enough), runs K fused updates in one jitted call, sends new priorities back when
the replay is prioritized, and every `publish_period` updates publishes the policy: the fp32
params are calibrated on the step's observations when the int8 actors' scheme has static
scales, encoded at the communication precision for that scheme and handed to the broadcaster. Timed for the breakdown:
sample wait, update, publish.
"""

import os
import threading
import time
from typing import Any, Callable, Optional, Sequence

import jax
import numpy as np
from flax import serialization

from qrl import runtime
from qrl.checkpointing import Checkpointer
from qrl.distributed import weights
from qrl.distributed.agent import DistributedAgent
from qrl.distributed.counting import process_cpu_seconds
from qrl.quant import FP32, calibrate, parse_precision
from qrl.quant.ptq import needs_calibration
from qrl.replay import Transition

SAMPLE_TIMEOUT_SECONDS = 1.0  # a blocked sample returns this often so the learner can notice stop()
TIMED_PHASES = ("sample_wait", "update", "publish", "checkpoint")
CALIBRATION_OBSERVATIONS = 1024  # observations of the step's batch that calibrate activation ranges


class Learner:
    """The fp32 learner (see the module docstring); Acme's `step` and `get_variables`.

    Args:
      agent_factory: `(observation_spec, action_spec) -> DistributedAgent`, picklable.
      observation_spec, action_spec: the environment's specs.
      seed: seeds the parameters.
      replay, broadcaster, counter: handles of those nodes.
      comm_precision: what publishes carry (fp32, fp16, bf16, int8).
      compress: zlib-compress each publish.
      int8_scheme: the int8 actors' scheme (`weights.ACTOR_INT8_SCHEMES`): int8 publishes are
        quantized to it; a calibrated scheme's ranges are computed at each publish.
      publish_period: updates between publishes.
      prioritized: send the update's priorities back to the replay.
      checkpoint_dir: where `save` writes (None: no checkpoints); `checkpoint_every` updates
        between saves (0: only when asked); `resume`: start from the latest checkpoint there.
      max_steps: stop `run` after this many updates (None: until `stop()`).
      prefetch: request the next batch before training on this one, so the replay's round trip
        overlaps the update (with prioritized replay its priorities then lag one step).
    """

    def __init__(
        self,
        agent_factory: Callable[[Any, Any], DistributedAgent],
        observation_spec,
        action_spec,
        seed: int,
        replay,
        broadcaster,
        counter,
        comm_precision: str = "fp32",
        compress: bool = False,
        int8_scheme: str = weights.DEFAULT_ACTOR_INT8_SCHEME,
        publish_period: int = 100,
        prioritized: bool = False,
        checkpoint_dir: Optional[str] = None,
        checkpoint_every: int = 0,
        resume: bool = False,
        max_steps: Optional[int] = None,
        prefetch: bool = True,
        xla_threads: int = 1,
        device: str = "cpu",
    ):
        runtime.configure_jax(xla_threads)
        self._device = runtime.device_of(device)  # the train state lives there; its updates run there.
        self._agent = agent_factory(observation_spec, action_spec)
        self._prefetch = bool(prefetch)
        self._next_sample = None
        self._comm_precision = weights.check_precision(comm_precision, weights.COMM_PRECISIONS, "communication precision")
        self._compress = bool(compress)
        self._int8_scheme = weights.check_int8_scheme(int8_scheme)
        self._calibrate_ranges = needs_calibration(parse_precision(self._int8_scheme))
        self._publish_period = int(publish_period)
        self._prioritized = bool(prioritized)
        self._replay, self._broadcaster, self._counter = replay, broadcaster, counter
        self._max_steps = max_steps
        self._checkpoint_every = int(checkpoint_every)
        self._checkpointer = Checkpointer(checkpoint_dir) if checkpoint_dir else None

        with jax.default_device(self._device):
            self._state = jax.device_put(self._agent.init(jax.random.PRNGKey(seed)), self._device)
        self.resumed_from: Optional[int] = None
        self.resumed_counts: dict = {}
        if resume and self._checkpointer is not None and self._checkpointer.latest_step() is not None:
            self.resumed_from = self._checkpointer.latest_step()
            self._state = jax.device_put(self._checkpointer.restore(self._state), self._device)
            self.resumed_counts = dict((self._checkpointer.restore_extra() or {}).get("counts", {}))
        self._update = jax.jit(self._agent.update, donate_argnums=0)
        self._fp32_apply = self._agent.policy_network(FP32).apply
        settings = self._agent.replay
        self._batch_size, self._updates_per_step = settings.batch_size, settings.updates_per_step
        self._steps = int(jax.device_get(self._state.updates))  # both agents' states count updates
        self._last_publish = None
        self._last_checkpoint = self._steps
        self._version = 0
        self._lock = threading.Lock()
        self._variables: Optional[dict] = None
        self._variables_version = -1
        self._stop = threading.Event()
        self._seconds = {phase: 0.0 for phase in TIMED_PHASES}
        self._publish_bytes: list[int] = []
        self._encode_seconds: list[float] = []
        self._run_seconds = 0.0
        self._metrics: dict = {}
        self._fp32_bytes = 0

    # ----- Acme's learner interface ---------------------------------------------------------

    def step(self) -> bool:
        """One learner step: K fused updates on a sampled `[K, B]` batch. False when the sample
        timed out (not enough data yet, or the replay closed)."""
        tick = time.perf_counter()
        if self._next_sample is None:
            self._next_sample = self._request_sample()
        sample = self._next_sample.result()
        self._next_sample = None
        sampled = time.perf_counter()
        self._seconds["sample_wait"] += sampled - tick
        if sample is None:
            return False
        if self._prefetch:  # the next batch travels while this one trains (Acme's prefetching)
            self._next_sample = self._request_sample()
        batches = Transition(**sample["transitions"])
        self._state, metrics, priorities = self._update(self._state, batches, np.asarray(sample["weights"], np.float32))
        priorities = np.asarray(priorities)  # waits for the update to finish
        self._metrics = {name: float(value) for name, value in metrics.items()}
        updated = time.perf_counter()
        self._seconds["update"] += updated - sampled
        if self._prioritized:
            self._replay.notify("update_priorities", sample["indices"], priorities)
        self._steps += self._updates_per_step
        self._counter.notify("increment", learner_steps=self._updates_per_step)
        if self._last_publish is None or self._steps - self._last_publish >= self._publish_period:
            self.publish(batches.observation)
        if self._checkpoint_every and self._steps - self._last_checkpoint >= self._checkpoint_every:
            self.checkpoint()
        return True

    def _request_sample(self):
        return self._replay.call_async("sample", self._batch_size, self._updates_per_step, SAMPLE_TIMEOUT_SECONDS)

    def get_variables(self, names: Sequence[str] = ("policy",)) -> list:
        """The latest published fp32 policy params (numpy), one entry per name (Acme's
        signature; the only variable is "policy")."""
        with self._lock:
            variables = self._variables
        for name in names:
            if name != "policy":
                raise KeyError(f"unknown variable {name!r}; the learner serves 'policy'")
        return [variables for _ in names]

    def get_variables_version(self) -> tuple[int, Optional[dict]]:
        """(publish version, fp32 policy params) read together."""
        with self._lock:
            return self._variables_version, self._variables

    # ----- publishing and checkpoints -------------------------------------------------------

    def publish(self, observations: Optional[np.ndarray] = None) -> int:
        """Quantizes the policy once at the communication precision and hands it to the
        broadcaster; `observations [..., obs]` calibrate the activation ranges. Returns bytes sent."""
        tick = time.perf_counter()
        params = serialization.to_state_dict(jax.device_get(self._agent.policy_params(self._state)))
        ranges = None
        if self._calibrate_ranges and observations is not None:
            flat = np.asarray(observations).reshape((-1, *np.shape(observations)[2:]))[:CALIBRATION_OBSERVATIONS]
            ranges = calibrate(self._fp32_apply, params, flat)
        encode_start = time.perf_counter()
        blob = weights.encode(params, self._comm_precision, ranges, self._compress, self._int8_scheme)
        self._encode_seconds.append(time.perf_counter() - encode_start)
        if not self._fp32_bytes:
            self._fp32_bytes = weights.fp32_bytes(params)
        self._broadcaster.call("publish", self._version, blob)
        with self._lock:
            self._variables, self._variables_version = params, self._version
        self._version += 1
        self._last_publish = self._steps
        self._publish_bytes.append(len(blob))
        self._seconds["publish"] += time.perf_counter() - tick
        return len(blob)

    def save(self) -> Any:
        """The train state (Acme's `Saveable.save`); `checkpoint` writes it to disk."""
        return self._state

    def restore(self, state: Any) -> None:
        """Replaces the train state (Acme's `Saveable.restore`), e.g. with a saved one."""
        self._state = state
        self._steps = int(jax.device_get(state.updates))

    def checkpoint(self) -> Optional[int]:
        """Checkpoints the train state (and the counter's counts) at the current update count."""
        if self._checkpointer is None:
            return None
        tick = time.perf_counter()
        counts = self._counter.call("get_counts")
        self._checkpointer.save(self._steps, self._state, extra={"counts": counts})
        self._last_checkpoint = self._steps
        self._seconds["checkpoint"] += time.perf_counter() - tick
        return self._steps

    # ----- node interface -------------------------------------------------------------------

    def run(self, num_steps: Optional[int] = None) -> None:
        """Publishes the current weights, then steps until `stop()`, `max_steps` updates in all,
        or `num_steps` more updates (Acme's `run(num_steps)`)."""
        start = time.perf_counter()
        limit = self._max_steps
        if num_steps is not None:
            limit = self._steps + num_steps if limit is None else min(limit, self._steps + num_steps)
        try:
            self.publish()
            while not self._stop.is_set():
                if limit is not None and self._steps >= limit:
                    break
                self.step()
        finally:
            self._run_seconds += time.perf_counter() - start

    def stop(self) -> None:
        self._stop.set()

    def close(self) -> None:
        if self._checkpointer is not None:
            self._checkpointer.close()

    def pid(self) -> int:
        return os.getpid()

    def stats(self) -> dict:
        timed = self._seconds["sample_wait"] + self._seconds["update"] + self._seconds["publish"]
        return {
            "steps": self._steps,
            "publishes": len(self._publish_bytes),
            "bytes_per_publish": int(np.median(self._publish_bytes)) if self._publish_bytes else 0,
            "fp32_bytes": self._fp32_bytes,
            "encode_seconds_mean": float(np.mean(self._encode_seconds)) if self._encode_seconds else 0.0,
            "run_seconds": self._run_seconds,
            "steps_per_second": self._steps_in_run() / self._run_seconds if self._run_seconds > 0 else 0.0,
            "seconds": {**self._seconds, "other": max(self._run_seconds - timed, 0.0), "total": self._run_seconds},
            "metrics": self._metrics,
            "resumed_from": self.resumed_from,
            "resumed_counts": self.resumed_counts,
            "process_cpu_seconds": process_cpu_seconds(),
        }

    def _steps_in_run(self) -> int:
        return self._steps - (self.resumed_from or 0)
