"""ActorQ nodes in one process: exploration, weighted updates, actor, learner, evaluator, supervise.

Nodes talk through `LocalHandle`s over one thread pool, as under the in-process launcher. Every
node is built with `xla_threads=0` so it leaves this process's XLA thread pool alone.
"""

import concurrent.futures
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import serialization

from agents.actorq import AgentFactory
from agents.d4pg import learning as d4pg_learning
from agents.dqn import learning as dqn_learning
from qrl import envs
from qrl.checkpointing import Checkpointer
from qrl.distributed import weights
from qrl.distributed.actor import ONE_TIME_PHASES as ACTOR_ONE_TIME_PHASES
from qrl.distributed.actor import TIMED_PHASES as ACTOR_PHASES
from qrl.distributed.actor import Actor
from qrl.distributed.agent import epsilon_greedy_explorer, exploration_schedule, gaussian_explorer
from qrl.distributed.broadcaster import Broadcaster
from qrl.distributed.counting import Counter
from qrl.distributed.evaluator import Evaluator
from qrl.distributed.handles import LocalHandle
from qrl.distributed.launching import (
    InProcessBackend, NodeFailure, NodeRef, NodeSpec, Program, check_bind_address, supervise,
)
from qrl.distributed.learner import TIMED_PHASES as LEARNER_PHASES
from qrl.distributed.learner import Learner
from qrl.distributed.rate_limiters import MinSize, SampleToInsertRatio
from qrl.distributed.replay import ReplayServer
from qrl.quant import FP32, calibrate, parse_precision
from qrl.errors import QrlInputError
from qrl.replay import Transition

CARTPOLE, PENDULUM = "gym:CartPole-v1", "gym:Pendulum-v1"
GAMMA = 0.99
# Small DQN on CartPole: K = 2 fused updates of B = 8, 16 items before sampling.
DQN_OVERRIDES = {"hidden_sizes": "16-16", "batch_size": 8, "gradient_steps": 2, "train_freq": 4,
                 "learning_starts": 16, "buffer_size": 1000, "gamma": GAMMA}
D4PG_OVERRIDES = {"actor_hidden_sizes": "16-16", "critic_hidden_sizes": "16-16", "batch_size": 8, "num_atoms": 11,
                  "v_min": -20.0, "v_max": 20.0, "learning_starts": 16, "buffer_size": 1000}
OBS_ABSMAX = 2.54  # every pre-filled observation row has one entry of this magnitude: input scale 0.02.


# ----- shared fixtures ------------------------------------------------------------------------


def env_specs(env_id):
    env = envs.make(env_id, seed=0)
    try:
        return env.observation_spec(), env.action_spec()
    finally:
        env.close()


@pytest.fixture(scope="module")
def cartpole_specs():
    return env_specs(CARTPOLE)


@pytest.fixture(scope="module")
def pool():
    executor = concurrent.futures.ThreadPoolExecutor(8, thread_name_prefix="test-node-call")
    yield executor
    executor.shutdown(wait=True, cancel_futures=True)


def dqn_factory(**overrides):
    return AgentFactory("dqn", CARTPOLE, {**DQN_OVERRIDES, **overrides})


def numpy_params(tree):
    return serialization.to_state_dict(jax.device_get(tree))


def flat(tree):
    return {jax.tree_util.keystr(path): np.asarray(leaf) for path, leaf in jax.tree_util.tree_leaves_with_path(tree)}


def assert_trees_equal(actual, expected, rtol=0.0, atol=0.0):
    actual, expected = flat(actual), flat(expected)
    assert sorted(actual) == sorted(expected)
    for key in expected:
        if rtol == 0.0 and atol == 0.0:
            np.testing.assert_array_equal(actual[key], expected[key], err_msg=key)
        else:
            np.testing.assert_allclose(actual[key], expected[key], rtol=rtol, atol=atol, err_msg=key)


def trees_close(actual, expected, rtol, atol):
    actual, expected = flat(actual), flat(expected)
    return all(np.allclose(actual[key], expected[key], rtol=rtol, atol=atol) for key in expected)


def cartpole_transitions(num_items, seed=0):
    """Random CartPole-shaped transitions (dict of `[n, ...]`); each observation row has one
    entry of magnitude OBS_ABSMAX and the rest inside (-1, 1)."""
    rng = np.random.default_rng(seed)
    observation = rng.uniform(-1, 1, (num_items, 4)).astype(np.float32)
    observation[np.arange(num_items), rng.integers(0, 4, num_items)] = OBS_ABSMAX * rng.choice([-1, 1], num_items)
    return {
        "observation": observation,
        "action": rng.integers(0, 2, num_items).astype(np.int32),
        "reward": np.ones(num_items, np.float32),
        "discount": np.where(rng.random(num_items) < 0.1, 0.0, GAMMA).astype(np.float32),
        "next_observation": rng.uniform(-1, 1, (num_items, 4)).astype(np.float32),
    }


def cartpole_observations(num_steps, seed=0):
    """Observations `[num_steps, 4]` visited by a uniformly random CartPole policy."""
    env = envs.make(CARTPOLE, seed=seed)
    rng = np.random.default_rng(seed)
    observations = []
    timestep = env.reset()
    while len(observations) < num_steps:
        observations.append(np.asarray(timestep.observation))
        timestep = env.step(int(rng.integers(0, 2)))
        if timestep.last():
            timestep = env.reset()
    env.close()
    return np.stack(observations)


# ----- exploration ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "num_actors, expected",
    [
        (1, [0.4]),
        (2, [0.4, 0.00065536]),  # 0.4^1, 0.4^8
        # 0.4^(1 + 7 i / 7) = 0.4^(i + 1)
        (8, [0.4, 0.16, 0.064, 0.0256, 0.01024, 0.004096, 0.0016384, 0.00065536]),
    ],
)
def test_exploration_schedule_is_apex(num_actors, expected):
    np.testing.assert_allclose(exploration_schedule(num_actors, 0.4, 0.4**8), expected, rtol=1e-12)


def test_exploration_schedule_constant_when_first_equals_last():
    assert exploration_schedule(3, 0.3, 0.3) == [0.3, 0.3, 0.3]
    # Ape-X's epsilon for actor 2 of 4: 0.4^(1 + 7 * 2 / 3).
    assert exploration_schedule(4, 0.4, 0.4**8)[2] == pytest.approx(0.4 ** (1 + 14 / 3), rel=1e-12)


def test_epsilon_greedy_explorer():
    make = epsilon_greedy_explorer(num_actions=3)
    actions = np.array([2, 0, 1, 2, 1] * 200, np.int32)
    untouched = make(0.0, np.random.default_rng(0))(actions.copy())
    np.testing.assert_array_equal(untouched, actions)
    replaced = make(1.0, np.random.default_rng(0))(actions.copy())
    assert replaced.dtype == np.int32 and replaced.shape == actions.shape
    assert set(np.unique(replaced)) == {0, 1, 2}
    # Uniform replacements keep the old action 1/3 of the time.
    assert 0.25 < np.mean(replaced == actions) < 0.42
    half = make(0.5, np.random.default_rng(0))(actions.copy())
    assert 0.55 < np.mean(half == actions) < 0.78  # 1 - 0.5 * 2/3 = 2/3


def test_gaussian_explorer():
    low, high = np.array([-1.0, -10.0], np.float32), np.array([1.0, 10.0], np.float32)
    make = gaussian_explorer(low, high)
    actions = np.tile(np.array([[0.5, -3.0]], np.float32), (4000, 1))
    np.testing.assert_array_equal(make(0.0, np.random.default_rng(0))(actions), actions)
    outside = np.array([[2.0, -11.0], [-5.0, 30.0]], np.float32)
    np.testing.assert_array_equal(make(0.0, np.random.default_rng(0))(outside), [[1.0, -10.0], [-1.0, 10.0]])
    noisy = make(0.1, np.random.default_rng(0))(actions)
    assert noisy.dtype == np.float32
    # sigma is in half action ranges: std 0.1 * 1 and 0.1 * 10 (few draws reach the bounds).
    np.testing.assert_allclose(np.std(noisy - actions, axis=0), [0.1, 1.0], rtol=0.1)
    wild = make(5.0, np.random.default_rng(0))(actions)
    assert np.all(wild >= low) and np.all(wild <= high)
    assert np.mean(wild[:, 0] == 1.0) > 0.3 and np.mean(wild[:, 0] == -1.0) > 0.3


# ----- weighted updates -----------------------------------------------------------------------


def dqn_batches(num_batches, batch_size, seed):
    chunk = cartpole_transitions(num_batches * batch_size, seed)
    return Transition(**{name: value.reshape((num_batches, batch_size, *value.shape[1:]))
                         for name, value in chunk.items()})


def take(batch: Transition, rows) -> Transition:
    return jax.tree.map(lambda value: value[:, rows], batch)


@pytest.fixture(scope="module")
def dqn_agent(cartpole_specs):
    """The agent, and its update jitted once for the module (compiles once per batch shape)."""
    agent = dqn_factory()(*cartpole_specs)
    return agent, jax.jit(agent.update)


@pytest.fixture(scope="module")
def d4pg_setup():
    specs = env_specs(PENDULUM)
    agent = AgentFactory("d4pg", PENDULUM, D4PG_OVERRIDES)(*specs)
    return agent, jax.jit(agent.update), specs


def d4pg_batches(num_batches, batch_size, seed):
    rng = np.random.default_rng(seed)
    shape = (num_batches, batch_size)
    return Transition(
        observation=rng.uniform(-1, 1, shape + (3,)).astype(np.float32),
        action=rng.uniform(-2, 2, shape + (1,)).astype(np.float32),
        reward=rng.uniform(-3, 0, shape).astype(np.float32),
        discount=np.full(shape, GAMMA, np.float32),
        next_observation=rng.uniform(-1, 1, shape + (3,)).astype(np.float32),
    )


def test_dqn_weighted_update_with_unit_weights_is_the_plain_update(dqn_agent):
    agent, update = dqn_agent
    config = agent.config
    batches = dqn_batches(2, 8, seed=1)
    state, metrics, priorities = update(agent.init(jax.random.PRNGKey(0)), batches, np.ones((2, 8), np.float32))
    plain = dqn_learning.make_update(dqn_learning.make_network(config, (4,), 2), config)
    plain_state, plain_metrics = plain(agent.init(jax.random.PRNGKey(0)), batches)
    assert int(state.updates) == int(plain_state.updates) == 2
    assert_trees_equal(state, plain_state)
    assert float(metrics["loss"]) == float(plain_metrics["loss"])
    assert priorities.shape == (2, 8)


def _warm_state(agent, update, batches):
    """A state after one update, so Adam's moments make the next step depend on the gradient's
    scale (a first Adam step is ~ lr * sign(gradient) and would hide a wrong denominator)."""
    return update(agent.init(jax.random.PRNGKey(0)), batches, np.ones(batches.reward.shape[:2], np.float32))[0]


def test_dqn_zero_weight_removes_a_transition(dqn_agent):
    agent, update = dqn_agent
    warm = _warm_state(agent, update, dqn_batches(1, 8, seed=2))
    batch = dqn_batches(1, 8, seed=3)
    dropped, kept = 3, [0, 1, 2, 4, 5, 6, 7]
    zero_weight = np.ones((1, 8), np.float32)
    zero_weight[0, dropped] = 0.0
    state, metrics, _ = update(warm, batch, zero_weight)

    # Whatever transition 3 holds, it has no influence.
    garbage = jax.tree.map(np.copy, batch)
    garbage.observation[0, dropped] = [5.0, -5.0, 5.0, -5.0]
    garbage.next_observation[0, dropped] = [-3.0, 3.0, -3.0, 3.0]
    garbage.action[0, dropped] = 1 - garbage.action[0, dropped]
    garbage.reward[0, dropped] = 100.0
    garbage.discount[0, dropped] = 0.0
    garbage_state, garbage_metrics, _ = update(warm, garbage, zero_weight)
    assert_trees_equal(garbage_state.params, state.params, rtol=1e-6, atol=1e-7)
    assert float(garbage_metrics["loss"]) == pytest.approx(float(metrics["loss"]), rel=1e-6)

    # The loss is the mean over all B of w * l: dropping the row and weighting the other 7 by
    # 7/8 gives the same loss and step; an unweighted mean over the 7 a larger one.
    without = take(batch, kept)
    rescaled_state, rescaled_metrics, _ = update(warm, without, np.full((1, 7), 7 / 8, np.float32))
    assert_trees_equal(rescaled_state.params, state.params, rtol=1e-5, atol=1e-6)
    assert float(rescaled_metrics["loss"]) == pytest.approx(float(metrics["loss"]), rel=1e-5)
    plain_state, plain_metrics, _ = update(warm, without, np.ones((1, 7), np.float32))
    assert float(metrics["loss"]) == pytest.approx(7 / 8 * float(plain_metrics["loss"]), rel=1e-5)
    assert not trees_close(plain_state.params, state.params, rtol=1e-5, atol=1e-6)


def test_dqn_priorities_are_the_absolute_td_errors(dqn_agent):
    agent, update = dqn_agent
    config = agent.config
    assert config.double_q
    network = dqn_learning.make_network(config, (4,), 2)
    start = _warm_state(agent, update, dqn_batches(1, 8, seed=4))
    batches = dqn_batches(2, 8, seed=5)
    random_weights = np.random.default_rng(0).uniform(0.1, 1.0, (2, 8)).astype(np.float32)
    _, _, priorities = update(start, batches, random_weights)
    assert priorities.shape == (2, 8) and np.all(np.asarray(priorities) >= 0)

    def abs_td(state, batch: Transition):
        """Double-Q TD errors written out: r + d * Q_target(s', argmax_a Q(s', a)) - Q(s, a)."""
        q = network.apply({"params": state.params}, batch.observation)
        q_next_online = network.apply({"params": state.params}, batch.next_observation)
        q_next_target = network.apply({"params": state.target_params}, batch.next_observation)
        best = jnp.argmax(q_next_online, axis=-1)
        target = batch.reward + batch.discount * jnp.take_along_axis(q_next_target, best[:, None], axis=-1)[:, 0]
        return np.abs(np.asarray(target - jnp.take_along_axis(q, batch.action[:, None], axis=-1)[:, 0]))

    first = jax.tree.map(lambda value: value[0], batches)
    np.testing.assert_allclose(priorities[0], abs_td(start, first), rtol=1e-5, atol=1e-6)
    # The second batch's priorities come from the params after the first update.
    after_first = update(start, jax.tree.map(lambda value: value[:1], batches), random_weights[:1])[0]
    second = jax.tree.map(lambda value: value[1], batches)
    np.testing.assert_allclose(priorities[1], abs_td(after_first, second), rtol=1e-5, atol=1e-6)
    # Priorities do not depend on the importance weights (row 0: same params either way).
    _, _, unit_priorities = update(start, batches, np.ones((2, 8), np.float32))
    np.testing.assert_allclose(unit_priorities[0], priorities[0], rtol=1e-6)


def test_d4pg_weighted_update_with_unit_weights_is_the_plain_update(d4pg_setup):
    agent, update, specs = d4pg_setup
    bounds = (specs[1].minimum.astype(np.float32), specs[1].maximum.astype(np.float32))
    batches = d4pg_batches(2, 8, seed=1)
    state, metrics, priorities = update(agent.init(jax.random.PRNGKey(0)), batches, np.ones((2, 8), np.float32))
    plain_state, plain_metrics = jax.jit(d4pg_learning.make_update(agent.config, bounds))(
        agent.init(jax.random.PRNGKey(0)), batches
    )
    assert int(state.updates) == 2
    assert_trees_equal(state, plain_state)
    assert float(metrics["critic_loss"]) == float(plain_metrics["critic_loss"])
    assert float(metrics["actor_loss"]) == float(plain_metrics["actor_loss"])
    assert priorities.shape == (2, 8)


def test_d4pg_zero_weight_removes_a_transition_from_the_critic(d4pg_setup):
    agent, update, _ = d4pg_setup
    warm = _warm_state(agent, update, d4pg_batches(1, 8, seed=2))
    batch = d4pg_batches(1, 8, seed=3)
    dropped, kept = 5, [0, 1, 2, 3, 4, 6, 7]
    zero_weight = np.ones((1, 8), np.float32)
    zero_weight[0, dropped] = 0.0
    state, metrics, priorities = update(warm, batch, zero_weight)

    # Only the observation enters the (unweighted) actor loss: everything else of a zero-weight
    # transition has no influence on any parameter.
    garbage = jax.tree.map(np.copy, batch)
    garbage.action[0, dropped] = -garbage.action[0, dropped]
    garbage.reward[0, dropped] = -50.0
    garbage.discount[0, dropped] = 0.0
    garbage.next_observation[0, dropped] = [0.9, -0.9, 0.9]
    garbage_state, _, garbage_priorities = update(warm, garbage, zero_weight)
    assert_trees_equal(garbage_state.critic_params, state.critic_params, rtol=1e-6, atol=1e-7)
    assert_trees_equal(garbage_state.actor_params, state.actor_params, rtol=1e-6, atol=1e-7)
    assert not np.isclose(garbage_priorities[0, dropped], priorities[0, dropped])

    # Critic: mean over all B of w * l == the 7 others weighted 7/8.
    without = take(batch, kept)
    rescaled_state, _, _ = update(warm, without, np.full((1, 7), 7 / 8, np.float32))
    assert_trees_equal(rescaled_state.critic_params, state.critic_params, rtol=1e-5, atol=1e-6)
    plain_state, plain_metrics, _ = update(warm, without, np.ones((1, 7), np.float32))
    assert float(metrics["critic_loss"]) == pytest.approx(7 / 8 * float(plain_metrics["critic_loss"]), rel=1e-5)
    assert not trees_close(plain_state.critic_params, state.critic_params, rtol=1e-5, atol=1e-6)


def test_d4pg_priorities_are_the_unweighted_critic_losses(d4pg_setup):
    agent, update, _ = d4pg_setup
    start = _warm_state(agent, update, d4pg_batches(1, 8, seed=4))
    batch = d4pg_batches(1, 8, seed=6)
    _, metrics, priorities = update(start, batch, np.ones((1, 8), np.float32))
    assert priorities.shape == (1, 8) and np.all(np.asarray(priorities) >= 0)
    # With unit weights the critic loss is the mean of the per-transition losses.
    assert float(np.mean(priorities)) == pytest.approx(float(metrics["critic_loss"]), rel=1e-5)
    weighted = np.random.default_rng(1).uniform(0.1, 1.0, (1, 8)).astype(np.float32)
    _, weighted_metrics, weighted_priorities = update(start, batch, weighted)
    np.testing.assert_allclose(weighted_priorities, priorities, rtol=1e-6)
    assert float(weighted_metrics["critic_loss"]) == pytest.approx(float(np.mean(weighted * priorities)), rel=1e-5)


# ----- actor ----------------------------------------------------------------------------------


class RecordingReplay(ReplayServer):
    """A replay server that also keeps every inserted chunk, in order."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.chunks = []
        self.priority_updates = []

    def insert(self, transitions, priorities=None, timeout=None):
        inserted = super().insert(transitions, priorities, timeout)
        self.chunks.append({name: np.asarray(value)[:inserted] for name, value in transitions.items()})
        return inserted

    def update_priorities(self, indices, priorities):
        self.priority_updates.append((np.asarray(indices), np.asarray(priorities)))
        super().update_priorities(indices, priorities)

    def items(self) -> dict:
        return {name: np.concatenate([chunk[name] for chunk in self.chunks]) for name in self.chunks[0]}


def make_nodes(pool, replay):
    broadcaster, counter = Broadcaster(), Counter()
    return (LocalHandle(replay, pool), LocalHandle(broadcaster, pool), LocalHandle(counter, pool)), broadcaster, counter


def dqn_params(agent, seed=0):
    return numpy_params(agent.policy_params(agent.init(jax.random.PRNGKey(seed))))


def biased_head(params, bias):
    """Params whose Q-values are `bias` for every observation (head kernel zeroed)."""
    params = jax.tree.map(np.copy, params)
    params["head"]["kernel"][:] = 0.0
    params["head"]["bias"][:] = bias
    return params


def make_actor(factory, handles, **kwargs):
    replay, broadcaster, counter = handles
    options = dict(actor_id=0, agent_factory=factory, env_id=CARTPOLE, env_options=None, num_envs=1, seed=0,
                   actor_precision="fp32", noise_scale=0.5, replay=replay, broadcaster=broadcaster, counter=counter,
                   xla_threads=0)
    return Actor(**{**options, **kwargs})


def test_actor_run_inserts_consistent_n_step_transitions(cartpole_specs, pool):
    factory = dqn_factory(n_step=3)
    replay = RecordingReplay(1000, MinSize(1))
    handles, broadcaster, counter = make_nodes(pool, replay)
    broadcaster.publish(0, weights.encode(dqn_params(factory(*cartpole_specs)), "fp32"))
    actor = make_actor(factory, handles, update_period=50, sync_pull=True, insert_chunk=16, max_steps=200)
    actor.run()

    counts = counter.get_counts()
    stats = actor.stats()
    assert counts["actor_steps"] == 200 and stats["steps"] == 200
    episodes = counts["episodes"]
    assert episodes > 0 and stats["episodes"] == episodes
    assert set(stats["seconds"]) == {*ACTOR_PHASES, *ACTOR_ONE_TIME_PHASES, "other", "total"}
    assert {"env_step", "inference", "pull_wait", "deserialize", "load", "insert"} <= set(ACTOR_PHASES)
    assert stats["seconds"]["env_step"] > 0 and stats["seconds"]["inference"] > 0
    # A synchronous pull at start, then one every 50 steps (at 50, 100, 150); one version only.
    assert stats["pulls"] == 4 and stats["loads"] == 1 and stats["version"] == 0

    items = replay.items()
    assert replay.size() == len(items["reward"]) and stats["inserts"] == len(replay.chunks)
    # Every step starts one 3-step transition; up to 2 of the last episode are still pending.
    assert 198 <= len(items["reward"]) <= 200
    assert items["observation"].shape[1:] == (4,) and set(np.unique(items["action"])) <= {0, 1}
    gamma = np.float32(GAMMA)
    full_reward, full_discount = np.float32(1 + GAMMA + GAMMA**2), np.float32(GAMMA**3)
    ends = items["discount"] == 0.0
    # Each terminated episode ends with three transitions of 3, 2 and 1 rewards, discount 0.
    assert ends.sum() == 3 * episodes
    end_rewards = items["reward"][ends].reshape(episodes, 3)
    np.testing.assert_allclose(end_rewards, np.tile([full_reward, 1 + gamma, 1.0], (episodes, 1)), rtol=1e-6)
    np.testing.assert_allclose(items["reward"][~ends], full_reward, rtol=1e-6)
    np.testing.assert_allclose(items["discount"][~ends], full_discount, rtol=1e-6)
    # A transition that does not end its episode bootstraps from the state three steps later.
    for index in np.flatnonzero(~ends):
        if index + 3 < len(items["reward"]):
            np.testing.assert_array_equal(items["next_observation"][index], items["observation"][index + 3])


@pytest.mark.parametrize("runtime", ["jax", "onnx"])
def test_actor_single_env_interface_loads_new_versions_on_update(cartpole_specs, pool, runtime):
    factory = dqn_factory()
    agent = factory(*cartpole_specs)
    params = dqn_params(agent)
    replay = ReplayServer(100, MinSize(1))
    handles, broadcaster, counter = make_nodes(pool, replay)
    broadcaster.publish(0, weights.encode(biased_head(params, [5.0, 0.0]), "fp32"))  # greedy action 0
    actor = make_actor(factory, handles, noise_scale=0.0, update_period=3, insert_chunk=2, runtime=runtime)

    env = envs.make(CARTPOLE, seed=5)
    timestep = env.reset()
    actor.observe_first(timestep)
    action = actor.select_action(timestep.observation)  # pulls the first weights
    assert int(action) == 0 and actor.stats()["version"] == 0
    timestep = env.step(action)
    actor.observe(action, timestep)

    broadcaster.publish(1, weights.encode(biased_head(params, [0.0, 5.0]), "fp32"))  # greedy action 1
    pulls = actor.stats()["pulls"]
    actor.update()  # one step since the last pull, update_period 3: no pull
    assert actor.stats()["pulls"] == pulls and actor.stats()["version"] == 0
    assert int(actor.select_action(timestep.observation)) == 0
    policy = actor._policy
    actor.update(wait=True)
    assert actor.stats()["version"] == 1 and actor.stats()["loads"] == 2 and actor.stats()["runtime"] == runtime
    assert actor._policy is policy  # the new weights went into the same policy: nothing was rebuilt.
    action = actor.select_action(timestep.observation)
    assert int(action) == 1
    timestep = env.step(action)
    actor.observe(action, timestep)  # second transition: a chunk of 2 goes to the replay
    deadline = time.monotonic() + 10
    while replay.size() < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert replay.size() == 2
    assert counter.get_counts()["actor_steps"] == 2


def int8_publish(cartpole_specs, scheme):
    """A 64-64 DQN's factory, agent, fp32 params, 300 CartPole observations and its int8 blob at
    `scheme` (ranges calibrated on those observations)."""
    factory = dqn_factory(hidden_sizes="64-64")
    agent = factory(*cartpole_specs)
    params = dqn_params(agent, seed=3)
    observations = cartpole_observations(300)
    ranges = calibrate(agent.policy_network(FP32).apply, params, observations)
    return factory, agent, params, observations, weights.encode(params, "int8", ranges, int8_scheme=scheme)


@pytest.mark.parametrize("scheme", ["int8", "int8-obst-sym"])
def test_int8_actor_uses_static_scales_and_agrees_with_fp32(cartpole_specs, pool, scheme):
    factory, agent, params, observations, blob = int8_publish(cartpole_specs, scheme)
    handles, broadcaster, _ = make_nodes(pool, ReplayServer(100, MinSize(1)))
    broadcaster.publish(0, blob)
    actor = make_actor(factory, handles, actor_precision="int8", noise_scale=0.0)
    actor.update(wait=True)
    loaded = actor._params  # what the actor's policy runs on
    first_layer = next(path for path, layer in flat(params).items() if layer.shape == (4, 64))
    assert first_layer.endswith("['kernel']")
    input_scale = flat(loaded)[first_layer.replace("['kernel']", "['input_scale']")]
    if scheme == "int8-obst-sym":  # one symmetric scale for the observation: max |x| / 127
        np.testing.assert_allclose(input_scale, np.max(np.abs(observations)) / 127, rtol=1e-6)
    else:  # per feature on the affine grid: (max(x, 0) - min(x, 0)) / 255
        low, high = np.minimum(observations.min(axis=0), 0), np.maximum(observations.max(axis=0), 0)
        np.testing.assert_allclose(input_scale, (high - low) / 255, rtol=1e-6)

    int8_actions = np.array([int(actor.select_action(observation)) for observation in observations])
    fp32_actions = np.asarray(jax.jit(agent.policy(FP32))(params, observations))
    assert np.mean(int8_actions == fp32_actions) >= 0.9, np.mean(int8_actions == fp32_actions)
    scheme_policy = jax.jit(agent.policy(parse_precision(scheme)))
    np.testing.assert_array_equal(int8_actions, scheme_policy(weights.load(weights.decode(blob), "int8"), observations))


@pytest.mark.parametrize("scheme", ["quarl_dyn8", "int8"])
def test_onnx_actor_acts_as_the_jax_actor_at_its_int8_scheme(cartpole_specs, pool, scheme):
    factory, agent, _, observations, blob = int8_publish(cartpole_specs, scheme)
    actions = {}
    for runtime in ("jax", "onnx"):
        handles, broadcaster, _ = make_nodes(pool, ReplayServer(100, MinSize(1)))
        broadcaster.publish(0, blob)
        actor = make_actor(factory, handles, actor_precision="int8", noise_scale=0.0, runtime=runtime)
        actor.update(wait=True)
        actions[runtime] = np.array([int(actor.select_action(observation)) for observation in observations])
    q_values = np.asarray(agent.policy_network(parse_precision(scheme)).apply(
        {"params": weights.load(weights.decode(blob), "int8")}, observations))
    gap = np.abs(q_values[:, 0] - q_values[:, 1])
    decided = gap > 1e-4 * np.maximum(1.0, np.abs(q_values).max(axis=1))
    assert decided.mean() > 0.9
    np.testing.assert_array_equal(actions["onnx"][decided], actions["jax"][decided])


# ----- learner --------------------------------------------------------------------------------


def filled_replay(cls=ReplayServer, num_items=64, prioritized=False, seed=0):
    """A replay holding `num_items` CartPole-shaped transitions; the limiter (ratio 4, min 16,
    buffer 272) lets the learner sample 28 batches of 16 items from them."""
    replay = cls(1000, SampleToInsertRatio(4.0, 16, 272.0), prioritized=prioritized, seed=seed)
    assert replay.insert(cartpole_transitions(num_items), timeout=1.0) == num_items
    return replay


def make_learner(factory, specs, handles, **kwargs):
    replay, broadcaster, counter = handles
    options = dict(agent_factory=factory, observation_spec=specs[0], action_spec=specs[1], seed=0, replay=replay,
                   broadcaster=broadcaster, counter=counter, xla_threads=0)
    return Learner(**{**options, **kwargs})


def test_learner_steps_publish_and_serve_the_updated_params(cartpole_specs, pool):
    factory = dqn_factory()
    handles, broadcaster, counter = make_nodes(pool, filled_replay())
    learner = make_learner(factory, cartpole_specs, handles, comm_precision="int8", publish_period=4,
                           int8_scheme="int8-obst-sym")
    assert learner.get_variables() == [None]

    assert learner.step()
    assert counter.get_counts()["learner_steps"] == 2  # K = gradient_steps = 2 updates per step
    assert broadcaster.stats()["publishes"] == 1  # the first step publishes
    # The same sample from an identically seeded replay, through the agent's update by hand.
    agent = factory(*cartpole_specs)
    sample = filled_replay().sample(8, 2, timeout=1.0)
    expected, _, _ = jax.jit(agent.update)(agent.init(jax.random.PRNGKey(0)), Transition(**sample["transitions"]),
                                           sample["weights"])
    (published,) = learner.get_variables()
    assert all(isinstance(leaf, np.ndarray) and leaf.dtype == np.float32 for leaf in flat(published).values())
    assert_trees_equal(published, numpy_params(agent.policy_params(expected)), rtol=1e-6, atol=1e-7)
    with pytest.raises(KeyError, match="policy"):
        learner.get_variables(["critic"])

    message = weights.decode(broadcaster.pull(-1)[1])
    assert message.precision == "int8" and message.int8_scheme == "int8-obst-sym"
    loaded = weights.load(message, "int8")
    # Every sampled observation row has max |x| = 2.54: the first layer's input scale is 0.02.
    first_layer = next(path for path, layer in flat(published).items() if layer.shape == (4, 16))
    np.testing.assert_allclose(flat(loaded)[first_layer.replace("['kernel']", "['input_scale']")],
                               np.float32(OBS_ABSMAX) / 127, rtol=1e-7)

    for _ in range(4):
        assert learner.step()
    # Updates 2, 4, 6, 8, 10: publishes at 2 (first), 6 and 10 (publish_period 4).
    assert counter.get_counts()["learner_steps"] == 10
    assert broadcaster.stats()["publishes"] == 3 and broadcaster.stats()["version"] == 2
    stats = learner.stats()
    assert stats["steps"] == 10 and stats["publishes"] == 3
    assert set(stats["seconds"]) == {*LEARNER_PHASES, "other", "total"}
    assert stats["fp32_bytes"] == weights.fp32_bytes(published)
    assert 0 < stats["bytes_per_publish"] < stats["fp32_bytes"]  # int8 kernels (tiny net: scales and keys weigh)
    assert set(stats["metrics"]) == {"loss", "q_mean"}


def test_learner_state_lives_on_its_device_and_a_missing_device_is_an_input_error(cartpole_specs, pool):
    from qrl import runtime

    handles, _, _ = make_nodes(pool, filled_replay())
    learner = make_learner(dqn_factory(), cartpole_specs, handles, device="cpu")
    assert {device.platform for leaf in jax.tree.leaves(learner._state) for device in leaf.devices()} == {"cpu"}
    assert learner.step()  # the update ran where the state is.
    if not any(device.platform == "gpu" for device in jax.devices()):
        with pytest.raises(QrlInputError, match="JAX sees no gpu device here"):
            runtime.device_of("gpu")


def test_learner_run_publishes_at_start_and_stops_at_max_steps(cartpole_specs, pool):
    handles, broadcaster, counter = make_nodes(pool, filled_replay())
    learner = make_learner(dqn_factory(), cartpole_specs, handles, comm_precision="int8", publish_period=100,
                           max_steps=4)
    learner.run()
    assert learner.stats()["steps"] == 4 and counter.get_counts()["learner_steps"] == 4
    # Only the start publish (before any sample: no calibration, the default scheme's per-call twin).
    assert broadcaster.stats()["publishes"] == 1
    message = weights.decode(broadcaster.pull(-1)[1])
    assert message.input_ranges is None
    assert message.int8_scheme == weights.uncalibrated_scheme(weights.DEFAULT_ACTOR_INT8_SCHEME)
    assert learner.stats()["run_seconds"] > 0


def test_learner_step_times_out_without_data(cartpole_specs, pool):
    replay = ReplayServer(1000, SampleToInsertRatio(4.0, 16, 272.0))
    handles, broadcaster, counter = make_nodes(pool, replay)
    learner = make_learner(dqn_factory(), cartpole_specs, handles)
    tick = time.monotonic()
    assert learner.step() is False
    assert time.monotonic() - tick < 5
    assert counter.get_counts() == {} and broadcaster.stats()["publishes"] == 0


def test_learner_checkpoint_and_resume(cartpole_specs, pool, tmp_path):
    directory = str(tmp_path / "checkpoints")
    factory = dqn_factory()
    handles, _, counter = make_nodes(pool, filled_replay())
    learner = make_learner(factory, cartpole_specs, handles, checkpoint_dir=directory, checkpoint_every=4)
    for _ in range(3):
        learner.step()
    assert Checkpointer(directory).latest_step() == 4  # checkpoint_every: written after updates 2 + 2
    counter.increment(actor_steps=123, episodes=7)
    assert learner.checkpoint() == 6
    learner.publish()
    (saved_params,) = learner.get_variables()
    learner.close()

    resumed_handles, _, resumed_counter = make_nodes(pool, filled_replay())
    resumed = make_learner(factory, cartpole_specs, resumed_handles, checkpoint_dir=directory, resume=True)
    assert resumed.resumed_from == 6
    stats = resumed.stats()
    assert stats["steps"] == 6 and stats["resumed_from"] == 6
    assert stats["resumed_counts"] == {"learner_steps": 6, "actor_steps": 123, "episodes": 7}
    resumed.publish()
    assert_trees_equal(resumed.get_variables()[0], saved_params)
    resumed.step()
    assert resumed.stats()["steps"] == 8 and resumed_counter.get_counts()["learner_steps"] == 2
    resumed.close()

    fresh = make_learner(factory, cartpole_specs, make_nodes(pool, filled_replay())[0],
                         checkpoint_dir=str(tmp_path / "empty"), resume=True)
    assert fresh.resumed_from is None and fresh.stats()["steps"] == 0


def test_learner_save_and_restore_move_the_train_state(cartpole_specs, pool):
    """Acme's Saveable: `save()` hands out the train state, `restore(state)` adopts it."""
    factory = dqn_factory()
    learner = make_learner(factory, cartpole_specs, make_nodes(pool, filled_replay())[0])
    learner.step()
    learner.publish()
    other = make_learner(factory, cartpole_specs, make_nodes(pool, filled_replay())[0])
    other.restore(learner.save())
    assert other.stats()["steps"] == 2
    other.publish()
    assert_trees_equal(other.get_variables()[0], learner.get_variables()[0])


def test_prioritized_learner_sends_priorities(cartpole_specs, pool):
    replay = filled_replay(RecordingReplay, prioritized=True)
    assert np.all(replay.sample(8, 1, timeout=1.0)["weights"] == 1.0)  # all priorities start at 1
    handles, _, _ = make_nodes(pool, replay)
    learner = make_learner(dqn_factory(), cartpole_specs, handles, prioritized=True)
    assert learner.step()
    (indices, priorities), = replay.priority_updates
    assert indices.shape == priorities.shape == (2, 8)
    assert np.all(priorities >= 0) and np.all((indices >= 0) & (indices < 64))
    # Unequal priorities now: importance weights below one.
    assert np.any(replay.sample(8, 4, timeout=1.0)["weights"] < 1.0)

    uniform = filled_replay(RecordingReplay)
    learner = make_learner(dqn_factory(), cartpole_specs, make_nodes(pool, uniform)[0], prioritized=False)
    assert learner.step() and uniform.priority_updates == []


# ----- evaluator ------------------------------------------------------------------------------


def make_evaluator(factory, specs, handles, learner_handle, **kwargs):
    _, broadcaster, counter = handles
    options = dict(agent_factory=factory, observation_spec=specs[0], action_spec=specs[1], env_id=CARTPOLE,
                   env_options=None, seed=0, actor_precision="fp32", learner=learner_handle,
                   broadcaster=broadcaster, counter=counter, episodes=2, every_seconds=100.0, xla_threads=0)
    return Evaluator(**{**options, **kwargs})


def test_evaluator_records(cartpole_specs, pool):
    factory = dqn_factory()
    handles, _, counter = make_nodes(pool, filled_replay())
    learner = make_learner(factory, cartpole_specs, handles, comm_precision="fp32", publish_period=1)
    evaluator = make_evaluator(factory, cartpole_specs, handles, LocalHandle(learner, pool), max_episode_steps=50)
    assert evaluator.evaluate_now() is None  # nothing published yet
    learner.publish()
    counter.increment(actor_steps=30, episodes=2)
    record = evaluator.evaluate_now()
    assert record["return_fp32"] == record["return_actor"]
    assert 8 <= record["return_fp32"] <= 50  # CartPole: 1 per step, episodes capped at 50 steps
    assert record["version"] == 0 and record["actor_steps"] == 30 and record["learner_steps"] == 0
    assert counter.get_counts()["last_return_fp32"] == record["return_fp32"]
    learner.step()  # publishes version 1
    second, third = evaluator.evaluate_now(), evaluator.evaluate_now()
    assert second["version"] == 1 and second["learner_steps"] == 2
    assert evaluator.records() == [record, second, third]
    assert evaluator.records(1) == [second, third]
    assert evaluator.records(3) == []
    assert third["wall_seconds"] >= second["wall_seconds"] >= record["wall_seconds"]


def test_int8_evaluator_evaluates_both_precisions(cartpole_specs, pool):
    factory = dqn_factory()
    handles, _, _ = make_nodes(pool, filled_replay())
    learner = make_learner(factory, cartpole_specs, handles, comm_precision="int8")
    evaluator = make_evaluator(factory, cartpole_specs, handles, LocalHandle(learner, pool), actor_precision="int8",
                               max_episode_steps=5, every_seconds=0.05)
    learner.publish()
    thread = threading.Thread(target=evaluator.run)
    thread.start()
    deadline = time.monotonic() + 30
    while len(evaluator.records()) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    evaluator.stop()
    thread.join(10)
    assert not thread.is_alive()
    records = evaluator.records()
    assert len(records) >= 2
    # No CartPole episode ends within 5 steps: both policies score exactly 5.
    assert all(r["return_fp32"] == 5.0 and r["return_actor"] == 5.0 for r in records)
    assert evaluator.stats()["evaluations"] == len(records)


# ----- supervise ------------------------------------------------------------------------------


class DummyNode:
    """Loops until stopped; logs stop and close calls; `fail_after` seconds into run it raises
    `failure` (ValueError by default)."""

    def __init__(self, name, log, fail_after=None, partner=None, failure=ValueError):
        self.name, self.log, self.fail_after, self.partner, self.failure = name, log, fail_after, partner, failure
        self._stop = threading.Event()
        self.loops = 0

    def run(self):
        start = time.monotonic()
        while not self._stop.wait(0.005):
            self.loops += 1
            if self.fail_after is not None and time.monotonic() - start > self.fail_after:
                raise self.failure(f"{self.name} broke")

    def stop(self):
        self.log.append(("stop", self.name))
        self._stop.set()

    def close(self):
        self.log.append(("close", self.name))

    def stats(self):
        return {"name": self.name, "stopped": self._stop.is_set()}

    def pid(self):
        return 0


def dummy_program(log, fail=None):
    return Program([
        NodeSpec("a", DummyNode, dict(name="a", log=log)),
        NodeSpec("b", DummyNode, dict(name="b", log=log, partner=NodeRef("a"))),
        NodeSpec("c", DummyNode, dict(name="c", log=log, fail_after=0.05 if fail == "c" else None)),
    ])


def test_supervise_stops_on_the_condition_and_returns_on_stop():
    log, polls, started = [], [], []

    def should_stop(handles, elapsed):
        polls.append(elapsed)
        return "enough" if len(polls) == 3 else None

    def on_stop(handles):
        log.append(("on_stop",))
        return {name: handle.node.loops for name, handle in handles.items()}

    outcome = supervise(InProcessBackend(), dummy_program(log), should_stop, poll_seconds=0.01,
                        on_start=lambda handles: started.append(sorted(handles)), on_stop=on_stop)
    assert outcome.reason == "enough" and outcome.error is None and outcome.restarts == {}
    assert started == [["a", "b", "c"]]
    # Stopped in reverse creation order, then on_stop, then every node closed.
    assert log[:4] == [("stop", "c"), ("stop", "b"), ("stop", "a"), ("on_stop",)]
    assert sorted(log[4:]) == [("close", "a"), ("close", "b"), ("close", "c")]
    assert set(outcome.final) == {"a", "b", "c"}
    assert outcome.stats == {name: {"name": name, "stopped": True} for name in "abc"}
    assert outcome.seconds >= 0.02


def test_supervise_resolves_node_refs_and_follows_stop_order():
    log, nodes = [], {}

    def should_stop(handles, elapsed):
        nodes.update({name: handle.node for name, handle in handles.items()})
        return "done"

    outcome = supervise(InProcessBackend(), dummy_program(log), should_stop, poll_seconds=0.01,
                        stop_order=["a", "c", "b"])
    assert outcome.reason == "done"
    assert isinstance(nodes["b"].partner, LocalHandle) and nodes["b"].partner.node is nodes["a"]
    assert [entry for entry in log if entry[0] == "stop"] == [("stop", "a"), ("stop", "c"), ("stop", "b")]


def test_supervise_reports_a_failed_node_and_stops_the_others():
    log = []
    outcome = supervise(InProcessBackend(), dummy_program(log, fail="c"), lambda handles, elapsed: None,
                        poll_seconds=0.01, on_stop=lambda handles: "final")
    assert outcome.reason == "failed"
    assert "node c failed" in outcome.error and "ValueError: c broke" in outcome.error
    stopped = {entry[1] for entry in log if entry[0] == "stop"}
    assert {"a", "b"} <= stopped
    assert outcome.final == "final"
    assert outcome.stats["a"] == {"name": "a", "stopped": True} and outcome.stats["b"]["stopped"]


def test_supervise_interrupted_stops_every_node():
    log = []

    def should_stop(handles, elapsed):
        raise KeyboardInterrupt

    outcome = supervise(InProcessBackend(), dummy_program(log), should_stop, poll_seconds=0.01)
    assert outcome.reason == "interrupted" and outcome.error is None
    assert sorted(entry[1] for entry in log if entry[0] == "stop") == ["a", "b", "c"]
    assert sorted(entry[1] for entry in log if entry[0] == "close") == ["a", "b", "c"]


def test_supervise_reports_bad_input_inside_a_node_as_an_input_error():
    log = []
    program = Program([NodeSpec("a", DummyNode, dict(name="a", log=log, fail_after=0.02, failure=QrlInputError))])
    outcome = supervise(InProcessBackend(), program, lambda handles, elapsed: None, poll_seconds=0.01)
    assert outcome.reason == "failed" and outcome.input_error
    assert outcome.error == "node a failed: a broke"


class _NodesThatNeverStart(InProcessBackend):
    """Its nodes' constructors 'fail in another process': wait_ready raises, as RayBackend's does."""

    def __init__(self):
        super().__init__()
        self.shut_down = False

    def wait_ready(self, names):
        raise NodeFailure("node a failed to start: corrupt checkpoint in /x/5: bad bytes", input_error=True)

    def shutdown(self):
        self.shut_down = True
        super().shutdown()


def test_supervise_a_node_failing_to_start_is_one_line_and_the_backend_shuts_down():
    backend, log = _NodesThatNeverStart(), []

    def on_stop(handles):
        raise RuntimeError("the learner is gone")

    outcome = supervise(backend, dummy_program(log), lambda handles, elapsed: "never", on_stop=on_stop)
    assert backend.shut_down and outcome.reason == "failed" and outcome.input_error
    assert outcome.error == "node a failed to start: corrupt checkpoint in /x/5: bad bytes"  # not on_stop's


def test_supervise_a_failing_final_step_is_reported():
    log = []

    def on_stop(handles):
        raise RuntimeError("the learner is gone")

    outcome = supervise(InProcessBackend(), dummy_program(log), lambda handles, elapsed: "done", poll_seconds=0.01,
                        on_stop=on_stop)
    assert outcome.reason == "done" and not outcome.input_error
    assert outcome.error == "the final evaluation and checkpoint failed: RuntimeError: the learner is gone"


@pytest.mark.parametrize("address, fragment", [
    ("localhost", "must be an IP address"),
    ("0.0.0.0", "not 0.0.0.0"),
    ("224.0.0.1", "not 224.0.0.1"),
    ("203.0.113.7", "not an address of this machine"),
])
def test_bind_addresses_that_are_not_one_of_this_machines_are_refused(address, fragment):
    assert check_bind_address(" 127.0.0.1 ") == "127.0.0.1"
    with pytest.raises(QrlInputError, match=fragment):
        check_bind_address(address)
