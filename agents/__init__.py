"""One package per algorithm; `get_agent(name)` returns an agent's package.

Every agent package exposes the same surface, which the entry points rely on:
`Config`, `config_for(env_id, overrides)`, `train(env_id, config, steps, seed, workdir, ...)`,
`init_state(config, observation_spec, action_spec, seed)` (a template for restoring
checkpoints), `policy_params(state)` and `policy_spec(config, observation_spec, action_spec)`
(a `qrl.quant.sweep.PolicySpec` for post-training quantization).
"""

import importlib
from types import ModuleType

from qrl.errors import QrlInputError

AGENT_NAMES = ("dqn", "ppo", "a2c", "ddpg", "td3", "sac", "d4pg")
OFFLINE_AGENT_NAMES = ("bc", "td3_bc", "iql", "bcq")  # trained on datasets by qrl.offline; their own surface (Config, build, train).


def get_agent(name: str) -> ModuleType:
    """The package `agents.<name>`; an unknown name is an input error listing the known ones."""
    if name not in AGENT_NAMES:
        raise QrlInputError(f"unknown agent {name!r}; known agents: {', '.join(AGENT_NAMES)}")
    return importlib.import_module(f"agents.{name}")


def get_offline_agent(name: str) -> ModuleType:
    """The package `agents.<name>` of an offline agent (trained on a dataset by `qrl.offline`)."""
    if name not in OFFLINE_AGENT_NAMES:
        raise QrlInputError(f"unknown offline agent {name!r}; known offline agents: {', '.join(OFFLINE_AGENT_NAMES)}")
    return importlib.import_module(f"agents.{name}")
