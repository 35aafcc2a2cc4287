"""Saliency scores against hand-computed gradients and finite differences; SynFlow and random masks."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pruning import (
    PruneSettings,
    erk_densities,
    grasp_scores,
    hessian_gradient_product,
    kept_count,
    layer_kept_fractions,
    layer_names,
    magnitude_scores,
    mask_overlap,
    masks_from_scores,
    prunable_leaves,
    prune_networks,
    random_masks,
    scorers,
    snip_scores,
    synflow_masks,
)
from qrl.errors import QrlInputError
from qrl.networks import MLP


def _two_layer_params(dtype=jnp.float32):
    return {
        "params": {
            "dense_0": {"kernel": jnp.array([[1.0, -1.0], [0.5, 1.0]], dtype), "bias": jnp.zeros(2, dtype)},
            "dense_1": {"kernel": jnp.array([[1.0], [-2.0]], dtype), "bias": jnp.array([0.5], dtype)},
        }
    }


def _relu_mse(params, batch, temperature):
    """0.5 * mean((relu(x W0 + b0) W1 + b1) / T - y)^2): x [B, 2], y [B, 1]."""
    x, y = batch
    layers = params["params"]
    hidden = jax.nn.relu(x @ layers["dense_0"]["kernel"] + layers["dense_0"]["bias"])
    out = hidden @ layers["dense_1"]["kernel"] + layers["dense_1"]["bias"]
    return 0.5 * jnp.mean((out / temperature - y) ** 2)


def test_snip_equals_abs_weight_times_hand_computed_gradient():
    # x = [1, 2]: pre = x W0 = [2, 1] (both ReLUs active), out = 2*1 + 1*(-2) + 0.5 = 0.5, y = 2:
    # dL/dout = -1.5; dL/dW1 = h^T (-1.5) = [[-3], [-1.5]]; dL/dpre = -1.5 * W1^T = [-1.5, 3];
    # dL/dW0 = x^T dL/dpre = [[-1.5, 3], [-3, 6]].
    params = _two_layer_params()
    batch = (jnp.array([[1.0, 2.0]]), jnp.array([[2.0]]))
    scores = snip_scores(_relu_mse, params, [batch], prunable_leaves(params))
    np.testing.assert_allclose(scores["params"]["dense_0"]["kernel"], [[1.5, 3.0], [1.5, 6.0]])
    np.testing.assert_allclose(scores["params"]["dense_1"]["kernel"], [[3.0], [3.0]])
    assert scores["params"]["dense_0"]["bias"] is None and scores["params"]["dense_1"]["bias"] is None


def test_snip_averages_gradients_over_batches():
    # The second batch's target equals the output (0.5): zero gradient, so the average halves.
    params = _two_layer_params()
    x = jnp.array([[1.0, 2.0]])
    batches = [(x, jnp.array([[2.0]])), (x, jnp.array([[0.5]]))]
    scores = snip_scores(_relu_mse, params, batches, prunable_leaves(params))
    np.testing.assert_allclose(scores["params"]["dense_0"]["kernel"], [[0.75, 1.5], [0.75, 3.0]])
    np.testing.assert_allclose(scores["params"]["dense_1"]["kernel"], [[1.5], [1.5]])


def test_magnitude_scores_are_absolute_weights():
    params = _two_layer_params()
    scores = magnitude_scores(params, prunable_leaves(params, include_biases=True))
    np.testing.assert_array_equal(scores["params"]["dense_0"]["kernel"], [[1.0, 1.0], [0.5, 1.0]])
    np.testing.assert_array_equal(scores["params"]["dense_1"]["bias"], [0.5])


def _tanh_mse(params, batch, temperature):
    """0.5 * mean((tanh(x W0 + b0) W1 + b1) / T - y)^2): a loss with a non-trivial Hessian."""
    x, y = batch
    layers = params["params"]
    hidden = jnp.tanh(x @ layers["dense_0"]["kernel"] + layers["dense_0"]["bias"])
    out = hidden @ layers["dense_1"]["kernel"] + layers["dense_1"]["bias"]
    return 0.5 * jnp.mean((out / temperature - y) ** 2)


def _tanh_problem(dtype):
    keys = jax.random.split(jax.random.key(3), 6)
    params = {
        "params": {
            "dense_0": {
                "kernel": jax.random.normal(keys[0], (3, 5), dtype),
                "bias": 0.1 * jax.random.normal(keys[1], (5,), dtype),
            },
            "dense_1": {
                "kernel": jax.random.normal(keys[2], (5, 2), dtype),
                "bias": 0.1 * jax.random.normal(keys[3], (2,), dtype),
            },
        }
    }
    batches = [
        (jax.random.normal(keys[4], (4, 3), dtype), jax.random.normal(keys[5], (4, 2), dtype)),
        (jax.random.normal(keys[5], (4, 3), dtype), jax.random.normal(keys[4], (4, 2), dtype)),
    ]
    return params, batches


@pytest.mark.parametrize("temperature", [1.0, 2.0])
def test_grasp_hessian_gradient_product_matches_central_differences(temperature):
    with jax.enable_x64(True):
        params, batches = _tanh_problem(jnp.float64)
        gradient_fn = jax.grad(_tanh_mse)

        def mean_gradient(p):
            grads = [gradient_fn(p, batch, temperature) for batch in batches]
            return jax.tree.map(lambda *leaves: sum(leaves) / len(leaves), *grads)

        g = mean_gradient(params)
        epsilon = 1e-4
        plus = mean_gradient(jax.tree.map(lambda w, d: w + epsilon * d, params, g))
        minus = mean_gradient(jax.tree.map(lambda w, d: w - epsilon * d, params, g))
        finite_difference = jax.tree.map(lambda a, b: (a - b) / (2 * epsilon), plus, minus)

        gradient, product = hessian_gradient_product(_tanh_mse, params, batches, temperature)
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-10), gradient, g)
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-9), product, finite_difference)
        # GraSP's direction is the gradient on the prunable kernels only (biases zero): H_ww g_w.
        kernels_only = jax.tree_util.tree_map_with_path(
            lambda path, d: d if path[-1].key == "kernel" else jnp.zeros_like(d), g)
        plus = mean_gradient(jax.tree.map(lambda w, d: w + epsilon * d, params, kernels_only))
        minus = mean_gradient(jax.tree.map(lambda w, d: w - epsilon * d, params, kernels_only))
        weights_product = jax.tree.map(lambda a, b: (a - b) / (2 * epsilon), plus, minus)
        scores = grasp_scores(_tanh_mse, params, batches, prunable_leaves(params), temperature)
        for layer in ("dense_0", "dense_1"):
            expected = -params["params"][layer]["kernel"] * weights_product["params"][layer]["kernel"]
            np.testing.assert_allclose(scores["params"][layer]["kernel"], expected, rtol=1e-6, atol=1e-9)
            assert scores["params"][layer]["bias"] is None


def test_grasp_temperature_changes_scores():
    params, batches = _tanh_problem(jnp.float32)
    prunable = prunable_leaves(params)
    cold = grasp_scores(_tanh_mse, params, batches, prunable, temperature=1.0)
    warm = grasp_scores(_tanh_mse, params, batches, prunable, temperature=2.0)
    difference = np.abs(np.asarray(cold["params"]["dense_0"]["kernel"] - warm["params"]["dense_0"]["kernel"]))
    assert difference.max() > 1e-3


def test_grasp_rejects_non_positive_temperature():
    params, batches = _tanh_problem(jnp.float32)
    with pytest.raises(QrlInputError, match="temperature must be > 0"):
        grasp_scores(_tanh_mse, params, batches, prunable_leaves(params), temperature=0.0)


def test_scoring_needs_a_batch():
    params = _two_layer_params()
    with pytest.raises(QrlInputError, match="at least one batch"):
        snip_scores(_relu_mse, params, [], prunable_leaves(params))


def test_prunable_leaves_kernels_by_default_biases_on_request_and_exclusion():
    params = {
        "params": {
            "dense_1": {"kernel": jnp.ones((2, 3)), "bias": jnp.ones(3)},
            "dense_10": {"kernel": jnp.ones((3, 1)), "bias": jnp.ones(1)},
            "norm": {"scale": jnp.ones(3)},
        }
    }
    assert layer_names(params) == [
        "params/dense_1/bias",
        "params/dense_1/kernel",
        "params/dense_10/bias",
        "params/dense_10/kernel",
        "params/norm/scale",
    ]
    assert jax.tree.leaves(prunable_leaves(params)) == [False, True, False, True, False]
    assert jax.tree.leaves(prunable_leaves(params, include_biases=True)) == [True, True, True, True, False]
    # "dense_1" is a whole path component: it does not match dense_10.
    assert jax.tree.leaves(prunable_leaves(params, include_biases=True, exclude=["dense_1"])) == [
        False,
        False,
        True,
        True,
        False,
    ]
    assert jax.tree.leaves(prunable_leaves(params, exclude="params/dense_10")) == [False, True, False, False, False]


def test_prunable_leaves_rejects_an_exclusion_that_matches_nothing():
    with pytest.raises(QrlInputError, match="'dense_9' matches no layer") as error:
        prunable_leaves(_two_layer_params(), exclude=("dense_9",))
    assert "\n" not in str(error.value)


def test_scorers_reject_a_prunable_tree_of_other_params():
    params = _two_layer_params()
    other = {"params": {"dense_0": params["params"]["dense_0"]}}
    with pytest.raises(QrlInputError, match="prunable does not match params"):
        magnitude_scores(params, prunable_leaves(other))


def _linear_flow(params, x):
    """x [B, 2] -> [B, 1] through two linear layers (SynFlow's flow is then a sum over paths)."""
    layers = params["params"]
    hidden = x @ layers["dense_0"]["kernel"] + layers["dense_0"]["bias"]
    return hidden @ layers["dense_1"]["kernel"] + layers["dense_1"]["bias"]


def test_synflow_hand_computed_flows():
    params = {
        "params": {
            "dense_0": {"kernel": jnp.array([[1.0, -3.0], [2.0, 0.5]]), "bias": jnp.zeros(2)},
            "dense_1": {"kernel": jnp.array([[0.5], [-1.0]]), "bias": jnp.zeros(1)},
        }
    }
    prunable = prunable_leaves(params)
    # |W0| column sums 3 and 3.5: flows |W0_ij| |W1_j| = [[0.5, 3], [1, 0.5]] and |W1_j| * sum = [1.5, 3.5].
    # One iteration at 0.5 keeps the best 3 of 6: 3.5, 3 and 1.5.
    mask = synflow_masks(_linear_flow, params, (1, 2), 0.5, prunable, iterations=1)
    np.testing.assert_array_equal(mask["params"]["dense_0"]["kernel"], [[False, True], [False, False]])
    np.testing.assert_array_equal(mask["params"]["dense_1"]["kernel"], [[True], [True]])
    # Two: round(6 * 0.5 ** 0.5) = 4 keep 3.5, 3, 1.5 and 1. Rescored, column sums 2 and 3 give
    # W0: 3 (W0_01), 1 (W0_10); W1: 1 (W1_0), 3 (W1_1); 3 kept, the tie at 1 to the earlier, W0_10.
    mask = synflow_masks(_linear_flow, params, (1, 2), 0.5, prunable, iterations=2)
    np.testing.assert_array_equal(mask["params"]["dense_0"]["kernel"], [[False, True], [True, False]])
    np.testing.assert_array_equal(mask["params"]["dense_1"]["kernel"], [[False], [True]])


@pytest.fixture(scope="module")
def mlp():
    """A 3-layer MLP 8 -> 64 -> 64 -> 4: kernels of 512, 4096 and 256 weights (4864 in all)."""
    network = MLP((64, 64, 4), activate_final=False)
    params = network.init(jax.random.key(0), jnp.ones((1, 8)))
    return network, params


def test_synflow_exact_count_and_no_layer_collapse_at_high_sparsity(mlp):
    network, params = mlp
    prunable = prunable_leaves(params)
    # Without the guard, so that surviving layers are SynFlow's own doing: round(0.01 * 4864) = 49.
    mask = synflow_masks(network.apply, params, (1, 8), 0.99, prunable, iterations=100, min_kept_per_layer=0)
    assert kept_count(mask) == 49
    assert all(fraction > 0 for fraction in layer_kept_fractions(mask).values())
    assert mask["params"]["dense_0"]["bias"] is None
    guarded = synflow_masks(network.apply, params, (1, 8), 0.9, prunable, iterations=10, scope="layer")
    assert [int(np.sum(kept)) for kept in jax.tree.leaves(guarded)] == [51, 410, 26]


def test_synflow_iterations_change_the_mask(mlp):
    network, params = mlp
    prunable = prunable_leaves(params)
    iterative = synflow_masks(network.apply, params, (1, 8), 0.99, prunable, iterations=10, min_kept_per_layer=0)
    one_shot = synflow_masks(network.apply, params, (1, 8), 0.99, prunable, iterations=1, min_kept_per_layer=0)
    assert kept_count(one_shot) == kept_count(iterative) == 49
    assert mask_overlap(iterative, one_shot) < 1.0


def test_synflow_never_revives_a_pruned_weight(mlp, monkeypatch):
    # Per-layer counts at 0.99 leave weights whose inputs were all pruned (zero flow, still kept):
    # they, not weights already pruned (also zero flow), must fill each layer's count.
    network, params = mlp
    steps = []

    def recording(*args, **kwargs):
        steps.append(masks_from_scores(*args, **kwargs))
        return steps[-1]

    monkeypatch.setattr(scorers, "masks_from_scores", recording)
    synflow_masks(network.apply, params, (1, 8), 0.99, prunable_leaves(params), iterations=20, scope="layer")
    assert len(steps) == 20
    for before, after in zip(steps, steps[1:]):
        for kept_before, kept_after in zip(jax.tree.leaves(before), jax.tree.leaves(after)):
            assert not np.any(np.asarray(kept_after) & ~np.asarray(kept_before))


def test_synflow_rejects_global_scope_and_zero_iterations(mlp):
    network, params = mlp
    with pytest.raises(QrlInputError, match="scope must be network or layer"):
        synflow_masks(network.apply, params, (1, 8), 0.5, prunable_leaves(params), scope="global")
    with pytest.raises(QrlInputError, match="iterations must be an integer >= 1"):
        synflow_masks(network.apply, params, (1, 8), 0.5, prunable_leaves(params), iterations=0)


def _kernels(*shapes):
    layers = {f"dense_{i}": {"kernel": jnp.ones(shape), "bias": jnp.ones(shape[-1])} for i, shape in enumerate(shapes)}
    return {"params": layers}


def test_erk_densities_hand_computed():
    # Shapes (4, 8) and (8, 2): raw densities 12/32 = 0.375 and 10/16 = 0.625. At sparsity 0.5 the
    # layers keep 24 of 48: eps = 24 / (0.375 * 32 + 0.625 * 16) = 24/22, densities 9/22 and 15/22.
    np.testing.assert_allclose(erk_densities([(4, 8), (8, 2)], 0.5), [9 / 22, 15 / 22])
    # At 0.2: eps = 38.4/22 gives the second layer 1.09 > 1, so it is dense (16 weights) and the
    # first keeps 38.4 - 16 = 22.4 of 32: density 0.7.
    np.testing.assert_allclose(erk_densities([(4, 8), (8, 2)], 0.2), [0.7, 1.0])


def test_random_erk_masks_follow_the_densities_with_an_exact_total():
    params = _kernels((4, 8), (8, 2))
    prunable = prunable_leaves(params)
    # 32 * 9/22 = 13.09 and 16 * 15/22 = 10.91: floors 13 + 10, the remaining one to the larger remainder.
    mask = random_masks(jax.random.key(0), params, 0.5, prunable, distribution="erk")
    assert [int(np.sum(kept)) for kept in jax.tree.leaves(mask)] == [13, 11]
    # 32 * 0.7 = 22.4 and the dense 16: round(0.8 * 48) = 38 in all.
    mask = random_masks(jax.random.key(0), params, 0.2, prunable, distribution="erk")
    assert [int(np.sum(kept)) for kept in jax.tree.leaves(mask)] == [22, 16]


@pytest.mark.parametrize("sparsity", [0.0, 0.5, 0.8, 0.9, 0.95, 0.98, 0.99])
def test_random_uniform_masks_exact_total_and_each_layer_within_one_weight(sparsity):
    params = _kernels((16, 32), (32, 32), (32, 4), (7, 13))
    sizes = [512, 1024, 128, 91]
    mask = random_masks(jax.random.key(1), params, sparsity, prunable_leaves(params), min_kept_per_layer=0)
    counts = [int(np.sum(kept)) for kept in jax.tree.leaves(mask)]
    assert sum(counts) == round((1 - sparsity) * sum(sizes))
    for count, size in zip(counts, sizes):
        assert abs(count - (1 - sparsity) * size) < 1.0


def test_random_masks_depend_on_the_key_only_and_the_guard_keeps_the_total():
    params = _kernels((100, 10), (3, 1))
    prunable = prunable_leaves(params)
    first = random_masks(jax.random.key(2), params, 0.5, prunable)
    assert mask_overlap(first, random_masks(jax.random.key(2), params, 0.5, prunable)) == 1.0
    assert mask_overlap(first, random_masks(jax.random.key(3), params, 0.5, prunable)) < 1.0
    # round(0.01 * 1003) = 10 kept: uniform gives 10 and 0.03 -> 10 and 0; the guard moves one.
    guarded = random_masks(jax.random.key(2), params, 0.99, prunable)
    assert [int(np.sum(kept)) for kept in jax.tree.leaves(guarded)] == [9, 1]


def test_random_masks_reject_an_unknown_distribution():
    params = _kernels((4, 8))
    with pytest.raises(QrlInputError, match="unknown random mask distribution 'normal'; known: uniform, erk"):
        random_masks(jax.random.key(0), params, 0.5, prunable_leaves(params), distribution="normal")


def test_grasp_mask_removes_the_largest_scores():
    params, batches = _tanh_problem(jnp.float32)
    scores = grasp_scores(_tanh_mse, params, batches, prunable_leaves(params))
    mask = masks_from_scores(scores, 0.5, keep="lowest", min_kept_per_layer=0)
    values = np.concatenate([np.ravel(leaf) for leaf in jax.tree.leaves(scores)])
    kept = np.concatenate([np.ravel(leaf) for leaf in jax.tree.leaves(mask)])
    assert kept.sum() == round(0.5 * values.size)
    assert values[kept].max() <= values[~kept].min()


def _two_part_network():
    """A network of two parts on different scales: the encoder's weights are 100x the decoder's."""
    rng = np.random.default_rng(0)
    return {"encoder": {"dense_0": {"kernel": jnp.asarray(100.0 * rng.uniform(0.5, 1.0, (4, 6)), jnp.float32)},
                        "head": {"kernel": jnp.asarray(100.0 * rng.uniform(0.5, 1.0, (6, 2)), jnp.float32)}},
            "decoder": {"dense_0": {"kernel": jnp.asarray(rng.uniform(0.5, 1.0, (5, 8)), jnp.float32)},
                        "head": {"kernel": jnp.asarray(rng.uniform(0.5, 1.0, (8, 3)), jnp.float32)}}}


def test_separate_thresholds_give_each_named_part_its_own_exact_count():
    params = {"vae": _two_part_network()}
    settings = PruneSettings(sparsity=0.75, min_kept_per_layer=0)
    joint = prune_networks("magnitude", params, {}, [], settings)["vae"]
    assert kept_count(joint["decoder"]) == 0  # one threshold: the small-scale part is emptied
    assert kept_count(joint) == round(0.25 * (24 + 12 + 40 + 24))
    split = prune_networks("magnitude", params, {}, [],
                           dataclasses.replace(settings, separate=("vae/encoder", "vae/decoder")))["vae"]
    assert kept_count(split["encoder"]) == round(0.25 * 36) and kept_count(split["decoder"]) == round(0.25 * 64)
    for part in ("encoder", "decoder"):  # within a part, the mask keeps the largest weights
        values = np.concatenate([np.ravel(leaf) for leaf in jax.tree.leaves(params["vae"][part])])
        kept = np.concatenate([np.ravel(leaf) for leaf in jax.tree.leaves(split[part])])
        assert values[kept].min() >= values[~kept].max()
    only_decoder = prune_networks("magnitude", params, {}, [],
                                  dataclasses.replace(settings, separate=("vae/decoder",)))["vae"]
    assert kept_count(only_decoder["decoder"]) == round(0.25 * 64)
    assert kept_count(only_decoder["encoder"]) == round(0.25 * 36)  # the rest: one threshold over it alone


@pytest.mark.parametrize("separate,pruner,scope,fragment", [
    (("vae",), "magnitude", "network", "separate takes network/module paths like vae/encoder"),
    (("critic/encoder",), "magnitude", "network", "separate path 'critic/encoder' names no network"),
    (("vae/encoderx",), "magnitude", "network", "separate path 'vae/encoderx' names no sub-network of vae"),
    (("vae/encoder", "vae/encoder/head"), "magnitude", "network", "overlap"),
    (("vae/encoder",), "magnitude", "layer", "separate thresholds apply to snip, grasp and magnitude at network"),
    (("vae/encoder",), "random", "network", "separate thresholds apply to snip, grasp and magnitude at network"),
])
def test_separate_rejects_bad_paths_and_other_pruners(separate, pruner, scope, fragment):
    settings = PruneSettings(sparsity=0.5, scope=scope, separate=separate)
    with pytest.raises(QrlInputError, match=fragment):
        prune_networks(pruner, {"vae": _two_part_network()}, {}, [], settings, key=jax.random.PRNGKey(0))
