"""What the entry points share: run directories, flag parsing helpers, restoring a run."""

import dataclasses
import os
import shutil
from typing import Any, Callable, Optional, Sequence

import jax
from absl import app, flags, logging

from qrl import envs, io
from qrl.checkpointing import Checkpointer
from qrl.errors import QrlInputError, exit_on_input_error, fail

CONFIG_FILE = "config.json"
RESULTS_FILE = "results.json"
CHECKPOINT_DIR = "checkpoints"


def _parse_flags_or_fail(argv: list[str]) -> list[str]:
    """absl flag parsing whose errors (unknown flag, bad enum value) exit with status 2."""
    try:
        return flags.FLAGS(argv)
    except flags.Error as error:
        fail(str(error))


def run_entry_point(run: Callable[[], Any]) -> None:
    """Parses flags, then runs `run`; bad input of either kind is one line and exit status 2."""

    def main(argv: list[str]) -> None:
        logging.set_verbosity(logging.WARNING)
        if len(argv) > 1:
            fail(f"unexpected positional arguments: {' '.join(argv[1:])}")
        exit_on_input_error(run)

    app.run(main, flags_parser=_parse_flags_or_fail)


def synchronous_dispatch() -> None:
    """Synchronous dispatch: host loops make one tiny jitted call per environment step, and
    async dispatch costs more than it hides there (measured ≈65 µs -> ≈12 µs per call)."""
    jax.config.update("jax_cpu_enable_async_dispatch", False)


def require_workdir(workdir: Optional[str]) -> str:
    if not workdir:
        raise QrlInputError("--workdir is required")
    return workdir


def parse_overrides(items: Optional[Sequence[str]]) -> dict:
    """`["lr=0.001", "hidden_sizes=64-64"]` -> `{"lr": "0.001", "hidden_sizes": "64-64"}`."""
    overrides = {}
    for item in items or ():
        key, separator, value = item.partition("=")
        if not separator or not key.strip():
            raise QrlInputError(f"--set expects key=value, got {item!r}")
        overrides[key.strip()] = value.strip()
    return overrides


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

    require_workdir(workdir)
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
    except (KeyError, TypeError) as error:
        raise QrlInputError(f"{config_path} is missing or has a malformed field: {error}") from None
    env = envs.make(env_id, seed=0, **run_config.get("env_options", {}))
    observation_spec, action_spec = env.observation_spec(), env.action_spec()
    env.close()
    template = agent.init_state(config, observation_spec, action_spec)
    with Checkpointer(os.path.join(workdir, CHECKPOINT_DIR)) as checkpointer:
        state = checkpointer.restore(template)
    return RestoredRun(workdir, run_config, agent, config, state, observation_spec, action_spec)
