"""SAC training: builds the agent's functions for `qrl.offpolicy`'s host and on-device loops."""

from agents.sac import acting, learning
from qrl import offpolicy

NAME = "sac"

AGENT = offpolicy.AgentFunctions(
    NAME, init=learning.init, make_update=learning.make_update, make_act=acting.make_act,
    make_policy=acting.make_policy, make_policy_network=learning.policy_network,
)
build, check_env, train = AGENT.build, AGENT.check_env, AGENT.train
