"""The offline loop: fused steps equal sequential updates, input checks, files and results."""

import csv
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agents import bc
from qrl import offline
from qrl.checkpointing import Checkpointer
from qrl.datasets import from_qlearning, normalize_observations, sample
from qrl.errors import QrlInputError

ENV_ID = "gym:Pendulum-v1"


def _dataset(size=300, observation_size=3, action_size=1, seed=0):
    rng = np.random.default_rng(seed)
    return from_qlearning({
        "observations": rng.normal(2.0, 3.0, (size, observation_size)).astype(np.float32),
        "actions": rng.uniform(-2.0, 2.0, (size, action_size)).astype(np.float32),
        "rewards": rng.normal(size=size).astype(np.float32),
        "terminals": rng.random(size) < 0.05,
        "next_observations": rng.normal(2.0, 3.0, (size, observation_size)).astype(np.float32),
    })


@pytest.fixture(scope="module")
def agent():
    config = bc.config_for({"hidden_sizes": "16-16", "learning_rate": 1e-2})
    return bc.build(config, *offline.env_specs(ENV_ID))


def _copy(state):
    return jax.tree.map(jnp.copy, state)


@pytest.mark.parametrize("normalize", [False, True])
def test_fused_step_equals_sequential_updates_on_the_same_batches(agent, normalize):
    dataset, key, batch_size, updates = _dataset(), jax.random.PRNGKey(7), 32, 5
    state = agent.init(jax.random.PRNGKey(0))
    batches = sample(dataset, key, batch_size, updates)
    if normalize:
        batches = batches.replace(observation=normalize_observations(dataset, batches.observation),
                                   next_observation=normalize_observations(dataset, batches.next_observation))
    single_update = jax.jit(agent.update)
    sequential, losses = _copy(state), []
    for index in range(updates):
        sequential, metrics = single_update(sequential, jax.tree.map(lambda leaf: leaf[index:index + 1], batches))
        losses.append(float(metrics["loss"]))

    step = offline.make_fused_step(agent, dataset, batch_size, updates, normalize_observations=normalize)
    fused, metrics = step(_copy(state), key)

    assert int(fused.updates) == int(sequential.updates) == updates
    for fused_leaf, sequential_leaf in zip(jax.tree.leaves(fused), jax.tree.leaves(sequential)):
        np.testing.assert_allclose(fused_leaf, sequential_leaf, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(float(metrics["loss"]), np.mean(losses), rtol=1e-5)
    assert not np.allclose(jax.tree.leaves(fused.actor_params)[0], jax.tree.leaves(state.actor_params)[0])


@pytest.mark.parametrize("sizes, message", [
    ((11, 1), "dataset observations have 11 dims, gym:Pendulum-v1 has 3"),
    ((3, 6), "dataset actions have 6 dims, gym:Pendulum-v1 has 1"),
])
def test_dataset_env_size_mismatch_is_one_line(agent, sizes, message):
    dataset = _dataset(observation_size=sizes[0], action_size=sizes[1])
    with pytest.raises(QrlInputError) as error:
        offline.check_dataset_matches_env(dataset, *offline.env_specs(ENV_ID), ENV_ID)
    assert str(error.value) == message
    with pytest.raises(QrlInputError, match=f"^{message}$"):
        offline.train_offline(agent, dataset, ENV_ID, steps=10, seed=0, progress=False)


def test_discrete_environment_is_rejected():
    with pytest.raises(QrlInputError, match="^offline agents need continuous actions; gym:CartPole-v1 has discrete"):
        offline.check_dataset_matches_env(_dataset(observation_size=4), *offline.env_specs("gym:CartPole-v1"),
                                          "gym:CartPole-v1")


@pytest.mark.parametrize("options, name", [
    ({"steps": 0}, "steps"), ({"steps": -5}, "steps"), ({"steps": 2.5}, "steps"), ({"steps": True}, "steps"),
    ({"batch_size": 0}, "batch_size"), ({"batch_size": "256"}, "batch_size"),
    ({"updates_per_call": 0}, "updates_per_call"), ({"eval_every": -1}, "eval_every"),
])
def test_bad_counts_are_one_line_input_errors(agent, options, name):
    arguments = {"steps": 10, **options}
    with pytest.raises(QrlInputError) as error:
        offline.train_offline(agent, _dataset(), ENV_ID, seed=0, progress=False, **arguments)
    assert str(error.value).startswith(f"{name} must be") and "\n" not in str(error.value)


def test_train_offline_writes_metrics_checkpoints_and_normalized_score(agent, tmp_path):
    workdir, reference = str(tmp_path / "run"), (-1500.0, -150.0)
    state, results = offline.train_offline(
        agent, _dataset(), ENV_ID, steps=25, seed=3, workdir=workdir, batch_size=16, updates_per_call=10,
        eval_every=10, eval_episodes=2, reference=reference, log_every=10, checkpoint_every=20, progress=False,
    )
    # K=10 over 25 steps: calls of 10, 10 and 5 updates.
    assert results["steps"] == 25 and results["updates"] == int(state.updates) == 25
    assert [evaluation["steps"] for evaluation in results["evaluations"]] == [10, 20, 25]
    returns = np.asarray(results["final_eval"]["returns"])
    assert len(returns) == 2 and results["final_eval"]["mean"] == pytest.approx(returns.mean())
    by_hand = 100.0 * (returns - (-1500.0)) / (-150.0 - (-1500.0))
    assert results["normalized_score"]["mean"] == pytest.approx(by_hand.mean())
    assert results["normalized_score"]["std"] == pytest.approx(by_hand.std())
    assert results["train_seconds"] > 0 and results["steps_per_second"] > 0

    with open(os.path.join(workdir, "metrics.csv"), newline="") as csv_file:
        rows = list(csv.DictReader(csv_file))
    assert [row["step"] for row in rows if row["loss"]] == ["10", "20", "25"]
    final_rows = [row for row in rows if row["eval_return"]]
    assert [row["step"] for row in final_rows] == ["10", "20", "25"]
    assert float(final_rows[-1]["normalized_score"]) == pytest.approx(by_hand.mean())

    checkpointer = Checkpointer(os.path.join(workdir, "checkpoints"))
    assert checkpointer.all_steps() == [20, 25]
    restored = checkpointer.restore(agent.init(jax.random.PRNGKey(0)))
    assert checkpointer.restore_extra()["steps"] == 25
    for restored_leaf, leaf in zip(jax.tree.leaves(restored), jax.tree.leaves(state)):
        np.testing.assert_array_equal(restored_leaf, leaf)
    checkpointer.close()
