"""Run directories: train an agent into a workdir, restore it, sweep PTQ precisions over it.

The entry points (`launch.train`, `launch.ptq`, `launch.demo`) are flag wrappers over these.
"""

import dataclasses
import os
import shutil
from typing import Any, Mapping, Optional

import qrl
from launch.common import AT_LEAST_1, check_ranges, check_writable_directory, require_workdir
from qrl import envs, io, runtime
from qrl.checkpointing import Checkpointer
from qrl.envs.ids import split_env_id
from qrl.errors import QrlInputError
from qrl.quant import check_quant_delay, parse_precisions
from qrl.quant.report import write_ptq_outputs
from qrl.quant.sweep import run_sweep

CONFIG_FILE = "config.json"
RESULTS_FILE = "results.json"
CHECKPOINT_DIR = "checkpoints"


def prepare_workdir(workdir: str, overwrite: bool) -> None:
    """Creates `workdir`; one that already holds a run is an input error unless overwriting."""
    require_workdir(workdir)
    if os.path.exists(os.path.join(workdir, CONFIG_FILE)):
        if not overwrite:
            raise QrlInputError(f"{workdir} already holds a run; pass --overwrite to replace it")
        shutil.rmtree(workdir)
    os.makedirs(workdir, exist_ok=True)


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

    @property
    def env_id(self) -> str:
        return self.run_config["env"]


def restore_run(workdir: str) -> RestoredRun:
    """Reads `config.json` and restores the latest checkpoint of a `launch.train` run."""
    from agents import get_agent

    require_workdir(workdir, writable=False)
    if not os.path.isdir(workdir):
        raise QrlInputError(f"workdir {workdir} does not exist")
    config_path = os.path.join(workdir, CONFIG_FILE)
    if not os.path.exists(config_path):
        raise QrlInputError(f"{workdir} has no {CONFIG_FILE}: not a launch.train run directory")
    run_config = io.read_json(config_path)
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
    with Checkpointer(os.path.join(workdir, CHECKPOINT_DIR)) as checkpointer:
        state = checkpointer.restore(template)
    return RestoredRun(workdir, run_config, agent, config, state, observation_spec, action_spec)


def check_run_config(config: Any, steps: int, num_envs: Optional[int] = None) -> None:
    """What a training run of `steps` environment steps on `num_envs` environments (None: the
    agent's) asks of an agent config beyond its own ranges: a QAT delay shorter than the run,
    and, for agents whose config sizes the rollout, the agent's checks of that rollout."""
    if config.qat_bits:
        check_quant_delay(config.quant_delay, steps)
    if num_envs is not None and hasattr(config, "num_envs"):
        config.override({"num_envs": num_envs})


def train_run(
    agent_name: str,
    env_id: str,
    steps: int,
    seed: int,
    workdir: str,
    overrides: Optional[Mapping[str, Any]] = None,
    overwrite: bool = False,
    xla_threads: Optional[int] = None,
    **train_options: Any,
) -> dict:
    """Trains `agent_name` on `env_id` into `workdir`: config.json first, results.json last.

    `train_options` go to the agent's `train` (num_envs, eval_episodes, eval_every,
    checkpoint_every, progress). `xla_threads` sizes XLA:CPU's thread pool (None: one thread
    for vector observations, the default pool for images; see `qrl.runtime`).
    """
    from agents import get_agent

    agent = get_agent(agent_name)
    if steps < 1:
        raise QrlInputError(f"steps must be >= 1, got {steps}")
    on_device = split_env_id(env_id)[0] not in envs.HOST_FAMILIES
    if on_device:
        # Making a device env starts JAX's backend: size its thread pool first. One jitted
        # training program per run wants every core.
        runtime.configure_jax(0 if xla_threads is None else xla_threads)
    env = envs.make(env_id, seed=seed)
    agent.check_env(env_id, env.action_spec())
    if not on_device:
        if xla_threads is None:
            xla_threads = runtime.recommended_xla_threads(env.observation_spec().shape)
        runtime.configure_jax(xla_threads)
    env.close()
    config = agent.config_for(env_id, overrides or {})
    check_run_config(config, steps, train_options.get("num_envs"))
    prepare_workdir(workdir, overwrite)
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
    io.atomic_write_json(os.path.join(workdir, CONFIG_FILE), run_config)
    _, results = agent.train(env_id, config, steps, seed=seed, workdir=workdir, **train_options)
    results = {"config": run_config, **results}
    io.atomic_write_json(os.path.join(workdir, RESULTS_FILE), results)
    return results


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
) -> tuple[dict, dict]:
    """Restores the run in `workdir`, sweeps `precisions` and writes results.json, report.md and
    sweetspot.png into `out_dir` (default WORKDIR/ptq). Returns (sweep, output paths)."""
    parsed = parse_precisions(precisions, activations)
    check_ranges([("episodes", episodes, AT_LEAST_1), ("calibration_steps", calibration_steps, AT_LEAST_1),
                  ("divergence_steps", divergence_steps, AT_LEAST_1), ("max_steps", max_steps, AT_LEAST_1)])
    out_dir = out_dir or os.path.join(workdir, "ptq")
    check_writable_directory(out_dir, "the PTQ output directory")
    runtime.configure_jax()
    restored = restore_run(workdir)
    spec = restored.agent.policy_spec(restored.config, restored.observation_spec, restored.action_spec)
    sweep = run_sweep(
        spec, restored.agent.policy_params(restored.state), restored.env_id, parsed, episodes, seed=seed,
        calibration_steps=calibration_steps, divergence_steps=divergence_steps,
        env_options=restored.run_config.get("env_options", {}), max_steps=max_steps,
    )
    sweep["run"] = {"workdir": workdir, "agent": restored.run_config["agent"], "activations": activations}
    title = f"{restored.run_config['agent']} on {restored.env_id}"
    paths = write_ptq_outputs(sweep, out_dir, title=title)
    return sweep, paths
