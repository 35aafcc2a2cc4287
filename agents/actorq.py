"""The agents ActorQ runs distributed, and the picklable factory its nodes build them with."""

import dataclasses
import importlib
from typing import Any, Mapping

from qrl.distributed import run as distributed_run
from qrl.distributed.agent import DistributedAgent
from qrl.errors import QrlInputError

ACTORQ_AGENTS = ("dqn", "d4pg")


def check_agent(name: str) -> str:
    """`name` if ActorQ runs it, else an input error listing the ones it runs."""
    if name not in ACTORQ_AGENTS:
        raise QrlInputError(f"agent {name!r} does not run distributed; choose one of {', '.join(ACTORQ_AGENTS)}")
    return name


@dataclasses.dataclass(frozen=True)
class AgentFactory:
    """Builds the agent in whichever process calls it (a Ray worker pickles this by value: a
    name, an env id and the config overrides — no functions or arrays)."""

    agent: str
    env_id: str
    overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def config(self):
        """The agent's config: defaults, the env preset, then the overrides."""
        package = importlib.import_module(f"agents.{check_agent(self.agent)}")
        return package.config_for(self.env_id, dict(self.overrides))

    def __call__(self, observation_spec, action_spec) -> DistributedAgent:
        module = importlib.import_module(f"agents.{check_agent(self.agent)}.actorq")
        return module.actorq_agent(self.config(), observation_spec, action_spec, self.env_id)


def actorq_preset(agent: str, name: str) -> "distributed_run.ActorQPreset":
    """The ActorQ preset `name` of `agent` (its `agents/<agent>/actorq.py` `ACTORQ_PRESETS`)."""
    presets = importlib.import_module(f"agents.{check_agent(agent)}.actorq").ACTORQ_PRESETS
    if name not in presets:
        raise QrlInputError(f"--preset: {agent} has no ActorQ preset {name!r}; it has: {', '.join(sorted(presets))}")
    return presets[name]


def with_preset(config: "distributed_run.ActorQConfig", name: str, explicit=()) -> "distributed_run.ActorQConfig":
    """`config` with its agent's preset `name` applied (`qrl.distributed.run.apply_preset`):
    fields named in `explicit` and `config.overrides` keep the caller's values."""
    return distributed_run.apply_preset(config, actorq_preset(config.agent, name), explicit)


def run_actorq(config: "distributed_run.ActorQConfig", workdir: str | None = None, **options) -> dict:
    """`qrl.distributed.run.run_actorq` with this package's agents: the factory comes from the
    config's agent, environment and overrides (the entry point, the study and notebooks use it)."""
    factory = AgentFactory(check_agent(config.agent), config.env, dict(config.overrides))
    return distributed_run.run_actorq(config, factory, workdir, **options)
