"""Distributed Distributional DDPG: a categorical critic on n-step returns (Barth-Maron et al.,
2018), with Acme's defaults.

See README.md in this folder for the papers, defaults and deviations.
"""

from agents.d4pg import acting, learning
from agents.d4pg.config import PRESETS, Config, config_for
from agents.d4pg.learning import TrainState
from agents.d4pg.training import AGENT, build, check_env, train

init_state, policy_params, policy_spec = AGENT.init_state, AGENT.policy_params, AGENT.policy_spec

__all__ = [
    "AGENT", "PRESETS", "Config", "TrainState", "acting", "build", "check_env", "config_for", "init_state",
    "learning", "policy_params", "policy_spec", "train",
]
