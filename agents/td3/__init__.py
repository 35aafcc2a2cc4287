"""Twin Delayed DDPG: clipped double Q-learning, target policy smoothing, delayed policy updates
(Fujimoto et al., 2018).

See README.md in this folder for the papers, defaults and deviations.
"""

from agents.td3 import acting, learning
from agents.td3.config import PRESETS, Config, config_for
from agents.td3.learning import TrainState
from agents.td3.training import AGENT, build, check_env, train

init_state, policy_params, policy_spec = AGENT.init_state, AGENT.policy_params, AGENT.policy_spec

__all__ = [
    "AGENT", "PRESETS", "Config", "TrainState", "acting", "build", "check_env", "config_for", "init_state",
    "learning", "policy_params", "policy_spec", "train",
]
