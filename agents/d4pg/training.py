"""D4PG training: builds the agent's functions for `qrl.offpolicy`'s host and on-device loops."""

from agents.d4pg import acting, learning
from qrl import offpolicy

NAME = "d4pg"

AGENT = offpolicy.AgentFunctions(
    NAME, init=learning.init, make_update=learning.make_update, make_act=acting.make_act,
    make_policy=acting.make_policy, make_policy_network=learning.make_actor,
)
build, check_env, train = AGENT.build, AGENT.check_env, AGENT.train
