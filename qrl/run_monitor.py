"""Bookkeeping every host training loop shares: metrics, progress, evaluation, checkpoints.

A loop owns its environments, acting and updates; it tells the monitor when an episode ends and
how many environment steps it has taken, and the monitor writes `metrics.csv` / TensorBoard
rows every `log_every` steps, evaluates the deterministic policy every `eval_every` steps,
checkpoints every `checkpoint_every` steps, and at the end evaluates, checkpoints and returns
the run's results dict.
"""

import csv
import dataclasses
import io
import os
import time
from typing import Any, Callable, Optional, Sequence

import numpy as np

from qrl import evaluation
from qrl import io as qrl_io
from qrl.checkpointing import Checkpointer
from qrl.errors import QrlInputError
from qrl.logging import MetricsLogger, ProgressBar

EVAL_SEED_OFFSET = 1_000_000  # evaluation episodes never share seeds with training envs.
RECENT_EPISODES = 10  # the logged training return averages this many latest episodes.


@dataclasses.dataclass(frozen=True)
class HostStart:
    """Where a host run resumes: a train state, the environment steps already taken, the
    transitions to refill the replay with (a `qrl.replay.Transition` of `[N, ...]` arrays; None
    for none) and the evaluations made before (kept in the results).

    The environments and the host random stream start afresh, and a replay not given starts
    empty: a resumed run continues the learning, not the exact trajectory an uninterrupted run
    would have taken.
    """

    state: Any
    env_steps: int
    replay: Optional[Any] = None
    evaluations: Sequence[dict] = ()


class TrainingMonitor:
    """Logging, progress, evaluation and checkpointing of one host training run.

    `policy` maps observations `[B, ...]` (numpy) to environment actions `[B, ...]`; it should
    read the learner's current params through a closure, so evaluations see the latest policy.
    With no `workdir` nothing is written to disk (metrics are still summarized in the results).
    A resumed run passes `start_steps` (the environment steps already taken; logging, evaluation
    and checkpoint schedules continue after it, and metrics.csv rows past it are dropped) and
    the `evaluations` made before.
    """

    def __init__(
        self,
        agent: str,
        env_id: str,
        steps: int,
        seed: int,
        workdir: Optional[str],
        policy: Callable[[np.ndarray], Any],
        eval_episodes: int = 10,
        eval_every: int = 0,
        checkpoint_every: int = 0,
        log_every: int = 1_000,
        progress: bool = True,
        env_options: Optional[dict] = None,
        start_steps: int = 0,
        evaluations: Sequence[dict] = (),
    ):
        self.agent, self.env_id, self.steps, self.seed = agent, env_id, steps, seed
        self.policy = policy
        self.eval_episodes, self.eval_every = eval_episodes, eval_every
        self.checkpoint_every, self.log_every = checkpoint_every, max(1, log_every)
        self.env_options = env_options or {}
        if workdir and start_steps:
            _drop_metrics_after(os.path.join(workdir, "metrics.csv"), int(start_steps))
        self.logger = MetricsLogger(workdir) if workdir else None
        self.checkpointer = Checkpointer(os.path.join(workdir, "checkpoints")) if workdir else None
        self.bar = ProgressBar(steps, desc=f"{agent} {env_id}", disable=None if progress else True)
        self.episode_returns: list[float] = []
        self.evaluations: list[dict] = [dict(record) for record in evaluations]
        self.last_train_metrics: dict = {}
        self.start_steps = int(start_steps)
        self._next_log = _first_multiple_after(self.log_every, self.start_steps)
        self._next_eval = _first_multiple_after(eval_every, self.start_steps) if eval_every > 0 else None
        self._next_checkpoint = (
            _first_multiple_after(checkpoint_every, self.start_steps) if checkpoint_every > 0 else None
        )
        if self.start_steps:
            self.bar.update(min(self.start_steps, steps))
        self._start = time.perf_counter()

    def episode_finished(self, episode_return: float) -> None:
        """Records the undiscounted return of a finished training episode."""
        self.episode_returns.append(float(episode_return))

    def evaluate(self) -> evaluation.EvalResult:
        """The current policy's return over `eval_episodes` episodes seeded `seed + 1e6 + i`."""
        return evaluation.evaluate(
            self.policy, self.env_id, self.eval_episodes, seed=self.seed + EVAL_SEED_OFFSET,
            env_options=self.env_options,
        )

    def step(self, env_steps: int, state: Any, train_metrics: Optional[dict] = None, config: Any = None,
             extra_metrics: Optional[dict] = None) -> None:
        """Call after each batch of environment steps: logs, evaluates and checkpoints when due.

        `train_metrics` are the latest update's metrics (kept until new ones arrive);
        `extra_metrics` (e.g. epsilon) are logged with the next row.
        """
        if train_metrics:
            self.last_train_metrics = train_metrics
        if env_steps >= self._next_log or env_steps >= self.steps:
            while self._next_log <= env_steps:
                self._next_log += self.log_every
            self._log_row(env_steps, extra_metrics)
        if self._next_eval is not None and env_steps >= self._next_eval:
            while self._next_eval <= env_steps:
                self._next_eval += self.eval_every
            result = self.evaluate()
            self.evaluations.append({"env_steps": env_steps, **result.to_dict()})
            if self.logger:
                self.logger.write(env_steps, {"eval_return": result.mean, "eval_return_std": result.std})
        if self._next_checkpoint is not None and env_steps >= self._next_checkpoint:
            while self._next_checkpoint <= env_steps:
                self._next_checkpoint += self.checkpoint_every
            self.save(env_steps, state, config)

    def save(self, env_steps: int, state: Any, config: Any = None) -> None:
        """Checkpoints `state` (with the step, the config and the evaluations so far as JSON
        extras) if there is a workdir."""
        if self.checkpointer:
            extra = {"env_steps": env_steps, "evaluations": self.evaluations}
            if config is not None:
                extra["config"] = config.to_dict()
            self.checkpointer.save(env_steps, state, extra=extra)

    def _log_row(self, env_steps: int, extra_metrics: Optional[dict]) -> None:
        elapsed = time.perf_counter() - self._start
        metrics = {
            "episodes": len(self.episode_returns),
            "steps_per_second": (env_steps - self.start_steps) / max(elapsed, 1e-9),
        }
        if self.episode_returns:
            metrics["episode_return"] = float(np.mean(self.episode_returns[-RECENT_EPISODES:]))
        metrics.update(extra_metrics or {})
        metrics.update({key: float(value) for key, value in self.last_train_metrics.items()})
        if self.logger:
            self.logger.write(env_steps, metrics)
        latest = self.episode_returns[-1] if self.episode_returns else None
        self.bar.update(min(env_steps, self.steps), latest_return=latest)

    def finish(self, env_steps: int, state: Any, config: Any = None, updates: int = 0,
               extra: Optional[dict] = None) -> dict:
        """Final evaluation and checkpoint; closes files; returns the run's results dict."""
        train_seconds = time.perf_counter() - self._start
        self.bar.close()
        final = self.evaluate()
        if self.logger:
            self.logger.write(env_steps, {"eval_return": final.mean, "eval_return_std": final.std})
            self.logger.close()
        self.save(env_steps, state, config)
        if self.checkpointer:
            self.checkpointer.close()
        results = {
            "agent": self.agent,
            "env": self.env_id,
            "seed": self.seed,
            "env_steps": env_steps,
            "updates": int(updates),
            "episodes": len(self.episode_returns),
            "train_seconds": train_seconds,
            "steps_per_second": (env_steps - self.start_steps) / max(train_seconds, 1e-9),
            "final_eval": final.to_dict(),
            "evaluations": self.evaluations,
            "last_train_returns": self.episode_returns[-RECENT_EPISODES:],
        }
        if self.start_steps:
            results["resumed_from_step"] = self.start_steps
        results.update(extra or {})
        return results


def _drop_metrics_after(csv_path: str, steps: int) -> None:
    """Rewrites metrics.csv (atomically) without the rows past `steps`: what a killed run logged
    after its last checkpoint, which the resumed run logs again."""
    try:
        with open(csv_path, newline="", encoding="utf-8") as csv_file:
            rows = list(csv.reader(csv_file))
    except FileNotFoundError:
        return
    except (OSError, UnicodeDecodeError, csv.Error) as error:
        raise QrlInputError(f"cannot read {csv_path}: {error}") from error
    if not rows:
        return
    header = rows[0]
    # A row cut short by the kill (fewer fields than the header) is dropped with the later ones.
    kept = [header] + [row for row in rows[1:]
                       if len(row) == len(header) and row[0].isdigit() and int(row[0]) <= steps]
    if len(kept) < len(rows):
        text = io.StringIO()
        csv.writer(text).writerows(kept)
        qrl_io.atomic_write_text(csv_path, text.getvalue())


def _first_multiple_after(every: int, steps: int) -> int:
    """The smallest multiple of `every` above `steps`."""
    return every * (steps // every + 1)
