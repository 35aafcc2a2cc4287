"""D4RL-style datasets generated here (Fu et al., 2020, "D4RL"), from an agent trained once per env.

    behavior = BehaviorRun(agent, config, "gym:Hopper-v5", steps=1_000_000, seed=0, workdir=w)
    behavior.train()                               # resumable; checkpoints along the way
    arrays = behavior.level_arrays("medium", 1_000_000)   # D4RL step arrays + metadata

D4RL's recipe, followed here: train SAC online and keep checkpoints; `expert` samples the trained
(final) policy, `medium` the checkpoint whose return is a third of the way from random to expert
(D4RL: "about 1/3 of the expert's"; measured from the random return so the rule also holds
where returns are negative), `medium-replay` is what the replay buffer held when training reached
that checkpoint (every training step up to it, uniform warm-up actions included; the most recent
`size` of them when `size` is smaller), `random` samples the randomly initialized policy (the
run's own initialization) and `medium-expert` is half medium, half expert data. Actions are
sampled from the stochastic policy; episodes last at most 1000 steps with `timeouts` set on
truncation. The reference returns stored with every level (`ref_min_score`, `ref_max_score`,
D4RL's names) are the random and expert policies' averages over 100 sampled episodes.

`random` needs no training: asked for before the agent is trained, it is written at once from the
initialization with only the random reference (`references_missing` = "expert" in its metadata);
asked for again once the agent is trained, the cached level gets the expert reference too.

The workdir holds everything a later call reuses, so one training serves every level and an
interrupted run resumes: `training.json` (settings, checkpoints with their evaluated returns,
references: the commit point, written last), `state/` (the latest full train states, orbax),
`policies/step_*.msgpack` (each checkpoint's actor params), `steps/until_*.npz` (the training
steps, one segment per checkpoint) and `levels/<level>-<size>.hdf5` (collected levels). A resumed
training restarts its environments and refills the replay from the logged steps.
"""

import io
import json
import os
import shutil
import time
from typing import Any, Callable, Optional

import flax.serialization
import jax
import numpy as np

import qrl
from qrl import envs, offpolicy
from qrl import io as qrl_io
from qrl.checkpointing import Checkpointer
from qrl.datasets import d4rl
from qrl.datasets.collect import STEP_KEYS, average_return, collect_steps
from qrl.datasets.writers import write_d4rl_hdf5
from qrl.errors import QrlInputError
from qrl.replay import NStepAccumulator, Transition

LEVELS = ("random", "medium", "expert", "medium-replay", "medium-expert")
MEDIUM_FRACTION = 1.0 / 3.0  # D4RL: medium performs at about a third of the expert.
MAX_EPISODE_STEPS = 1000
REFERENCE_EPISODES = 100  # D4RL's reference returns average 100 episodes.
EVAL_SEED = 1_000_000  # checkpoint evaluations: episodes seeded apart from training envs.
REFERENCE_SEED = 1_500_000
COLLECTION_SEED = 2_000_000  # + 100_000 * level index: each level's own environment seeds.
RECORD_FILE = "training.json"


def choose_medium(checkpoints: list[dict], random_return: float, expert_return: float,
                  fraction: float = MEDIUM_FRACTION) -> dict:
    """The checkpoint (not the final one) whose `return_mean` is closest to
    `random + fraction * (expert - random)`; ties go to the earlier one."""
    candidates = checkpoints[:-1]
    if not candidates:
        raise QrlInputError("a medium level needs at least two checkpoints: lower --checkpoint_every")
    target = random_return + fraction * (expert_return - random_return)
    return min(candidates, key=lambda checkpoint: abs(checkpoint["return_mean"] - target))


def steps_to_transitions(arrays: dict, n_step: int, gamma: float) -> Transition:
    """The replay transitions `[N, ...]` a host loop would have stored for these step arrays
    (episodes end at `terminals | timeouts`; terminals cut the bootstrap)."""
    accumulator = NStepAccumulator(n_step, gamma)
    rows: list[Transition] = []
    for index in range(len(arrays["rewards"])):
        terminal, timeout = bool(arrays["terminals"][index]), bool(arrays["timeouts"][index])
        rows.extend(accumulator.add(
            arrays["observations"][index], arrays["actions"][index], arrays["rewards"][index],
            0.0 if terminal else 1.0, arrays["next_observations"][index], terminal or timeout,
        ))
    return jax.tree.map(lambda *values: np.stack(values), *rows)


class StepLog:
    """A host loop observer that records one environment's steps as D4RL rows (row i = step i)."""

    def __init__(self):
        self.rows: dict[str, list] = {key: [] for key in STEP_KEYS}

    def __len__(self) -> int:
        return len(self.rows["rewards"])

    def observe(self, observations, actions, timestep) -> None:
        if timestep.step_type[0] == 0:  # FIRST: a reset, not a transition
            return
        last = bool(timestep.step_type[0] == 2)
        terminal = last and float(timestep.discount[0]) == 0.0
        for key, value in zip(STEP_KEYS, (observations[0], actions[0], timestep.reward[0], terminal,
                                          last and not terminal, timestep.final_observation[0])):
            self.rows[key].append(np.array(value))

    def take(self) -> dict[str, np.ndarray]:
        """The rows recorded since the last `take`, as step arrays."""
        arrays = {key: np.asarray(values, bool if key in ("terminals", "timeouts") else np.float32)
                  for key, values in self.rows.items()}
        self.rows = {key: [] for key in STEP_KEYS}
        return arrays


def _save_npz(path: str, arrays: dict) -> None:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    qrl_io.atomic_write_bytes(path, buffer.getvalue())


def _load_npz(path: str) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as data:
        return {key: data[key] for key in data.files}


def env_versions(env_id: str) -> str:
    """The simulator packages behind `env_id`, with versions (what "env version" means beyond the id)."""
    from importlib.metadata import PackageNotFoundError, version

    family = env_id.split(":", 1)[0]
    packages = {"gym": ("gymnasium", "mujoco"), "dmc": ("dm_control", "mujoco"), "brax": ("brax", "mujoco")}
    found = []
    for package in packages.get(family, ()):
        try:
            found.append(f"{package} {version(package)}")
        except PackageNotFoundError:
            pass
    return ", ".join(found)


class BehaviorRun:
    """One env's behaviour agent (an `offpolicy.AgentFunctions`, SAC for D4RL), trained once in
    `workdir` and sampled into dataset levels. See the module docstring for the files."""

    def __init__(self, agent: offpolicy.AgentFunctions, config, env_id: str, steps: int, seed: int, workdir: str,
                 checkpoint_every: int = 10_000, eval_episodes: int = 5, reference_episodes: int = REFERENCE_EPISODES,
                 medium_fraction: float = MEDIUM_FRACTION, env_options: Optional[dict] = None):
        for name, value in (("steps", steps), ("checkpoint_every", checkpoint_every),
                            ("eval_episodes", eval_episodes), ("reference_episodes", reference_episodes)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise QrlInputError(f"{name} must be a positive integer, got {value!r}")
        if not 0.0 < medium_fraction < 1.0:
            raise QrlInputError(f"medium_fraction must be in (0, 1), got {medium_fraction}")
        self.agent, self.config, self.env_id, self.seed = agent, config, env_id, int(seed)
        self.steps, self.checkpoint_every = int(steps), int(checkpoint_every)
        self.eval_episodes, self.reference_episodes = int(eval_episodes), int(reference_episodes)
        self.medium_fraction = float(medium_fraction)
        self.env_options = dict(env_options or {})
        self.workdir = os.path.abspath(workdir)
        env = envs.make(env_id, seed=self.seed, **self.env_options)
        self.observation_spec, self.action_spec = env.observation_spec(), env.action_spec()
        env.close()
        agent.check_env(env_id, self.action_spec)
        built = agent.build(config, self.observation_spec, self.action_spec)
        self.act = built.act(None)  # (params, observations, noise) -> sampled actions
        self.settings = {
            "env_id": env_id, "env_options": self.env_options, "algorithm": agent.name, "steps": self.steps,
            "seed": self.seed, "checkpoint_every": self.checkpoint_every, "eval_episodes": self.eval_episodes,
            "reference_episodes": self.reference_episodes, "medium_fraction": self.medium_fraction,
            "config": config.to_dict(),
        }
        self.record = self._read_record()

    # ----- the record ---------------------------------------------------------------------

    def _path(self, *parts: str) -> str:
        return os.path.join(self.workdir, *parts)

    def _read_record(self) -> dict:
        path = self._path(RECORD_FILE)
        if not os.path.exists(path):
            return {"settings": qrl_io.to_json_compatible(self.settings), "checkpoints": [], "done": False,
                    "resumed_at": [], "train_seconds": 0.0, "qrl_version": qrl.__version__}
        record = qrl_io.read_json(path)
        expected = qrl_io.to_json_compatible(self.settings)
        if record.get("settings") != expected:
            differing = sorted(key for key in set(expected) | set(record.get("settings", {}))
                               if record.get("settings", {}).get(key) != expected.get(key))
            raise QrlInputError(f"{self.workdir} holds a behaviour run with other settings "
                                f"({', '.join(differing)}); use another --workdir")
        return record

    def _write_record(self) -> None:
        qrl_io.atomic_write_json(self._path(RECORD_FILE), self.record)

    @property
    def trained(self) -> bool:
        return bool(self.record["done"])

    # ----- training -----------------------------------------------------------------------

    def _template_state(self):
        return self.agent.init_state(self.config, self.observation_spec, self.action_spec, self.seed)

    def policy_params(self, step: int):
        """The actor params saved at checkpoint `step` (0: the initialization)."""
        template = self.agent.policy_params(self._template_state())
        if step == 0:
            return template
        with open(self._path("policies", f"step_{step:09d}.msgpack"), "rb") as handle:
            return flax.serialization.from_bytes(template, handle.read())

    def logged_steps(self, until: int) -> dict[str, np.ndarray]:
        """The training steps `[0, until)` as step arrays (a resume point ends its episode)."""
        ends = [checkpoint["step"] for checkpoint in self.record["checkpoints"] if checkpoint["step"] <= until]
        if until not in ends:
            raise QrlInputError(f"no logged training steps end at step {until}")
        segments = [_load_npz(self._path("steps", f"until_{end:09d}.npz")) for end in ends]
        arrays = {key: np.concatenate([segment[key] for segment in segments]) for key in STEP_KEYS}
        for resumed in self.record["resumed_at"]:
            if 0 < resumed <= until and not arrays["terminals"][resumed - 1]:
                arrays["timeouts"][resumed - 1] = True
        return arrays

    def train(self, progress: bool = True) -> dict:
        """Trains (or resumes) the behaviour agent to `steps`, checkpointing every
        `checkpoint_every` steps; then measures the reference returns. Returns the record."""
        if not self.trained:
            self._train(progress)
        if "references" not in self.record:
            self.record["references"] = self._references()
            self._write_record()
        return self.record

    def _train(self, progress: bool) -> None:
        os.makedirs(self._path("policies"), exist_ok=True)
        os.makedirs(self._path("steps"), exist_ok=True)
        start = None
        resume_step = self.record["checkpoints"][-1]["step"] if self.record["checkpoints"] else None
        if resume_step is not None:
            self._drop_states_after(resume_step)
        checkpointer = Checkpointer(self._path("state"), max_to_keep=2)
        if resume_step is not None:
            step = resume_step
            state = checkpointer.restore(self._template_state(), step=step)
            replay = steps_to_transitions(self.logged_steps(step), self.config.n_step, self.config.gamma)
            start = offpolicy.HostStart(state, step, replay)
            self.record["resumed_at"].append(step)
            self._write_record()
        log = StepLog()
        started = time.perf_counter()
        previous_seconds = float(self.record["train_seconds"])

        def observe(env_steps, state, observations, actions, timestep):
            log.observe(observations, actions, timestep)
            if env_steps % self.checkpoint_every and env_steps < self.steps:
                return
            params = self.agent.policy_params(state)
            result = average_return(self.env_id, self.act, params, self.eval_episodes, self.seed + EVAL_SEED,
                                    max_episode_steps=MAX_EPISODE_STEPS, env_options=self.env_options)
            checkpointer.save(env_steps, state)
            qrl_io.atomic_write_bytes(self._path("policies", f"step_{env_steps:09d}.msgpack"),
                                      flax.serialization.to_bytes(params))
            _save_npz(self._path("steps", f"until_{env_steps:09d}.npz"), log.take())
            self.record["checkpoints"].append(
                {"step": env_steps, "return_mean": result.mean, "return_std": result.std})
            self.record["train_seconds"] = previous_seconds + time.perf_counter() - started
            self._write_record()

        offpolicy.train_host(
            self.agent.build, self.agent.check_env, self.config, self.env_id, self.steps, seed=self.seed,
            num_envs=1, eval_episodes=self.eval_episodes, progress=progress, env_options=self.env_options,
            observer=observe, start=start,
        )
        checkpointer.close()
        self.record["done"] = True
        self._write_record()

    def _drop_states_after(self, step: int) -> None:
        """Removes train states saved after the record's last checkpoint (an interrupted save)."""
        directory = self._path("state")
        for name in os.listdir(directory) if os.path.isdir(directory) else ():
            if name.isdigit() and int(name) > step:
                shutil.rmtree(os.path.join(directory, name))

    def _reference(self, step: int) -> dict:
        """The return of the policy at checkpoint `step` (0: the initialization) over `reference_episodes`."""
        result = average_return(self.env_id, self.act, self.policy_params(step), self.reference_episodes,
                                self.seed + REFERENCE_SEED, max_episode_steps=MAX_EPISODE_STEPS,
                                env_options=self.env_options)
        return {"step": step, "return_mean": result.mean, "return_std": result.std, "episodes": self.reference_episodes}

    def _references(self) -> dict:
        """Random (initialization) and expert (final) policies' returns over `reference_episodes`."""
        random = self.record.get("random_reference") or self._reference(0)
        return {"random": random, "expert": self._reference(self.record["checkpoints"][-1]["step"])}

    def known_references(self) -> dict:
        """The references measured so far: both once trained; before training only the random
        policy's (the initialization needs no training), measured once and kept in the record."""
        if "references" in self.record:
            return self.record["references"]
        if "random_reference" not in self.record:
            self.record["random_reference"] = self._reference(0)
            os.makedirs(self.workdir, exist_ok=True)
            self._write_record()
        return {"random": self.record["random_reference"]}

    def medium_checkpoint(self) -> dict:
        references = self.record["references"]
        return choose_medium(self.record["checkpoints"], references["random"]["return_mean"],
                             references["expert"]["return_mean"], self.medium_fraction)

    def write_bundle(self, destination: str) -> list[str]:
        """Writes what every level of this trained run is made from into the new directory
        `destination`: `training.json`, the medium and final policies and the training steps up
        to the medium checkpoint (compressed npz). A `BehaviorRun` with the same settings and
        `workdir=destination` collects every level from it without training, so the datasets
        can be rebuilt where training them again would take an hour. Written into a temporary
        directory beside `destination` and renamed; returns the relative paths written."""
        if not self.trained or "references" not in self.record:
            raise QrlInputError(f"{self.workdir}: the behaviour agent is not trained yet, so it has no bundle")
        destination = os.path.abspath(destination)
        if os.path.lexists(destination):
            raise QrlInputError(f"bundle destination {destination} exists; choose a new directory")
        medium, final = self.medium_checkpoint()["step"], self.record["checkpoints"][-1]["step"]
        files = [RECORD_FILE, *(os.path.join("policies", f"step_{step:09d}.msgpack") for step in sorted({medium, final}))]
        segments = [os.path.join("steps", f"until_{checkpoint['step']:09d}.npz")
                    for checkpoint in self.record["checkpoints"] if checkpoint["step"] <= medium]
        staging = destination + ".partial"
        if os.path.lexists(staging):
            raise QrlInputError(f"{staging} exists (an interrupted bundle?); remove it first")
        try:
            for relative in files:
                os.makedirs(os.path.dirname(os.path.join(staging, relative)), exist_ok=True)
                shutil.copyfile(self._path(relative), os.path.join(staging, relative))
            os.makedirs(os.path.join(staging, "steps"), exist_ok=True)
            for relative in segments:
                buffer = io.BytesIO()
                np.savez_compressed(buffer, **_load_npz(self._path(relative)))
                with open(os.path.join(staging, relative), "wb") as handle:
                    handle.write(buffer.getvalue())
            os.rename(staging, destination)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        return files + segments

    # ----- levels -------------------------------------------------------------------------

    def level_arrays(self, level: str, size: Optional[int], num_envs: int = 10,
                     progress: Optional[Callable[[str], None]] = None) -> dict[str, Any]:
        """The step arrays of `level` with `size` transitions (`medium-replay`: None = all the
        steps up to the medium checkpoint), plus a `metadata` dict; cached in `levels/`.
        `progress(message)` hears what is being collected, and turns on a collection bar."""
        if level not in LEVELS:
            raise QrlInputError(f"unknown level {level!r}; levels: {', '.join(LEVELS)}")
        if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
            raise QrlInputError(f"size must be a positive integer, got {size!r}")
        if size is None and level != "medium-replay":
            raise QrlInputError(f"level {level} needs a size")
        if level != "random" and (not self.trained or "references" not in self.record):
            raise QrlInputError(f"{self.workdir}: the behaviour agent is not trained yet (call train())")
        path = self._path("levels", f"{level}-{'all' if size is None else size}.hdf5")
        if os.path.exists(path):
            cached = d4rl.read_hdf5(path)
            if level == "random" and "references" in self.record \
                    and d4rl.metadata_value(cached["metadata"], "ref_max_score") is None:
                return self._with_references(path, cached)  # written before the expert existed
            return cached
        if progress:
            progress(f"collecting {level} ({size or 'all'} steps) on {self.env_id}")
        started = time.perf_counter()
        if level == "medium-expert":
            halves = [self.level_arrays(part, count, num_envs, progress)
                      for part, count in (("medium", size // 2), ("expert", size - size // 2)) if count]
            arrays = {key: np.concatenate([half[key] for half in halves]) for key in STEP_KEYS}
            details = {"policy_step": "+".join(str(d4rl.metadata_value(half["metadata"], "policy_step"))
                                               for half in halves),
                       "policy_return": float(np.mean([d4rl.metadata_value(half["metadata"], "policy_return")
                                                       for half in halves])),
                       "collection_seed": "+".join(str(d4rl.metadata_value(half["metadata"], "collection_seed"))
                                                   for half in halves)}
        elif level == "medium-replay":
            medium = self.medium_checkpoint()
            arrays = self.logged_steps(medium["step"])
            if size is not None:
                arrays = {key: values[-size:] for key, values in arrays.items()}
            if not (arrays["terminals"][-1] or arrays["timeouts"][-1]):
                arrays["timeouts"][-1] = True
            returns, _ = d4rl.episode_returns(arrays, MAX_EPISODE_STEPS)
            details = {"policy_step": medium["step"], "checkpoint_return": medium["return_mean"], "collection_seed": -1,
                       "policy_return": float(returns.mean()) if len(returns) else float("nan")}
        else:
            step = {"random": lambda: 0, "medium": lambda: self.medium_checkpoint()["step"],
                    "expert": lambda: self.record["checkpoints"][-1]["step"]}[level]()
            seed = self.seed + COLLECTION_SEED + 100_000 * LEVELS.index(level)
            arrays, stats = collect_steps(self.env_id, self.act, self.policy_params(step), size, seed,
                                          num_envs=num_envs, max_episode_steps=MAX_EPISODE_STEPS,
                                          env_options=self.env_options, progress=progress is not None)
            returns = stats["episode_returns"]
            details = {"policy_step": step, "collection_seed": seed,
                       "policy_return": float(returns.mean()) if len(returns) else float("nan")}
        metadata = self.metadata(level, details, time.perf_counter() - started)
        os.makedirs(self._path("levels"), exist_ok=True)
        write_d4rl_hdf5(path, arrays, metadata)
        return d4rl.read_hdf5(path)

    def _with_references(self, path: str, cached: dict) -> dict:
        """A cached level rewritten with both references in its metadata (same steps)."""
        stored = cached.pop("metadata")
        metadata = {key: d4rl.metadata_value(stored, key) for key in stored}
        metadata.update(self._reference_metadata())
        write_d4rl_hdf5(path, cached, metadata)
        return d4rl.read_hdf5(path)

    def _reference_metadata(self) -> dict[str, Any]:
        """`ref_min_score` / `ref_max_score` as far as they are known, and `references_missing`
        ("expert" for a random level written before the behaviour agent was trained, else "")."""
        references = self.known_references()
        metadata = {"ref_min_score": references["random"]["return_mean"], "references_missing": ""}
        if "expert" in references:
            metadata["ref_max_score"] = references["expert"]["return_mean"]
        else:
            metadata["references_missing"] = "expert"
        return metadata

    def metadata(self, level: str, details: dict, seconds: float) -> dict[str, Any]:
        """What every generated level records (flat scalars and strings, for both formats)."""
        return {
            "env_id": self.env_id,
            "env_versions": env_versions(self.env_id),
            "level": level,
            **details,
            **self._reference_metadata(),
            "reference_episodes": self.reference_episodes,
            "algorithm_name": self.agent.name.upper(),
            "algorithm_steps": self.steps,
            "algorithm_config": json.dumps(qrl_io.to_json_compatible(self.config.to_dict()), sort_keys=True),
            "training_seed": self.seed,
            "medium_fraction": self.medium_fraction,
            "max_episode_steps": MAX_EPISODE_STEPS,
            "generation_seconds": float(seconds),
            "qrl_version": qrl.__version__,
        }
