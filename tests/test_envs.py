"""qrl.envs: specs and dtypes per family, discounts, seeding, id errors, vector env, brax adapter."""

import numpy as np
import pytest
from dm_env import StepType, specs

from qrl.envs import KNOWN_FAMILIES, is_discrete, make, make_brax, make_vector, num_actions
from qrl.errors import QrlInputError

CARTPOLE_THETA_LIMIT = 12 * 2 * np.pi / 360  # gymnasium's termination angle, radians
CARTPOLE_X_LIMIT = 2.4


def run_episode(env, actions):
    """Steps `env` from a reset through `actions` (cycled) until LAST; returns the timesteps."""
    timesteps = [env.reset()]
    index = 0
    while not timesteps[-1].last():
        timesteps.append(env.step(actions[index % len(actions)]))
        index += 1
    return timesteps


def test_known_families():
    assert KNOWN_FAMILIES == ("gym", "atari", "dmc", "brax", "gymnax")


@pytest.mark.parametrize(
    "env_id, obs_size, discrete, actions",
    [("gym:CartPole-v1", 4, True, 2), ("gym:Pendulum-v1", 3, False, 1), ("gym:HalfCheetah-v5", 17, False, 6)],
)
def test_gym_specs_and_dtypes(env_id, obs_size, discrete, actions):
    env = make(env_id, seed=0)
    assert env.observation_spec() == specs.Array((obs_size,), np.float32)
    action_spec = env.action_spec()
    assert is_discrete(action_spec) is discrete
    assert num_actions(action_spec) == actions
    if discrete:
        assert isinstance(action_spec, specs.DiscreteArray)
    else:
        assert isinstance(action_spec, specs.BoundedArray) and action_spec.dtype == np.float32
    first = env.reset()
    assert first.step_type == StepType.FIRST and first.reward is None
    timestep = env.step(action_spec.generate_value())
    assert timestep.step_type == StepType.MID and timestep.discount == 1.0
    assert timestep.observation.dtype == np.float32 and timestep.observation.shape == (obs_size,)
    assert isinstance(timestep.reward, float)


def test_gym_termination_has_discount_zero():
    timesteps = run_episode(make("gym:CartPole-v1", seed=0), [0])
    assert 8 <= len(timesteps) - 1 <= 12
    assert timesteps[-1].discount == 0.0
    assert all(step.discount == 1.0 for step in timesteps[1:-1])
    x, _, theta, _ = timesteps[-1].observation
    assert abs(theta) > CARTPOLE_THETA_LIMIT or abs(x) > CARTPOLE_X_LIMIT


def test_gym_truncation_has_discount_one():
    timesteps = run_episode(make("gym:CartPole-v1", seed=0, max_episode_steps=5), [0, 1])
    assert len(timesteps) - 1 == 5
    assert timesteps[-1].step_type == StepType.LAST and timesteps[-1].discount == 1.0


def test_gym_step_after_last_resets():
    env = make("gym:CartPole-v1", seed=0)
    run_episode(env, [0])
    assert env.step(0).step_type == StepType.FIRST


def test_gym_same_seed_same_episodes_and_resets_continue_rng():
    actions = [0, 1, 1, 0, 1]

    def two_episodes(seed):
        env = make("gym:CartPole-v1", seed=seed)
        return [np.stack([t.observation for t in run_episode(env, actions)]) for _ in range(2)]

    first, second = two_episodes(7), two_episodes(7)
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(first[0][0], first[1][0])
    assert not np.array_equal(first[0][0], two_episodes(8)[0][0])


def test_atari_pong_specs_and_frame_stack():
    env = make("atari:Pong", seed=0)
    assert env.observation_spec().shape == (84, 84, 4) and env.observation_spec().dtype == np.uint8
    assert env.action_spec().num_values == 6
    previous = env.reset().observation
    assert previous.shape == (84, 84, 4) and previous.dtype == np.uint8
    for _ in range(3):
        timestep = env.step(0)
        assert timestep.step_type == StepType.MID and timestep.discount == 1.0
        np.testing.assert_array_equal(timestep.observation[..., :3], previous[..., 1:])
        previous = timestep.observation
    assert previous.max() > 0


def test_atari_seeding_and_sticky_actions():
    observations = [make("atari:Pong", seed=3).step(0).observation for _ in range(2)]
    np.testing.assert_array_equal(*observations)
    assert make("atari:Pong", seed=0).gym_env.unwrapped.ale.getFloat("repeat_action_probability") == 0.0
    sticky = make("atari:pong", seed=0, sticky_actions=True)
    assert sticky.gym_env.unwrapped.ale.getFloat("repeat_action_probability") == pytest.approx(0.25)


def test_atari_episodic_life_continues_the_game():
    fire = 1
    env = make("atari:Breakout", seed=0, episodic_life=True)
    ale = env.gym_env.unwrapped.ale
    env.reset()
    assert env.lives == 5
    timestep = env.step(fire)
    while not timestep.last():
        timestep = env.step(fire)
    assert timestep.discount == 0.0 and env.lives == 4
    frame_at_life_loss = ale.getEpisodeFrameNumber()
    assert env.reset().step_type == StepType.FIRST
    assert env.lives == 4 and ale.getEpisodeFrameNumber() == frame_at_life_loss + 4
    lives_at_ends = []
    while len(lives_at_ends) < 4:
        timestep = env.step(fire)
        if timestep.last():
            lives_at_ends.append(env.lives)
            env.reset()
    assert lives_at_ends == [3, 2, 1, 0]
    assert env.lives == 5 and ale.getEpisodeFrameNumber() <= 31


def test_atari_without_episodic_life_plays_through_lost_lives():
    env = make("atari:Breakout", seed=0)
    env.reset()
    for _ in range(40):
        assert not env.step(1).last()
    assert env.lives < 5


def test_dmc_flattened_observations():
    env = make("dmc:cartpole-balance", seed=0)
    assert env.observation_spec() == specs.Array((5,), np.float32)
    action_spec = env.action_spec()
    assert action_spec.dtype == np.float32 and action_spec.shape == (1,) and not is_discrete(action_spec)
    first = env.reset()
    raw = env.dmc_env.physics
    expected = np.concatenate([raw.bounded_position(), raw.velocity()]).astype(np.float32)
    np.testing.assert_allclose(first.observation, expected, rtol=1e-6)
    timestep = env.step(np.zeros(1, np.float32))
    assert timestep.observation.dtype == np.float32 and isinstance(timestep.reward, float)
    again = make("dmc:cartpole-balance", seed=0).reset()
    np.testing.assert_array_equal(first.observation, again.observation)


def test_dmc_time_limit_is_truncation_and_underscored_domains_parse():
    timesteps = run_episode(make("dmc:cartpole-balance", seed=0, time_limit=0.1), [np.zeros(1)])
    assert len(timesteps) - 1 == 10 and timesteps[-1].discount == 1.0
    assert make("dmc:ball_in_cup-catch", seed=0).observation_spec().shape == (8,)


@pytest.mark.parametrize(
    "env_id, fragment",
    [
        ("gym:CartPol-v1", "gym:CartPole-v1"),
        ("atari:Pongg", "atari:Pong"),
        ("dmc:walker-wlk", "dmc:walker-walk"),
        ("brax:halfcheeta", "brax:halfcheetah"),
        ("mujoco:Hopper-v5", "known families"),
        ("CartPole-v1", "known families"),
    ],
)
def test_unknown_ids_list_families_and_close_matches(env_id, fragment):
    with pytest.raises(QrlInputError) as error:
        make(env_id)
    message = str(error.value)
    assert "\n" not in message and fragment in message
    assert all(family in message for family in KNOWN_FAMILIES)


def test_bad_options_and_seed_are_input_errors():
    with pytest.raises(QrlInputError, match="sticky"):
        make("atari:Pong", sticky=True)
    with pytest.raises(QrlInputError, match="unknown option"):
        make("dmc:cartpole-balance", frame_skip=2)
    with pytest.raises(QrlInputError):
        make("gym:CartPole-v1", not_an_option=1)
    with pytest.raises(QrlInputError, match="seed"):
        make("gym:CartPole-v1", seed=-1)
    with pytest.raises(QrlInputError, match="atari:Pong"):
        make("gym:ALE/Pong-v5")


def test_vector_env_auto_reset_keeps_final_observation():
    envs = make_vector("gym:CartPole-v1", 3, seed=0)
    assert envs.observation_spec().shape == (4,) and is_discrete(envs.action_spec())
    observation = envs.reset()
    assert observation.shape == (3, 4) and observation.dtype == np.float32
    singles = [make("gym:CartPole-v1", seed=seed) for seed in range(3)]
    np.testing.assert_array_equal(observation, np.stack([env.reset().observation for env in singles]))
    ended = np.zeros(3, bool)
    for _ in range(15):
        step = envs.step(np.zeros(3, np.int64))
        assert step.reward.dtype == np.float32 and step.discount.dtype == np.float32
        assert step.observation.shape == (3, 4)
        last = step.last()
        np.testing.assert_array_equal(step.discount, np.where(last, 0.0, 1.0))
        np.testing.assert_array_equal(step.observation[~last], step.final_observation[~last])
        for row in np.flatnonzero(last):
            x, _, theta, _ = step.final_observation[row]
            assert abs(theta) > CARTPOLE_THETA_LIMIT or abs(x) > CARTPOLE_X_LIMIT
            assert np.all(np.abs(step.observation[row]) <= 0.05)
        ended |= last
    assert ended.all()


def test_vector_env_other_families_and_brax_refused():
    atari = make_vector("atari:Pong", 2, seed=0)
    assert atari.reset().shape == (2, 84, 84, 4)
    step = atari.step(np.array([0, 1]))
    assert step.observation.dtype == np.uint8 and step.step_type.shape == (2,)
    dmc = make_vector("dmc:cartpole-balance", 2, seed=0)
    assert dmc.reset().shape == (2, 5)
    assert dmc.step(np.zeros((2, 1), np.float32)).reward.shape == (2,)
    with pytest.raises(QrlInputError, match="batch_size"):
        make_vector("brax:hopper", 2, seed=0)


def test_brax_batched_adapter_reset_step_and_episode_limit():
    env = make("brax:fast", seed=0, batch_size=2, episode_length=3)
    assert env.observation_spec() == specs.Array((2,), np.float32)
    assert env.action_spec().shape == (1,) and env.action_spec().dtype == np.float32
    first = env.reset()
    assert first.observation.shape == (2, 2) and first.observation.dtype == np.float32
    np.testing.assert_array_equal(np.asarray(first.step_type), [StepType.FIRST] * 2)
    push = np.ones((2, 1), np.float32)
    steps = [env.step(push) for _ in range(4)]
    step_types = [np.asarray(step.step_type).tolist() for step in steps]
    assert step_types == [[1, 1], [1, 1], [2, 2], [1, 1]]
    limit = steps[2]
    np.testing.assert_array_equal(np.asarray(limit.discount), [1.0, 1.0])
    np.testing.assert_array_equal(np.asarray(limit.observation), np.asarray(first.observation))
    assert np.all(np.asarray(limit.final_observation)[:, 1] > 0)
    assert np.asarray(steps[0].reward).dtype == np.float32


def test_make_brax_functional_env():
    import jax

    env = make_brax("fast", batch_size=2, episode_length=10)
    state = jax.jit(env.reset)(jax.random.PRNGKey(0))
    state = jax.jit(env.step)(state, np.ones((2, 1), np.float32))
    assert state.obs.shape == (2, 2) and state.reward.shape == (2,)
    assert "truncation" in state.info and "final_obs" in state.info
    with pytest.raises(QrlInputError, match="backend"):
        make_brax("fast", batch_size=2, backend="warp")


@pytest.mark.slow
def test_brax_hopper_physics_batch_two():
    env = make("brax:hopper", seed=0, batch_size=2, episode_length=20)
    assert env.observation_spec().shape == (11,) and env.action_spec().shape == (3,)
    first = env.reset()
    step = env.step(np.zeros((2, 3), np.float32))
    assert step.observation.shape == (2, 11) and np.isfinite(np.asarray(step.observation)).all()
    assert not np.array_equal(np.asarray(step.observation), np.asarray(first.observation))
    again = make("brax:hopper", seed=0, batch_size=2, episode_length=20).reset()
    np.testing.assert_array_equal(np.asarray(first.observation), np.asarray(again.observation))
