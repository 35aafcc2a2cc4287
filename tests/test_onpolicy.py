"""On-policy building blocks: GAE and PPO/A2C losses against hand-computed values, the action
head, advantages with truncation, and the QAT switch of both training paths."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from dm_env import specs

from agents import ppo
from qrl import losses, onpolicy
from qrl.errors import QrlInputError


@pytest.fixture(autouse=True)
def synchronous_dispatch():
    jax.config.update("jax_cpu_enable_async_dispatch", False)


class GAETest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_hand_computed_advantages_with_termination_and_truncation(self):
        # Column 0: no episode end. Column 1: termination at t=0 (discount 0), truncation at t=1
        # (discount γ, done 1: bootstraps from the final observation's value 10, trace cut).
        r_t = jnp.array([[1.0, 1.0], [0.0, 1.0], [2.0, 1.0]])
        discount_t = jnp.array([[0.9, 0.0], [0.9, 0.9], [0.9, 0.9]])
        done_t = jnp.array([[0.0, 1.0], [0.0, 1.0], [0.0, 0.0]])
        v_tm1 = jnp.array([[0.5, 2.0], [1.0, 3.0], [2.0, 1.0]])
        v_t = jnp.array([[1.0, 5.0], [2.0, 10.0], [4.0, 2.0]])
        gae = self.variant(losses.generalized_advantage_estimation)
        advantages = gae(r_t, discount_t, done_t, v_tm1, v_t, 0.5)
        # δ = [1.4, 0.8, 3.6]; A2 = 3.6, A1 = 0.8 + 0.45·3.6, A0 = 1.4 + 0.45·A1.
        # δ = [-1, 7, 1.8]; A2 = 1.8, A1 = 7 (trace cut), A0 = -1 (terminal).
        np.testing.assert_allclose(advantages, [[2.489, -1.0], [2.42, 7.0], [3.6, 1.8]], rtol=1e-6)

    def test_lambda_one_gives_discounted_returns_minus_values(self):
        r_t = jnp.ones((4, 1))
        discount = jnp.full((4, 1), 0.5)
        advantages = losses.generalized_advantage_estimation(
            r_t, discount, jnp.zeros((4, 1)), jnp.zeros((4, 1)), jnp.zeros((4, 1)), 1.0
        )
        np.testing.assert_allclose(advantages[:, 0], [1.875, 1.75, 1.5, 1.0])

    def test_shape_checks(self):
        with pytest.raises(AssertionError):
            losses.generalized_advantage_estimation(jnp.ones(3), jnp.ones(3), jnp.ones(3), jnp.ones(3), jnp.ones(3), 0.9)
        with pytest.raises(AssertionError):
            losses.generalized_advantage_estimation(
                jnp.ones((3, 2)), jnp.ones((3, 2)), jnp.ones((3, 2)), jnp.ones((3, 2)), jnp.ones((2, 2)), 0.9
            )


def test_ppo_clipped_surrogate_hand_computed():
    log_ratio = jnp.log(jnp.array([1.5, 0.5, 0.9, 1.5]))
    advantages = jnp.array([2.0, -1.0, 1.0, -2.0])
    loss = losses.batched_ppo_clipped_surrogate_loss(log_ratio, jnp.zeros(4), advantages, 0.2)
    # -min(3, 2.4); -min(-0.5, -0.8); -min(0.9, 0.9); -min(-3, -2.4) (pessimistic: unclipped)
    np.testing.assert_allclose(loss, [-2.4, 0.8, -0.9, 3.0], rtol=1e-6)
    grads = jax.grad(lambda lp: jnp.sum(losses.batched_ppo_clipped_surrogate_loss(lp, jnp.zeros(4), advantages, 0.2)))(
        log_ratio
    )
    np.testing.assert_allclose(grads, [0.0, 0.0, -0.9, 3.0], rtol=1e-6)  # clipped terms carry no gradient


def test_value_and_policy_gradient_losses_hand_computed():
    np.testing.assert_allclose(losses.value_loss(jnp.array(1.5), jnp.array(2.0)), 0.125)
    clipped = losses.batched_clipped_value_loss(jnp.array([1.5, 1.5]), jnp.ones(2), jnp.array([2.0, 1.0]), 0.2)
    np.testing.assert_allclose(clipped, [0.5 * 0.8**2, 0.5 * 0.5**2], rtol=1e-6)
    np.testing.assert_allclose(losses.policy_gradient_loss(jnp.array(-0.5), jnp.array(2.0)), 1.0)
    grad_lp, grad_adv = jax.grad(losses.policy_gradient_loss, argnums=(0, 1))(jnp.array(-0.5), jnp.array(2.0))
    assert float(grad_lp) == -2.0 and float(grad_adv) == 0.0
    with pytest.raises(AssertionError):
        losses.value_loss(jnp.ones(2), jnp.ones(2))


def test_policy_head_discrete_and_continuous():
    discrete = onpolicy.PolicyHead.from_spec(specs.DiscreteArray(3))
    logits = jnp.array([[0.0, 5.0, 0.0], [9.0, 0.0, 0.0]])
    np.testing.assert_array_equal(discrete.greedy(logits), [1, 0])
    actions, log_prob = discrete.sample(jax.random.PRNGKey(0), logits, None)
    assert actions.dtype == jnp.int32 and actions.shape == (2,)
    np.testing.assert_allclose(log_prob, jax.nn.log_softmax(logits)[jnp.arange(2), actions], rtol=1e-6)

    spec = specs.BoundedArray((2,), np.float32, [-1.0, 0.0], [1.0, 2.0])
    continuous = onpolicy.PolicyHead.from_spec(spec)
    assert continuous.action_shape == (2,) and not continuous.discrete
    mean = jnp.array([[3.0, -3.0]])
    np.testing.assert_array_equal(continuous.greedy(mean), [[1.0, 0.0]])
    np.testing.assert_array_equal(continuous.to_env_numpy(np.array([[3.0, -3.0]])), [[1.0, 0.0]])
    log_std = jnp.log(jnp.array([1.0, 2.0]))
    log_prob, entropy = continuous.log_prob_and_entropy(jnp.zeros((1, 2)), log_std, jnp.array([[1.0, 2.0]]))
    expected = -0.5 * (1.0 + 1.0) - np.log(2.0) - np.log(2 * np.pi)  # z = (1, 1)
    np.testing.assert_allclose(log_prob, [expected], rtol=1e-6)
    np.testing.assert_allclose(entropy, [np.log(2.0) + np.log(2 * np.pi * np.e)], rtol=1e-6)
    with pytest.raises(QrlInputError, match="shape"):
        onpolicy.check_action_spec("ppo", "x:y", specs.BoundedArray((2, 2), np.float32, -1.0, 1.0))


def test_advantages_bootstrap_from_final_observation_on_truncation():
    observation_spec = specs.Array((2,), np.float32)
    config = ppo.Config(hidden_sizes=(8,))
    actor_critic = ppo.networks.make_actor_critic(config, observation_spec, specs.DiscreteArray(2))
    params = actor_critic.init(jax.random.PRNGKey(0), jnp.zeros((1, 2)))
    observation = jax.random.normal(jax.random.PRNGKey(1), (2, 1, 2))
    final_observation = jnp.stack([observation[1], jnp.full((1, 2), 3.0)])  # step 1 ends (truncated)
    rollout = onpolicy.Rollout(
        observation=observation, action=jnp.zeros((2, 1), jnp.int32), log_prob=jnp.zeros((2, 1)),
        reward=jnp.ones((2, 1)), discount=jnp.ones((2, 1)), done=jnp.array([[0.0], [1.0]]),
        final_observation=final_observation,
    )
    advantages, targets, values = onpolicy.advantages_and_returns(actor_critic, params, rollout, 0.9, 1.0)
    value = lambda x: float(actor_critic.value(params, x)[0])
    expected_1 = 1.0 + 0.9 * value(final_observation[1]) - value(observation[1])
    expected_0 = 1.0 + 0.9 * value(observation[1]) - value(observation[0]) + 0.9 * expected_1
    np.testing.assert_allclose(advantages[:, 0], [expected_0, expected_1], rtol=1e-5)
    np.testing.assert_allclose(targets, advantages + values, rtol=1e-6)


def _range_layers(quant_ranges):
    """The per-layer range entries (dicts holding `seen`) of a `quant_ranges` tree."""
    if "seen" in quant_ranges:
        return [quant_ranges]
    return [layer for node in quant_ranges.values() for layer in _range_layers(node)]


def _spy_agent(calls):
    """PPO whose updates report the precision they were built at, once per call."""

    def make_update(config, observation_spec, action_spec, num_iterations, policy_precision):
        update = ppo.learning.make_update(config, observation_spec, action_spec, num_iterations, policy_precision)

        def spied(state, rollout):
            jax.debug.callback(lambda: calls.append(policy_precision.name))
            return update(state, rollout)

        return spied

    return onpolicy.OnPolicyAgent("ppo", ppo.networks.make_actor_critic, ppo.learning.init, make_update)


def test_qat_switches_host_update_at_quant_delay():
    config = ppo.Config(num_envs=2, num_steps=16, batch_size=16, num_epochs=1, hidden_sizes=(16,),
                        qat_bits=8, quant_delay=4)
    calls = []
    state, results = onpolicy.train(_spy_agent(calls), ppo.check_env, "gym:CartPole-v1", config, 160, progress=False,
                                    eval_episodes=2)
    # 2 updates per rollout: float (ranges tracked) for the first 4 updates, then fake-quantized.
    assert calls == ["qat8-delay"] * 2 + ["qat8"] * 3
    assert results["qat_bits"] == 8 and results["quant_delay"] == 4 and results["env_steps"] == 160
    assert int(state.updates) == 10
    assert all(int(layer["seen"]) == 10 for layer in _range_layers(state.quant_ranges))
    assert np.isfinite(results["final_eval"]["mean"])
    with pytest.raises(QrlInputError, match="quant_delay"):
        onpolicy.train(_spy_agent([]), ppo.check_env, "gym:CartPole-v1", config, 64, progress=False)


def test_device_train_switches_to_qat_and_writes_results(tmp_path):
    config = ppo.Config(num_envs=2, num_steps=16, batch_size=16, num_epochs=1, hidden_sizes=(16,),
                        qat_bits=8, quant_delay=4)
    calls = []
    state, results = onpolicy.train(
        _spy_agent(calls), ppo.check_env, "gymnax:CartPole-v1", config, 160, seed=3, workdir=str(tmp_path),
        progress=False, eval_episodes=3, eval_every=64, log_every=32,
    )
    # lax.switch runs one branch per iteration: float, then quantized updates (acting float in the
    # first quantized iteration, then the int8 export), each building its update once.
    assert calls == ["qat8-delay"] * 2 + ["qat8"] * 3
    assert set(results) >= {"agent", "env", "seed", "env_steps", "updates", "episodes", "train_seconds",
                            "steps_per_second", "final_eval", "evaluations", "last_train_returns"}
    assert results["qat_bits"] == 8 and results["quant_delay"] == 4 and results["env_steps"] == 160
    assert results["updates"] == 10 and int(state.iterations) == 5 and results["final_eval"]["episodes"] == 3
    assert [evaluation["env_steps"] for evaluation in results["evaluations"]] == [64, 128]
    assert results["episodes"] >= len(results["last_train_returns"]) > 0
    assert (tmp_path / "metrics.csv").exists() and any((tmp_path / "checkpoints").iterdir())
