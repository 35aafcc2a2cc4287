"""Acme compatibility: the ActorQ nodes keep `acme.core`'s method names and speak `dm_env`.

dm-acme 0.4.0 cannot join requirements.txt: it pins dm-launchpad==0.5.0, which has no wheel for
Python 3.11 (`pip install -r requirements.txt` then fails to resolve). Installed alone with
`pip install --no-deps dm-acme==0.4.0` it changes no pinned package, and its core (`acme.core`,
`acme.specs`, `acme.EnvironmentLoop`) imports once a stand-in `launchpad` module is in
`sys.modules`. So the interface test below always runs, against Acme 0.4.0's signatures written
out by hand from its `acme/core.py`; the EnvironmentLoop test runs where dm-acme is installed.
"""

import concurrent.futures
import importlib.util
import inspect
import sys
import types

import jax
import numpy as np
import pytest
from flax import serialization

from agents.actorq import AgentFactory
from qrl import envs
from qrl.distributed import weights
from qrl.distributed.actor import Actor
from qrl.distributed.broadcaster import Broadcaster
from qrl.distributed.counting import Counter
from qrl.distributed.handles import LocalHandle
from qrl.distributed.learner import Learner
from qrl.distributed.rate_limiters import MinSize
from qrl.distributed.replay import ReplayServer

ENV_ID = "gym:CartPole-v1"
NO_DEFAULT = inspect.Parameter.empty

# dm-acme 0.4.0, acme/core.py: {interface: {method: ((parameter, default), ...)}} (self left out).
ACME_0_4_0 = {
    "Actor": {
        "select_action": (("observation", NO_DEFAULT),),
        "observe_first": (("timestep", NO_DEFAULT),),
        "observe": (("action", NO_DEFAULT), ("next_timestep", NO_DEFAULT)),
        "update": (("wait", False),),
    },
    "VariableSource": {"get_variables": (("names", NO_DEFAULT),)},
    "Learner": {
        "step": (),
        "run": (("num_steps", None),),
        "save": (),
        "restore": (("state", NO_DEFAULT),),
    },
}
OURS = {"Actor": Actor, "VariableSource": Learner, "Learner": Learner}


def _acme_methods():
    for interface, methods in ACME_0_4_0.items():
        for method, parameters in methods.items():
            yield pytest.param(interface, method, parameters, id=f"{interface}.{method}")


def _parameters(function) -> tuple:
    """`((name, default), ...)` of a method, without `self`."""
    return tuple((p.name, p.default) for p in inspect.signature(function).parameters.values() if p.name != "self")


@pytest.mark.parametrize("interface, method, acme_parameters", _acme_methods())
def test_our_nodes_keep_acme_method_signatures(interface, method, acme_parameters):
    """Same parameter names in the same order; where Acme gives a default, the same default.
    (A default Acme lacks is allowed: e.g. our `get_variables(names=("policy",))`.)"""
    ours = getattr(OURS[interface], method, None)
    assert ours is not None, f"qrl {OURS[interface].__name__} lacks Acme's {interface}.{method}"
    our_parameters = _parameters(ours)
    assert [name for name, _ in our_parameters] == [name for name, _ in acme_parameters]
    for (name, our_default), (_, acme_default) in zip(our_parameters, acme_parameters):
        if acme_default is not NO_DEFAULT:
            assert our_default == acme_default, f"{method}({name}=...) default {our_default!r}, Acme's {acme_default!r}"


@pytest.fixture
def acme(monkeypatch):
    """dm-acme's core, imported with a stand-in `launchpad` (only its stop-handler hooks are used
    by `EnvironmentLoop.run`); skipped where dm-acme is not installed."""
    if importlib.util.find_spec("acme") is None:
        pytest.skip("dm-acme not installed (pip install --no-deps dm-acme==0.4.0)")
    if importlib.util.find_spec("launchpad") is None:
        stand_in = types.ModuleType("launchpad")
        stand_in.register_stop_handler = lambda handler: None
        stand_in.unregister_stop_handler = lambda handler: None
        monkeypatch.setitem(sys.modules, "launchpad", stand_in)
    import acme

    return acme


def test_hand_written_signatures_match_installed_acme(acme):
    for interface, methods in ACME_0_4_0.items():
        for method, parameters in methods.items():
            assert _parameters(getattr(getattr(acme.core, interface), method)) == parameters, f"{interface}.{method}"


def test_our_actor_runs_inside_acme_environment_loop(acme):
    from acme.utils import loggers

    class Records(loggers.Logger):
        def __init__(self):
            self.rows = []

        def write(self, data):
            self.rows.append(dict(data))

        def close(self):
            pass

    class AcmeActor(Actor, acme.core.Actor):
        """Instantiable only if our Actor implements every abstract method of Acme's."""

    factory = AgentFactory("dqn", ENV_ID, {"hidden_sizes": (16,)})
    environment = envs.make(ENV_ID, seed=0)
    spec = acme.make_environment_spec(environment)
    assert spec.observations.shape == (4,) and spec.actions.num_values == 2
    agent = factory(environment.observation_spec(), environment.action_spec())
    params = serialization.to_state_dict(jax.device_get(agent.policy_params(agent.init(jax.random.PRNGKey(0)))))
    replay, broadcaster, counter = ReplayServer(capacity=1000, rate_limiter=MinSize(1)), Broadcaster(), Counter()
    broadcaster.publish(0, weights.encode(params, "fp32"))
    records = Records()
    with concurrent.futures.ThreadPoolExecutor(2) as executor:
        actor = AcmeActor(
            actor_id=0, agent_factory=factory, env_id=ENV_ID, env_options=None, num_envs=1, seed=0,
            actor_precision="int8", noise_scale=0.1, replay=LocalHandle(replay, executor),
            broadcaster=LocalHandle(broadcaster, executor), counter=LocalHandle(counter, executor), insert_chunk=8,
        )
        acme.EnvironmentLoop(environment, actor, logger=records).run(num_episodes=2)
    environment.close()

    assert [row["episodes"] for row in records.rows] == [1, 2]
    lengths = [row["episode_length"] for row in records.rows]
    assert all(length >= 1 for length in lengths)
    assert [float(row["episode_return"]) for row in records.rows] == [float(n) for n in lengths]  # CartPole: +1 a step
    steps = sum(lengths)
    # 1-step transitions, one insert per transition: every step reached the replay and the counter.
    assert replay.size() == steps and replay.stats()["inserted"] == steps
    assert counter.get_counts() == {"actor_steps": steps, "episodes": 2}
    stats = actor.stats()
    assert (stats["steps"], stats["episodes"], stats["loads"], stats["version"]) == (steps, 2, 1, 0)
    batch = replay.sample(batch_size=steps, num_batches=1, timeout=1.0)["transitions"]
    assert batch["observation"].shape == (1, steps, 4) and batch["next_observation"].shape == (1, steps, 4)
    assert set(batch["reward"].ravel().tolist()) == {1.0}
    gamma = agent.replay.gamma  # the accumulator stores gamma^n * discount: 0 at a termination, else gamma.
    assert set(batch["discount"].ravel().tolist()) <= {0.0, float(np.float32(gamma))}
