"""Soft Actor-Critic with twin critics and automatic entropy tuning (Haarnoja et al., 2018).

See README.md in this folder for the papers, defaults and deviations.
"""

from agents.sac import acting, learning
from agents.sac.config import PRESETS, Config, config_for
from agents.sac.learning import TrainState
from agents.sac.training import AGENT, build, check_env, train

init_state, policy_params, policy_spec = AGENT.init_state, AGENT.policy_params, AGENT.policy_spec

__all__ = [
    "AGENT", "PRESETS", "Config", "TrainState", "acting", "build", "check_env", "config_for", "init_state",
    "learning", "policy_params", "policy_spec", "train",
]
