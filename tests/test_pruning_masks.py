"""Exact-count masks, the layer-collapse guard, masked optimizers and Polyak averaging, mask storage."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import serialization

from pruning import (
    apply_mask,
    check_mask,
    check_pruner,
    kept_count,
    kept_fraction,
    layer_kept_fractions,
    magnitude_scores,
    mask_from_arrays,
    mask_overlap,
    mask_to_arrays,
    masked,
    masks_from_scores,
    polyak_masked,
    prunable_leaves,
    random_masks,
)
from qrl.errors import QrlInputError

SPARSITIES = (0.0, 0.5, 0.8, 0.9, 0.95, 0.98, 0.99)


def _scores(*shapes, fill=None, seed=0):
    """Scores of kernels with `shapes` (biases None): `fill` everywhere, or random."""
    keys = jax.random.split(jax.random.key(seed), len(shapes))
    layers = {}
    for i, (key, shape) in enumerate(zip(keys, shapes)):
        values = jnp.full(shape, fill) if fill is not None else jax.random.uniform(key, shape)
        layers[f"dense_{i}"] = {"kernel": values, "bias": None}
    return {"params": layers}


def _counts(mask):
    return [int(np.sum(kept)) for kept in jax.tree.leaves(mask)]


# Kernels of 512, 1024 and 128 weights (1664): kept = round((1 - s) * 1664).
NETWORK_KEPT = {0.0: 1664, 0.5: 832, 0.8: 333, 0.9: 166, 0.95: 83, 0.98: 33, 0.99: 17}
LAYER_KEPT = {
    0.0: [512, 1024, 128],
    0.5: [256, 512, 64],
    0.8: [102, 205, 26],
    0.9: [51, 102, 13],
    0.95: [26, 51, 6],
    0.98: [10, 20, 3],
    0.99: [5, 10, 1],
}
# The same network plus one of 320 + 16 weights: 2000 in all.
GLOBAL_KEPT = {0.0: 2000, 0.5: 1000, 0.8: 400, 0.9: 200, 0.95: 100, 0.98: 40, 0.99: 20}


@pytest.mark.parametrize("fill", [None, 1.0], ids=["random", "all_equal"])
@pytest.mark.parametrize("sparsity", SPARSITIES)
def test_exact_kept_counts_for_every_scope(sparsity, fill):
    scores = _scores((16, 32), (32, 32), (32, 4), fill=fill)
    assert kept_count(masks_from_scores(scores, sparsity)) == NETWORK_KEPT[sparsity]
    assert _counts(masks_from_scores(scores, sparsity, scope="layer")) == LAYER_KEPT[sparsity]
    networks = {"actor": scores, "critic": _scores((20, 16), (16, 1), fill=fill, seed=1)}
    masks = masks_from_scores(networks, sparsity, scope="global")
    assert set(masks) == {"actor", "critic"}
    assert kept_count(masks["actor"]) + kept_count(masks["critic"]) == GLOBAL_KEPT[sparsity]


def test_ties_are_broken_by_flattening_order():
    scores = _scores((16, 32), (32, 32), (32, 4), fill=1.0)
    mask = masks_from_scores(scores, 0.5, min_kept_per_layer=0)
    assert mask["params"]["dense_0"]["bias"] is None
    assert bool(np.all(mask["params"]["dense_0"]["kernel"]))
    np.testing.assert_array_equal(np.flatnonzero(mask["params"]["dense_1"]["kernel"]), np.arange(320))
    assert not np.any(mask["params"]["dense_2"]["kernel"])
    # With the guard, dense_2's first weight displaces the lowest-ranked kept one, dense_1's 320th.
    mask = masks_from_scores(scores, 0.5)
    np.testing.assert_array_equal(np.flatnonzero(mask["params"]["dense_1"]["kernel"]), np.arange(319))
    np.testing.assert_array_equal(np.flatnonzero(mask["params"]["dense_2"]["kernel"]), [0])
    # At 0.99 the 17 kept would all be dense_0's first; the guard gives dense_1 and dense_2 their
    # first weight and takes back the two lowest-ranked of dense_0's.
    mask = masks_from_scores(scores, 0.99)
    assert _counts(mask) == [15, 1, 1]
    np.testing.assert_array_equal(np.flatnonzero(mask["params"]["dense_0"]["kernel"]), np.arange(15))
    np.testing.assert_array_equal(np.flatnonzero(mask["params"]["dense_1"]["kernel"]), [0])


def test_ties_at_the_threshold_keep_the_earlier_weights():
    scores = {"layer": {"kernel": jnp.asarray(np.random.default_rng(0).integers(0, 4, (50, 100)), jnp.float32)}}
    values = np.asarray(scores["layer"]["kernel"]).ravel()
    kept = np.asarray(masks_from_scores(scores, 0.5)["layer"]["kernel"]).ravel()
    assert kept.sum() == 2500
    threshold = values[kept].min()
    assert np.all(kept[values > threshold]) and not np.any(kept[values < threshold])
    tied = np.flatnonzero(values == threshold)
    assert 0 < kept[tied].sum() < tied.size
    assert np.flatnonzero(kept[tied]).max() < np.flatnonzero(~kept[tied]).min()


def test_layer_collapse_guard_keeps_a_tiny_layer_alive_at_an_exact_total():
    scores = {
        "big": {"kernel": jnp.arange(1.0, 101.0).reshape(10, 10)},
        "tiny": {"kernel": jnp.array([[1e-6, 3e-6], [2e-6, 1e-6]])},
    }
    # 104 weights at 0.9: round(10.4) = 10 kept, all of them the big layer's largest without the guard.
    assert _counts(masks_from_scores(scores, 0.9, min_kept_per_layer=0)) == [10, 0]
    mask = masks_from_scores(scores, 0.9)
    assert _counts(mask) == [9, 1]
    np.testing.assert_array_equal(mask["tiny"]["kernel"], [[False, True], [False, False]])
    np.testing.assert_array_equal(np.flatnonzero(mask["big"]["kernel"]), np.arange(91, 100))
    assert _counts(masks_from_scores(scores, 0.9, min_kept_per_layer=3)) == [7, 3]
    # At 0.99 the target is round(1.04) = 1: the guard's minimums (1 + 1) exceed it and win.
    assert _counts(masks_from_scores(scores, 0.99)) == [1, 1]
    # Per layer at 0.9: round(10) = 10 and round(0.4) = 0, raised to 1 by the guard.
    assert _counts(masks_from_scores(scores, 0.9, scope="layer")) == [10, 1]


def test_keep_lowest_selects_the_lowest_scores():
    scores = {"layer": {"kernel": jnp.array([[5.0, 1.0], [3.0, -2.0]])}}
    np.testing.assert_array_equal(masks_from_scores(scores, 0.5, keep="lowest")["layer"]["kernel"], [[0, 1], [0, 1]])
    np.testing.assert_array_equal(masks_from_scores(scores, 0.5)["layer"]["kernel"], [[1, 0], [1, 0]])
    np.testing.assert_array_equal(masks_from_scores(scores, 0.75, keep="lowest")["layer"]["kernel"], [[0, 0], [0, 1]])


def _one_line_error(call, match):
    with pytest.raises(QrlInputError, match=match) as error:
        call()
    assert "\n" not in str(error.value)


def test_bad_input_is_one_line():
    scores = _scores((4, 4))
    _one_line_error(lambda: masks_from_scores(scores, 1.0), r"^sparsity must be in \[0, 1\), got 1.0$")
    _one_line_error(lambda: masks_from_scores(scores, -0.1), r"^sparsity must be in \[0, 1\), got -0.1$")
    _one_line_error(lambda: masks_from_scores(scores, 0.5, scope="model"), "unknown mask scope 'model'")
    _one_line_error(lambda: masks_from_scores(scores, 0.5, keep="middle"), "keep must be one of highest, lowest")
    layer = {"kernel": jnp.ones((4, 4))}
    _one_line_error(lambda: masks_from_scores(layer, 0.5, scope="global"), "dict of networks")
    _one_line_error(lambda: masks_from_scores(scores, 0.5, min_kept_per_layer=-1), "min_kept_per_layer must be")
    nan_scores = {"params": {"dense_0": {"kernel": jnp.array([[1.0, jnp.nan]])}}}
    _one_line_error(lambda: masks_from_scores(nan_scores, 0.5), "scores of params/dense_0/kernel are not all finite")
    known = "snip, grasp, synflow, magnitude, random, none"
    _one_line_error(lambda: check_pruner("obd"), f"^unknown pruner 'obd'; known: {known}$")
    assert check_pruner("grasp") == "grasp"


def _params():
    keys = jax.random.split(jax.random.key(7), 4)
    return {
        "params": {
            "dense_0": {"kernel": jax.random.normal(keys[0], (32, 64)), "bias": jax.random.normal(keys[1], (64,))},
            "dense_1": {"kernel": jax.random.normal(keys[2], (64, 64)), "bias": jax.random.normal(keys[3], (64,))},
        }
    }


def test_mismatched_masks_are_one_line_errors():
    params = _params()
    mask = random_masks(jax.random.key(0), params, 0.5, prunable_leaves(params))
    wrong_shape = jax.tree.map(lambda kept: kept, mask)
    wrong_shape["params"]["dense_1"]["kernel"] = jnp.ones((32, 64), bool)
    _one_line_error(
        lambda: check_mask(params, wrong_shape),
        r"^mask does not match params: params/dense_1/kernel has shape \(64, 64\), mask \(32, 64\)$",
    )
    missing = {"params": {"dense_0": mask["params"]["dense_0"]}}
    _one_line_error(lambda: apply_mask(params, missing), "params/dense_1/bias is missing from the mask")
    extra = {"params": {**mask["params"], "dense_2": {"kernel": None}}}
    _one_line_error(
        lambda: check_mask(params, extra, where="checkpoint mask"), "checkpoint mask has params/dense_2/kernel"
    )
    floats = jax.tree.map(lambda kept: kept.astype(jnp.float32), mask)
    _one_line_error(lambda: check_mask(params, floats), "params/dense_0/kernel is float32, not bool")
    smaller = {"params": {"dense_0": params["params"]["dense_0"]}}
    _one_line_error(
        lambda: masked(optax.adam(1e-3), mask).init(smaller), "mask has params/dense_1/bias, which the params lack"
    )


def test_apply_mask_zeroes_pruned_entries_inside_and_outside_jit():
    params = {"layer": {"kernel": jnp.array([[1.0, -2.0], [3.0, 4.0]]), "bias": jnp.array([5.0, 6.0])}}
    mask = {"layer": {"kernel": jnp.array([[True, False], [False, True]]), "bias": None}}
    for apply in (apply_mask, jax.jit(apply_mask)):
        result = apply(params, mask)
        np.testing.assert_array_equal(result["layer"]["kernel"], [[1.0, 0.0], [0.0, 4.0]])
        np.testing.assert_array_equal(result["layer"]["bias"], [5.0, 6.0])


def test_kept_counts_fractions_and_overlap_hand_computed():
    mask_a = {
        "a": {"kernel": jnp.array([[True, False], [True, True]]), "bias": None},
        "b": {"kernel": jnp.array([[False, False]])},
    }
    mask_b = {
        "a": {"kernel": jnp.array([[True, True], [False, True]]), "bias": None},
        "b": {"kernel": jnp.array([[False, True]])},
    }
    assert kept_count(mask_a) == 3
    assert kept_fraction(mask_a) == 3 / 6
    assert layer_kept_fractions(mask_a) == {"a/kernel": 0.75, "b/kernel": 0.0}
    # Both keep a[0,0] and a[1,1]; together they keep a[0,0], a[0,1], a[1,0], a[1,1], b[0,1].
    assert mask_overlap(mask_a, mask_b) == 2 / 5
    assert mask_overlap(mask_a, mask_a) == 1.0
    _one_line_error(lambda: mask_overlap(mask_a, {"a": mask_a["a"]}), "different key paths")


def _adam_state(state):
    return optax.tree_utils.tree_get(state, "mu"), optax.tree_utils.tree_get(state, "nu")


@pytest.mark.parametrize("arrangement", ["masked_chain", "chain_with_masked_adamw"])
def test_masked_adam_keeps_pruned_weights_and_moments_exactly_zero(arrangement):
    params = _params()
    mask = masks_from_scores(magnitude_scores(params, prunable_leaves(params)), 0.8, scope="layer")
    if arrangement == "masked_chain":
        optimizer = masked(optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-2, weight_decay=1e-2)), mask)
    else:
        optimizer = optax.chain(optax.clip_by_global_norm(1.0), masked(optax.adamw(1e-2, weight_decay=1e-2), mask))
    start = apply_mask(params, mask)
    target = start

    @jax.jit
    def train(params, target, key):
        def step(carry, step_key):
            params, target, state = carry
            leaves, treedef = jax.tree.flatten(params)
            keys = jax.random.split(step_key, len(leaves))
            gradient = jax.tree.unflatten(treedef, [jax.random.normal(k, leaf.shape) for k, leaf in zip(keys, leaves)])
            updates, state = optimizer.update(gradient, state, params)
            params = optax.apply_updates(params, updates)
            return (params, polyak_masked(params, target, 0.05, mask), state), None

        carry, _ = jax.lax.scan(step, (params, target, optimizer.init(params)), jax.random.split(key, 200))
        return carry

    params_after, target_after, state = train(start, target, jax.random.key(1))
    mu, nu = _adam_state(state)
    for layer in ("dense_0", "dense_1"):
        kept = np.asarray(mask["params"][layer]["kernel"])
        assert 0.15 < kept.mean() < 0.25
        for tree in (params_after, target_after, mu, nu):
            assert np.all(np.asarray(tree["params"][layer]["kernel"])[~kept] == 0.0)
        moved = np.asarray(params_after["params"][layer]["kernel"] != start["params"][layer]["kernel"])
        assert np.all(moved[kept])
        assert np.all(np.asarray(nu["params"][layer]["kernel"])[kept] > 0.0)
        assert np.all(np.asarray(target_after["params"][layer]["kernel"] != start["params"][layer]["kernel"])[kept])
        assert np.all(np.asarray(params_after["params"][layer]["bias"] != start["params"][layer]["bias"]))


def test_masked_zeroes_updates_the_inner_transform_makes_up_for_pruned_weights():
    params = {"w": jnp.array([[1.0, 0.0, 2.0]])}
    mask = {"w": jnp.array([[True, False, True]])}
    optimizer = masked(optax.chain(optax.add_noise(1.0, 0.0, seed=0), optax.sgd(0.1)), mask)
    state = optimizer.init(params)
    updates, _ = jax.jit(optimizer.update)({"w": jnp.ones((1, 3))}, state, params)
    assert updates["w"][0, 1] == 0.0
    assert np.all(np.asarray(updates["w"])[0, [0, 2]] != 0.0)


def test_polyak_masked_hand_computed_and_sparsifies_a_dense_target():
    online = {"w": jnp.array([[2.0, 4.0]]), "b": jnp.array([1.0])}
    target = {"w": jnp.array([[6.0, 8.0]]), "b": jnp.array([3.0])}
    mask = {"w": jnp.array([[True, False]]), "b": None}
    result = polyak_masked(online, target, 0.25, mask)
    # 0.25 * 2 + 0.75 * 6 = 5; the pruned entry is 0 though the target held 8; the bias is averaged.
    np.testing.assert_allclose(result["w"], [[5.0, 0.0]])
    np.testing.assert_allclose(result["b"], [2.5])


def test_mask_round_trip_through_arrays_and_msgpack_is_exact():
    params = _params()
    prunable = prunable_leaves(params)
    prunable["params"]["dense_0"]["kernel"] = False
    mask = random_masks(jax.random.key(4), params, 0.9, prunable)
    arrays = mask_to_arrays(mask)
    assert list(arrays) == ["params"] and list(arrays["params"]) == ["dense_1"]
    assert arrays["params"]["dense_1"]["kernel"].dtype == np.uint8
    restored = mask_from_arrays(serialization.msgpack_restore(serialization.msgpack_serialize(arrays)), params)
    assert restored["params"]["dense_0"]["kernel"] is None and restored["params"]["dense_1"]["bias"] is None
    assert restored["params"]["dense_1"]["kernel"].dtype == jnp.bool_
    np.testing.assert_array_equal(restored["params"]["dense_1"]["kernel"], mask["params"]["dense_1"]["kernel"])
    check_mask(params, restored)


def test_stored_mask_of_other_params_is_rejected():
    params = _params()
    arrays = mask_to_arrays(random_masks(jax.random.key(4), params, 0.9, prunable_leaves(params)))
    smaller = {"params": {"dense_0": params["params"]["dense_0"]}}
    _one_line_error(lambda: mask_from_arrays(arrays, smaller), "it has params/dense_1/kernel, which the params lack")
    arrays["params"]["dense_1"]["kernel"] = arrays["params"]["dense_1"]["kernel"][:32]
    _one_line_error(
        lambda: mask_from_arrays(arrays, params), r"params/dense_1/kernel has shape \(64, 64\), stored mask \(32, 64\)"
    )
