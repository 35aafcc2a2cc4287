"""A2C's two training paths over one update (see `qrl.onpolicy`).

`train` runs the host loop for gymnasium / dm_control / Atari ids and the on-device loop for
brax / gymnax ids; `make_train(config, env_id, steps) -> train(key)` is the whole on-device
run as one pure, vmappable function.
"""

from agents.a2c import learning, networks
from agents.a2c.config import validate
from qrl import onpolicy

AGENT = onpolicy.OnPolicyAgent(
    name="a2c",
    make_actor_critic=networks.make_actor_critic,
    init=learning.init,
    make_update=learning.make_update,
    validate=validate,
)
check_env, train, make_train = AGENT.check_env, AGENT.train, AGENT.make_train
