"""Advantage actor-critic (synchronous A2C: n-step advantages, one RMSProp step per rollout).

See README.md in this folder for the paper, defaults and deviations.
"""

from agents.a2c import acting, learning, networks
from agents.a2c.config import PRESETS, Config, config_for
from agents.a2c.training import AGENT, check_env, make_train, train
from qrl.onpolicy import TrainState

init_state, policy_params, policy_spec = AGENT.init_state, AGENT.policy_params, AGENT.policy_spec

__all__ = [
    "AGENT", "PRESETS", "Config", "TrainState", "acting", "check_env", "config_for", "init_state", "learning",
    "make_train", "networks", "policy_params", "policy_spec", "train",
]
