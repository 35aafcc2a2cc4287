"""Run directories: train an agent into a workdir, restore it, sweep PTQ precisions over it.

The entry points (`launch.train`, `launch.ptq`, `launch.demo`) are flag wrappers over these.
"""

import dataclasses
import os
from typing import Any, Collection, Mapping, Optional

import numpy as np

import qrl
from launch.common import require_workdir
from qrl import config as qrl_config, envs, io, runtime, workdirs
from qrl.checkpointing import Checkpointer
from qrl.envs.ids import split_env_id
from qrl.errors import QrlInputError
from qrl.ranges import AT_LEAST_1, check_ranges
from qrl.quant import check_quant_delay, parse_precisions
from qrl.quant.qat import calibration_from_ranges
from qrl.quant.report import write_ptq_outputs
from qrl.quant.sweep import run_sweep
from qrl.run_monitor import HostStart

CONFIG_FILE = "config.json"
RESULTS_FILE = "results.json"
CHECKPOINT_DIR = "checkpoints"


@dataclasses.dataclass(frozen=True)
class RestoredRun:
    """A training run read back from its workdir."""

    workdir: str
    run_config: dict
    agent: Any  # the agent package
    config: Any  # the agent's Config
    state: Any  # the restored train state
    observation_spec: Any
    action_spec: Any
    step: int  # the checkpoint's environment steps
    finished: bool  # results.json is there: the run reached its steps

    @property
    def env_id(self) -> str:
        return self.run_config["env"]


def is_finished(workdir: str) -> bool:
    """A run is finished when its results.json is there (written last, atomically)."""
    return os.path.isfile(os.path.join(workdir, RESULTS_FILE))


def restore_run(workdir: str, step: Optional[int] = None, require_finished: bool = False) -> RestoredRun:
    """Reads `config.json` and restores a checkpoint of a `launch.train` run.

    With `step` None, the newest intact checkpoint; with `require_finished`, an unfinished run
    (no results.json) is refused, naming its newest checkpoint step and `--step`. An explicit
    `step` must be one of the checkpoints there.
    """
    from agents import get_agent

    require_workdir(workdir, writable=False)
    if not os.path.isdir(workdir):
        raise QrlInputError(f"workdir {workdir} does not exist")
    config_path, run_config = read_run_config(workdir, "a launch.train")
    try:
        agent = get_agent(run_config["agent"])
        config = agent.Config.from_dict(run_config["agent_config"])
        env_id = run_config["env"]
        env_options = dict(run_config.get("env_options", {}))
    except (KeyError, TypeError, AttributeError) as error:
        raise QrlInputError(f"{config_path} is missing or has a malformed field: {error}") from None
    env = envs.make(env_id, seed=0, **env_options)
    observation_spec, action_spec = env.observation_spec(), env.action_spec()
    env.close()
    template = agent.init_state(config, observation_spec, action_spec)
    finished = is_finished(workdir)
    step, state = restore_checkpoint(workdir, template, step, require_finished and not finished)
    return RestoredRun(workdir, run_config, agent, config, state, observation_spec, action_spec, int(step), finished)


def read_run_config(workdir: str, kind: str) -> tuple[str, dict]:
    """`(path, contents)` of the run's config.json; its absence says the directory is not `kind`
    run directory."""
    config_path = os.path.join(workdir, CONFIG_FILE)
    if not os.path.isfile(config_path):
        raise QrlInputError(f"{workdir} has no {CONFIG_FILE}: not {kind} run directory")
    return config_path, io.read_json(config_path)


def restore_checkpoint(workdir: str, template: Any, step: Optional[int], refuse_unfinished: bool) -> tuple[int, Any]:
    """`(step, state)` of checkpoint `step` under `workdir/checkpoints`, or of the newest intact
    one; with `refuse_unfinished` (no explicit step, no results.json) the run is refused, naming
    its newest checkpoint step and `--step`."""
    with Checkpointer(os.path.join(workdir, CHECKPOINT_DIR)) as checkpointer:
        if step is not None:
            return step, checkpointer.restore(template, step=step)
        newest = checkpointer.latest_step()
        if refuse_unfinished and newest is not None:
            raise QrlInputError(
                f"the run in {workdir} is unfinished (no {RESULTS_FILE}); its newest checkpoint is step "
                f"{newest}: pass --step={newest} to use that checkpoint"
            )
        return checkpointer.restore_newest_intact(template)


def check_run_config(config: Any, steps: int, num_envs: Optional[int] = None) -> None:
    """What a training run of `steps` environment steps on `num_envs` environments (None: the
    agent's) asks of an agent config beyond its own ranges: a QAT delay shorter than the run,
    and, for agents whose config sizes the rollout, the agent's checks of that rollout."""
    if num_envs is not None and hasattr(config, "num_envs"):
        config = config.override({"num_envs": num_envs})
    if config.qat_bits:
        check_quant_delay(config.quant_delay, qrl_config.total_updates(config, steps))


def train_run(
    agent_name: str,
    env_id: str,
    steps: int,
    seed: int,
    workdir: str,
    overrides: Optional[Mapping[str, Any]] = None,
    overwrite: bool = False,
    resume: bool = False,
    xla_threads: Optional[int] = None,
    workdir_kind: str = "train",
    overwritable_kinds: Optional[Collection[str]] = None,
    **train_options: Any,
) -> dict:
    """Trains `agent_name` on `env_id` into `workdir`: config.json first, results.json last.

    `train_options` go to the agent's `train` (num_envs, eval_episodes, eval_every,
    checkpoint_every, progress). `xla_threads` sizes XLA:CPU's thread pool (None: one thread
    for vector observations, the default pool for images; see `qrl.runtime`).

    The workdir is claimed as a `workdir_kind` run (see `qrl.workdirs`): `overwrite` replaces
    qrl's outputs of a run there (of `overwritable_kinds` only, when given). `resume` continues
    the run there instead, from its newest intact checkpoint (see `_resume_start`).
    """
    from agents import get_agent

    if resume and overwrite:
        raise QrlInputError("--resume and --overwrite exclude each other")
    agent = get_agent(agent_name)
    if steps < 1:
        raise QrlInputError(f"steps must be >= 1, got {steps}")
    workdirs.check_path(workdir)
    on_device = split_env_id(env_id)[0] not in envs.HOST_FAMILIES
    if on_device:
        # Making a device env starts JAX's backend: size its thread pool first. One jitted
        # training program per run wants every core.
        runtime.configure_jax(0 if xla_threads is None else xla_threads)
    env = envs.make(env_id, seed=seed)
    agent.check_env(env_id, env.action_spec())
    observation_spec, action_spec = env.observation_spec(), env.action_spec()
    if not on_device:
        if xla_threads is None:
            xla_threads = runtime.recommended_xla_threads(observation_spec.shape)
        runtime.configure_jax(xla_threads)
    env.close()
    config = agent.config_for(env_id, overrides or {})
    check_run_config(config, steps, train_options.get("num_envs"))
    if hasattr(agent, "check_config"):  # what an agent cannot do with this config on this env.
        agent.check_config(env_id, config)
    run_config = {
        "agent": agent_name,
        "env": env_id,
        "env_options": {},
        "steps": steps,
        "seed": seed,
        "train_options": dict(train_options),
        "agent_config": config.to_dict(),
        "qrl_version": qrl.__version__,
    }
    start = None
    if resume:
        if on_device:
            raise QrlInputError(
                f"--resume: {env_id} trains on device in one compiled call, which does not resume from a "
                "checkpoint; start a new run"
            )
        start = _resume_start(agent, config, run_config, workdir, observation_spec, action_spec)
        if is_finished(workdir):
            os.remove(os.path.join(workdir, RESULTS_FILE))  # finished again only when it reaches --steps
    else:
        workdirs.claim(
            workdir, workdir_kind, overwrite, overwritable_kinds,
            hint="pass --resume to continue it or --overwrite to replace its outputs",
        )
    io.atomic_write_json(os.path.join(workdir, CONFIG_FILE), run_config)
    if start is not None:
        train_options["start"] = start
    _, results = agent.train(env_id, config, steps, seed=seed, workdir=workdir, **train_options)
    results = {"config": run_config, **results}
    io.atomic_write_json(os.path.join(workdir, RESULTS_FILE), results)
    return results


RESUME_MUST_MATCH = ("agent", "env", "env_options", "seed", "agent_config")


def _resume_start(agent: Any, config: Any, run_config: dict, workdir: str, observation_spec: Any,
                  action_spec: Any) -> HostStart:
    """Checks that the run in `workdir` can continue as `run_config` and restores where it stopped.

    Refused (one line each): a workdir without a qrl train run, a different agent, environment,
    seed or agent config (every difference listed), a finished run that `steps` does not extend,
    and a checkpoint past `steps`. Nothing is written here.
    """
    workdirs.require_kind(workdir, ("train",), "--resume")
    config_path = os.path.join(workdir, CONFIG_FILE)
    if not os.path.isfile(config_path):
        raise QrlInputError(f"--resume: {workdir} holds no run (no {CONFIG_FILE})")
    saved = io.read_json(config_path)
    current = io.to_json_compatible(run_config)
    differences = []
    for key in RESUME_MUST_MATCH:
        saved_value, current_value = saved.get(key), current.get(key)
        if key == "agent_config" and isinstance(saved_value, dict) and isinstance(current_value, dict):
            differences += [
                f"{key}.{name} ({saved_value.get(name)!r} -> {current_value.get(name)!r})"
                for name in sorted(set(saved_value) | set(current_value))
                if saved_value.get(name) != current_value.get(name)
            ]
        elif saved_value != current_value:
            differences.append(f"{key} ({saved_value!r} -> {current_value!r})")
    if differences:
        raise QrlInputError(f"--resume with a different run than the one in {workdir}: {', '.join(differences)}")
    steps = run_config["steps"]
    if is_finished(workdir):
        finished_steps = io.read_json(os.path.join(workdir, RESULTS_FILE)).get("env_steps", saved.get("steps", 0))
        if finished_steps >= steps:
            raise QrlInputError(
                f"--resume: the run in {workdir} is finished ({finished_steps} steps); pass a larger --steps to "
                "continue it"
            )
    template = agent.init_state(config, observation_spec, action_spec, run_config["seed"])
    with Checkpointer(os.path.join(workdir, CHECKPOINT_DIR)) as checkpointer:
        if checkpointer.latest_step() is None:
            raise QrlInputError(
                f"--resume: the run in {workdir} stopped before its first checkpoint (--checkpoint_every sets how "
                "often it saves); start it again with --overwrite"
            )
        step, state = checkpointer.restore_newest_intact(template)
        extra = checkpointer.restore_extra(step) or {}
    if step > steps:
        raise QrlInputError(f"--resume: the newest checkpoint in {workdir} is at step {step}, past --steps={steps}")
    return HostStart(state, step, evaluations=tuple(extra.get("evaluations", ())))


def ptq_run(
    workdir: str,
    precisions: str,
    episodes: int,
    seed: int = 0,
    activations: str = "static",
    calibration_steps: int = 2048,
    divergence_steps: int = 2048,
    out_dir: Optional[str] = None,
    max_steps: Optional[int] = None,
    step: Optional[int] = None,
    trained_ranges: bool = False,
) -> tuple[dict, dict]:
    """Restores the run in `workdir`, sweeps `precisions` and writes results.json, report.md and
    sweetspot.png into `out_dir` (default WORKDIR/ptq). Returns (sweep, output paths).

    Evaluates checkpoint `step` when given; otherwise the trained policy of a finished run (an
    unfinished one is refused: its newest checkpoint is not the trained policy). The results
    record the step evaluated and whether the run was finished. `trained_ranges`: static scales
    from a QAT run's moving-average ranges (what it trained with) instead of calibration."""
    parsed = parse_precisions(precisions, activations)
    check_ranges([("episodes", episodes, AT_LEAST_1), ("calibration_steps", calibration_steps, AT_LEAST_1),
                  ("divergence_steps", divergence_steps, AT_LEAST_1), ("max_steps", max_steps, AT_LEAST_1)])
    out_dir = out_dir or os.path.join(workdir, "ptq")
    workdirs.check_path(out_dir, "the PTQ output directory")
    runtime.configure_jax()
    restored = restore_run(workdir, step=step, require_finished=True)
    spec = restored.agent.policy_spec(restored.config, restored.observation_spec, restored.action_spec)
    input_ranges = None
    if trained_ranges:
        quant_ranges = getattr(restored.state, "quant_ranges", None)
        if not quant_ranges:
            raise QrlInputError(f"--ranges=trained needs a QAT run; {workdir} holds no trained activation ranges")
        input_ranges = calibration_from_ranges(quant_ranges)
    sweep = run_sweep(
        spec, restored.agent.policy_params(restored.state), restored.env_id, parsed, episodes, seed=seed,
        calibration_steps=calibration_steps, divergence_steps=divergence_steps,
        env_options=restored.run_config.get("env_options", {}), max_steps=max_steps, input_ranges=input_ranges,
    )
    sweep["run"] = {
        "workdir": workdir, "agent": restored.run_config["agent"], "activations": activations,
        "checkpoint_step": restored.step, "run_finished": restored.finished,
    }
    title = f"{restored.run_config['agent']} on {restored.env_id}"
    paths = write_ptq_outputs(sweep, out_dir, title=title)
    return sweep, paths


def export_run(
    workdir: str,
    precision: str,
    out_path: str,
    activations: str = "static",
    calibration_steps: int = 2048,
    probe_steps: int = 1024,
    seed: int = 0,
    step: Optional[int] = None,
    trained_ranges: bool = False,
) -> dict:
    """Exports the trained policy of the run in `workdir` (a `launch.train` run, or an offline
    `launch.prune_offline` run: `launch.prune_runs.export_offline_run`) at `precision` as an ONNX
    model at `out_path` plus its sidecar (`qrl.deploy.export`); returns the sidecar.

    Static activation scales come from the same fp32 rollouts the PTQ sweep calibrates on
    (`seed`, `calibration_steps`), or from a QAT run's trained ranges, so the exported int8
    policy is the one `launch.ptq` evaluates. The model is checked against the JAX policy on
    `probe_steps` states of other fp32 rollouts before it is written (the sidecar's `agreement`)."""
    from qrl.deploy import export as deploy_export
    from qrl.quant.ptq import needs_calibration
    from qrl.quant.sweep import calibration_ranges, fp32_policy_of, probe_states

    (parsed,) = _single_precision(precision, activations)
    check_ranges([("calibration_steps", calibration_steps, AT_LEAST_1), ("probe_steps", probe_steps, AT_LEAST_1)])
    deploy_export.check_out_path(out_path)
    require_workdir(workdir, writable=False)
    marker = workdirs.read_marker(workdir) if os.path.isdir(workdir) else None
    if marker is not None and marker["kind"] == "prune_offline":
        from launch.prune_runs import export_offline_run

        if trained_ranges:
            raise QrlInputError(f"--ranges=trained needs a QAT run; {workdir} is an offline run")
        return export_offline_run(workdir, parsed, out_path, calibration_steps, probe_steps, seed, step)
    runtime.configure_jax()
    restored = restore_run(workdir, step=step, require_finished=step is None)
    spec = restored.agent.policy_spec(restored.config, restored.observation_spec, restored.action_spec)
    params = restored.agent.policy_params(restored.state)
    env_options = restored.run_config.get("env_options", {})
    _, fp32_policy = fp32_policy_of(spec, params)
    input_ranges, ranges_source = None, "none"
    if trained_ranges:
        quant_ranges = getattr(restored.state, "quant_ranges", None)
        if not quant_ranges:
            raise QrlInputError(f"--ranges=trained needs a QAT run; {workdir} holds no trained activation ranges")
        input_ranges, ranges_source = calibration_from_ranges(quant_ranges), "trained"
    elif needs_calibration(parsed):
        input_ranges = calibration_ranges(spec, params, restored.env_id, calibration_steps, seed, env_options, fp32_policy)
        ranges_source = f"calibrated on {calibration_steps} fp32 rollout states (seed {seed + 10_000})"
    fn = deploy_export.policy_function(spec, params, parsed, input_ranges)
    probes = probe_states(spec, params, restored.env_id, probe_steps, seed, env_options, fp32_policy)
    description = {
        "agent": restored.run_config["agent"], "env": restored.env_id, "precision": parsed.name,
        "action": deploy_export.action_description(restored.action_spec),
        "source": {"workdir": os.path.abspath(workdir), "checkpoint_step": restored.step,
                   "run_finished": restored.finished, "activation_ranges": ranges_source},
    }
    return deploy_export.export_policy(fn, restored.observation_spec.shape, out_path, description,
                                       probe_observations=np.asarray(probes, np.float32))


def _single_precision(name: str, activations: str) -> list:
    """One precision name parsed (a list of one), an input error for a list."""
    if "," in str(name):
        raise QrlInputError(f"--precision takes one scheme, not a list: {name!r}")
    return parse_precisions(name, activations)
