"""Deep Deterministic Policy Gradient with target networks and replay (Lillicrap et al., 2016).

See README.md in this folder for the papers, defaults and deviations.
"""

from agents.ddpg import acting, learning
from agents.ddpg.config import PRESETS, Config, config_for
from agents.ddpg.learning import TrainState
from agents.ddpg.training import AGENT, build, check_env, train

init_state, policy_params, policy_spec = AGENT.init_state, AGENT.policy_params, AGENT.policy_spec

__all__ = [
    "AGENT", "PRESETS", "Config", "TrainState", "acting", "build", "check_env", "config_for", "init_state",
    "learning", "policy_params", "policy_spec", "train",
]
