"""Many configurations in one program (`qrl.offline_many`) against the sequential loop
(`qrl.offline.train_offline`) for the same seeds and masks; `evaluation.evaluate_many`."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agents import bc, bcq
from pruning import PruneSettings, apply_mask, prune_networks, prunable_leaves, random_masks
from qrl import evaluation, offline
from qrl.errors import QrlInputError
from qrl.offline_many import train_many, uniform_masks
from tests.test_offline import ENV_ID, _dataset

# Measured (AMD EPYC, 2 cores): after 300 BC updates (32-32 actor) the vmapped and sequential
# params differ by at most 2.3e-6 (batched matmuls may sum in another order) and the evaluation
# returns by less than 1e-6 relative; the bound leaves a margin of about 40x.
PARAM_TOLERANCE = 1e-4


def _masks(config, observation_spec, action_spec):
    dense = bc.build(config, observation_spec, action_spec)
    actor = bc.learning.networks_at_init(dense.init(jax.random.PRNGKey(0)))["actor"]
    return [None, {"actor": random_masks(jax.random.PRNGKey(5), actor, 0.9, prunable_leaves(actor))},
            {"actor": random_masks(jax.random.PRNGKey(6), actor, 0.8, prunable_leaves(actor))}]


@pytest.mark.parametrize("normalize", [False, True])
def test_bc_configurations_match_their_sequential_runs(normalize):
    dataset = _dataset(size=500)
    config = bc.config_for({"hidden_sizes": "32-32", "batch_size": 32, "updates_per_call": 7,
                            "normalize_observations": normalize})
    observation_spec, action_spec = offline.env_specs(ENV_ID)
    seeds, masks = [0, 1, 2], _masks(config, observation_spec, action_spec)
    states, results = train_many(bc.build, dataset, ENV_ID, config, steps=300, seeds=seeds, masks=masks,
                                 eval_every=150, eval_episodes=2, reference=(-1400.0, -200.0), progress=False)
    for c, (seed, mask) in enumerate(zip(seeds, masks)):
        state, expected = bc.train(dataset, ENV_ID, config, 300, seed, mask=mask, eval_every=150, eval_episodes=2,
                                   reference=(-1400.0, -200.0), progress=False)
        mine = jax.tree.map(lambda leaf: leaf[c], states)
        for a, b in zip(jax.tree.leaves(bc.learning.policy_params(state)),
                        jax.tree.leaves(bc.learning.policy_params(mine))):
            np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=PARAM_TOLERANCE, rtol=0)
        if mask is not None:  # pruned weights stay exactly zero
            params = bc.learning.policy_params(mine)
            for a, b in zip(jax.tree.leaves(apply_mask(params, mask["actor"])), jax.tree.leaves(params)):
                np.testing.assert_array_equal(a, b)
        got = results[c]
        assert got["seed"] == seed and got["updates"] == expected["updates"] == 300
        assert [row["steps"] for row in got["evaluations"]] == [row["steps"] for row in expected["evaluations"]]
        for mine_row, their_row in zip(got["evaluations"], expected["evaluations"]):
            np.testing.assert_allclose(mine_row["returns"], their_row["returns"], rtol=1e-3)
            assert mine_row["seed"] == their_row["seed"]
        assert got["normalized_score"]["mean"] == pytest.approx(expected["normalized_score"]["mean"], rel=1e-3)
        assert set(got["last_metrics"]) == set(expected["last_metrics"])


def test_bcq_runs_many_configurations_with_vae_masks():
    dataset = _dataset(size=400)
    config = bcq.config_for({"vae_hidden_sizes": "16-16", "actor_hidden_sizes": "8-8", "critic_hidden_sizes": "8-8",
                             "batch_size": 16, "acting_samples": 4, "updates_per_call": 5})
    observation_spec, action_spec = offline.env_specs(ENV_ID)
    state = bcq.build(config, observation_spec, action_spec).init(jax.random.PRNGKey(0))
    networks = bcq.learning.networks_at_init(state)
    masks = prune_networks("random", networks, {}, [], PruneSettings(sparsity=0.5), key=jax.random.PRNGKey(1))
    states, results = train_many(bcq.build, dataset, ENV_ID, config, steps=10, seeds=[0, 3], masks=[masks, None],
                                 eval_every=0, eval_episodes=1, progress=False)
    sequential, expected = bcq.train(dataset, ENV_ID, config, 10, 3, eval_every=0, eval_episodes=1, progress=False)
    mine = jax.tree.map(lambda leaf: leaf[1], states)
    for a, b in zip(jax.tree.leaves(sequential.actor_params), jax.tree.leaves(mine.actor_params)):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=PARAM_TOLERANCE, rtol=0)
    assert [row["updates"] for row in results] == [10, 10]
    assert np.isfinite(results[0]["final_eval"]["mean"])


def test_uniform_masks_fill_unmasked_networks_with_all_kept_and_reject_other_layouts():
    mask = {"actor": {"kernel": jnp.array([[True, False]]), "bias": None}}
    stacked = uniform_masks([None, mask])
    np.testing.assert_array_equal(stacked["actor"]["kernel"], [[[True, True]], [[True, False]]])
    assert uniform_masks([None, None]) is None
    with pytest.raises(QrlInputError, match="another layout"):
        uniform_masks([mask, {"actor": {"kernel": jnp.array([[True, False, True]]), "bias": None}}])


def test_train_many_rejects_a_mask_count_other_than_the_seeds():
    config = bc.config_for({"hidden_sizes": "8"})
    with pytest.raises(QrlInputError, match="2 seeds and 1 masks"):
        train_many(bc.build, _dataset(), ENV_ID, config, steps=5, seeds=[0, 1], masks=[None], progress=False)
    with pytest.raises(QrlInputError, match="at least one configuration"):
        train_many(bc.build, _dataset(), ENV_ID, config, steps=5, seeds=[], progress=False)


def test_evaluate_many_equals_evaluate_per_seed():
    def policy(observations):  # [E, 3] -> [E, 1], a fixed swing-up-ish controller
        return np.clip(-2.0 * observations[..., 1:2] - 0.5 * observations[..., 2:3], -2.0, 2.0)

    many = evaluation.evaluate_many(lambda obs: np.stack([policy(o) * scale for o, scale in zip(obs, (1.0, 0.5))]),
                                    ENV_ID, [10, 20], episodes=3, max_steps=60)
    one = evaluation.evaluate(policy, ENV_ID, 3, seed=10, max_steps=60)
    assert many[0].returns == one.returns and many[0].seed == 10
    half = evaluation.evaluate(lambda obs: policy(obs) * 0.5, ENV_ID, 3, seed=20, max_steps=60)
    assert many[1].returns == half.returns and many[1].lengths == half.lengths
    with pytest.raises(QrlInputError, match="at least one seed"):
        evaluation.evaluate_many(policy, ENV_ID, [], 1)

