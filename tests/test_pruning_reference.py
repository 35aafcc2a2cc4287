"""SNIP and GraSP against an independent float64 reference: a numpy MLP with hand-written
backpropagation (checked by finite differences of the loss), the Hessian-gradient product by
central differences of that gradient along the prunable weights' gradient only (biases out of the
direction, as in GraSP's reference), and the kept count per layer from a numpy ranking."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pruning import (
    PruneSettings,
    apply_mask,
    grasp_scores,
    kept_count,
    masks_from_scores,
    prunable_leaves,
    prune_networks,
    snip_scores,
    xavier_reinit,
)
from qrl.errors import QrlInputError

LAYERS = ("dense_0", "dense_1")


def _problem():
    """A 3-4-2 tanh MLP with non-zero biases and two batches of 5 regression targets (float64)."""
    rng = np.random.default_rng(7)
    params = {
        "dense_0": {"kernel": rng.normal(size=(3, 4)), "bias": 0.3 * rng.normal(size=4)},
        "dense_1": {"kernel": rng.normal(size=(4, 2)), "bias": 0.3 * rng.normal(size=2)},
    }
    batches = [(rng.normal(size=(5, 3)), rng.normal(size=(5, 2))) for _ in range(2)]
    return params, batches


def _np_loss(params, batch, temperature):
    x, y = batch
    hidden = np.tanh(x @ params["dense_0"]["kernel"] + params["dense_0"]["bias"])
    out = (hidden @ params["dense_1"]["kernel"] + params["dense_1"]["bias"]) / temperature
    return 0.5 * np.mean((out - y) ** 2)


def _np_gradient(params, batch, temperature):
    """Backpropagation by hand of `_np_loss` (mean over the B x 2 outputs)."""
    x, y = batch
    pre = x @ params["dense_0"]["kernel"] + params["dense_0"]["bias"]
    hidden = np.tanh(pre)
    out = (hidden @ params["dense_1"]["kernel"] + params["dense_1"]["bias"]) / temperature
    d_out = (out - y) / y.size / temperature
    d_hidden = d_out @ params["dense_1"]["kernel"].T
    d_pre = d_hidden * (1.0 - hidden ** 2)
    return {
        "dense_0": {"kernel": x.T @ d_pre, "bias": d_pre.sum(0)},
        "dense_1": {"kernel": hidden.T @ d_out, "bias": d_out.sum(0)},
    }


def _np_mean_gradient(params, batches, temperature):
    grads = [_np_gradient(params, batch, temperature) for batch in batches]
    return {layer: {leaf: np.mean([g[layer][leaf] for g in grads], 0) for leaf in ("kernel", "bias")}
            for layer in LAYERS}


def _shifted(params, direction, step):
    return {layer: {leaf: params[layer][leaf] + step * direction[layer][leaf] for leaf in ("kernel", "bias")}
            for layer in LAYERS}


def _reference_grasp(params, batches, temperature, include_biases_in_direction=False):
    """`-w * (H d)` on the kernels, `d` = the mean gradient on the kernels (and biases only when
    asked: the variant GraSP's reference does not compute), by central differences."""
    gradient = _np_mean_gradient(params, batches, temperature)
    direction = {layer: {"kernel": gradient[layer]["kernel"],
                         "bias": gradient[layer]["bias"] if include_biases_in_direction
                         else np.zeros_like(gradient[layer]["bias"])} for layer in LAYERS}
    epsilon = 1e-5
    plus = _np_mean_gradient(_shifted(params, direction, epsilon), batches, temperature)
    minus = _np_mean_gradient(_shifted(params, direction, -epsilon), batches, temperature)
    return {layer: -params[layer]["kernel"] * (plus[layer]["kernel"] - minus[layer]["kernel"]) / (2 * epsilon)
            for layer in LAYERS}


def _jax_loss(params, batch, temperature):
    x, y = batch
    hidden = jnp.tanh(x @ params["dense_0"]["kernel"] + params["dense_0"]["bias"])
    out = (hidden @ params["dense_1"]["kernel"] + params["dense_1"]["bias"]) / temperature
    return 0.5 * jnp.mean((out - y) ** 2)


def _kept_per_layer(scores_by_layer, sparsity, keep):
    """Kept count per layer from one numpy ranking over the concatenated kernels' scores."""
    flat = np.concatenate([scores_by_layer[layer].ravel() for layer in LAYERS])
    kept = int(round((1.0 - sparsity) * flat.size))
    order = np.argsort(flat if keep == "lowest" else -flat, kind="stable")[:kept]
    sizes = [scores_by_layer[layer].size for layer in LAYERS]
    owner = np.repeat(np.arange(len(LAYERS)), sizes)
    return [int(np.sum(owner[order] == index)) for index in range(len(LAYERS))]


def test_hand_gradient_matches_finite_differences_of_the_loss():
    params, batches = _problem()
    gradient = _np_gradient(params, batches[0], 1.0)
    epsilon = 1e-6
    for layer in LAYERS:
        for leaf in ("kernel", "bias"):
            flat = params[layer][leaf].ravel()
            for index in range(flat.size):
                unit = {name: {kind: np.zeros_like(params[name][kind]) for kind in ("kernel", "bias")}
                        for name in LAYERS}
                unit[layer][leaf].reshape(-1)[index] = 1.0
                numeric = (_np_loss(_shifted(params, unit, epsilon), batches[0], 1.0)
                           - _np_loss(_shifted(params, unit, -epsilon), batches[0], 1.0)) / (2 * epsilon)
                np.testing.assert_allclose(gradient[layer][leaf].reshape(-1)[index], numeric, rtol=1e-6, atol=1e-10)


@pytest.mark.parametrize("temperature", [1.0, 200.0])
def test_grasp_matches_the_float64_reference_and_its_kept_counts(temperature):
    params, batches = _problem()
    expected = _reference_grasp(params, batches, temperature)
    with jax.enable_x64(True):
        jax_params = jax.tree.map(jnp.asarray, params)
        jax_batches = [jax.tree.map(jnp.asarray, batch) for batch in batches]
        prunable = prunable_leaves(jax_params)
        scores = grasp_scores(_jax_loss, jax_params, jax_batches, prunable, temperature)
        for layer in LAYERS:
            np.testing.assert_allclose(scores[layer]["kernel"], expected[layer], rtol=1e-6,
                                       atol=1e-8 * np.abs(expected[layer]).max())
            assert scores[layer]["bias"] is None
        for sparsity in (0.5, 0.8):
            mask = masks_from_scores(scores, sparsity, keep="lowest", min_kept_per_layer=0)
            counts = [int(np.count_nonzero(mask[layer]["kernel"])) for layer in LAYERS]
            assert counts == _kept_per_layer(expected, sparsity, "lowest")
            assert sum(counts) == round((1 - sparsity) * 20)


def test_grasp_direction_excludes_biases_and_the_difference_matters():
    """H_ww g_w (the reference) differs from the full-parameter H g on this network; the scorer
    computes the former, so a direction with biases would fail the comparison above."""
    params, batches = _problem()
    weights_only = _reference_grasp(params, batches, 1.0)
    with_biases = _reference_grasp(params, batches, 1.0, include_biases_in_direction=True)
    for layer in LAYERS:
        relative = np.abs(with_biases[layer] - weights_only[layer]).max() / np.abs(weights_only[layer]).max()
        assert relative > 0.05


def test_snip_matches_the_float64_reference_and_its_kept_counts():
    params, batches = _problem()
    gradient = _np_mean_gradient(params, batches, 1.0)
    expected = {layer: np.abs(params[layer]["kernel"] * gradient[layer]["kernel"]) for layer in LAYERS}
    with jax.enable_x64(True):
        jax_params = jax.tree.map(jnp.asarray, params)
        jax_batches = [jax.tree.map(jnp.asarray, batch) for batch in batches]
        scores = snip_scores(_jax_loss, jax_params, jax_batches, prunable_leaves(jax_params))
        for layer in LAYERS:
            np.testing.assert_allclose(scores[layer]["kernel"], expected[layer], rtol=1e-10)
        mask = masks_from_scores(scores, 0.7, keep="highest", min_kept_per_layer=0)
        counts = [int(np.count_nonzero(mask[layer]["kernel"])) for layer in LAYERS]
        assert counts == _kept_per_layer(expected, 0.7, "highest")


def _networks():
    params, batches = _problem()
    params32 = jax.tree.map(lambda leaf: jnp.asarray(leaf, jnp.float32), params)
    batches32 = [jax.tree.map(lambda leaf: jnp.asarray(leaf, jnp.float32), batch) for batch in batches]
    return {"net": params32}, {"net": _jax_loss}, batches32


def test_xavier_reinit_redraws_kernels_at_the_glorot_scale_and_keeps_the_rest():
    params = {"wide": {"kernel": jnp.zeros((300, 200)), "bias": jnp.full(200, 0.5)},
              "stack": {"kernel": jnp.zeros((2, 100, 50)), "bias": jnp.zeros((2, 50))}}
    redrawn = xavier_reinit(jax.random.key(0), params, prunable_leaves(params))
    np.testing.assert_allclose(np.std(redrawn["wide"]["kernel"]), np.sqrt(2.0 / 500), rtol=0.03)
    np.testing.assert_allclose(np.std(redrawn["stack"]["kernel"]), np.sqrt(2.0 / 150), rtol=0.05)
    assert abs(float(np.mean(redrawn["wide"]["kernel"]))) < 0.01
    np.testing.assert_array_equal(redrawn["wide"]["bias"], params["wide"]["bias"])
    again = xavier_reinit(jax.random.key(0), params, prunable_leaves(params))
    np.testing.assert_array_equal(again["wide"]["kernel"], redrawn["wide"]["kernel"])


def test_grasp_reinit_scores_the_redrawn_copy():
    networks, losses, batches = _networks()
    key = jax.random.key(3)
    settings = PruneSettings(sparsity=0.6, reinit=True, min_kept_per_layer=0)
    masks = prune_networks("grasp", networks, losses, batches, settings, key=key)
    prunable = prunable_leaves(networks["net"])
    copy = xavier_reinit(jax.random.split(jax.random.fold_in(key, 1), 1)[0], networks["net"], prunable)
    expected = masks_from_scores(grasp_scores(_jax_loss, copy, batches, prunable), 0.6, keep="lowest",
                                 min_kept_per_layer=0)
    for layer in LAYERS:
        np.testing.assert_array_equal(masks["net"][layer]["kernel"], expected[layer]["kernel"])
    plain = prune_networks("grasp", networks, losses, batches, dataclasses.replace(settings, reinit=False))
    assert any(not np.array_equal(plain["net"][layer]["kernel"], masks["net"][layer]["kernel"]) for layer in LAYERS)


@pytest.mark.parametrize("pruner", ["snip", "grasp"])
def test_iterative_pruning_rounds_rescore_the_masked_network(pruner):
    networks, losses, batches = _networks()
    single = prune_networks(pruner, networks, losses, batches, PruneSettings(sparsity=0.75, min_kept_per_layer=0))
    one_round = prune_networks(pruner, networks, losses, batches,
                               PruneSettings(sparsity=0.75, iterations=1, min_kept_per_layer=0))
    for layer in LAYERS:
        np.testing.assert_array_equal(single["net"][layer]["kernel"], one_round["net"][layer]["kernel"])

    settings = PruneSettings(sparsity=0.75, iterations=2, min_kept_per_layer=0)
    two_rounds = prune_networks(pruner, networks, losses, batches, settings)
    assert kept_count(two_rounds["net"]) == 5
    # By hand: round 1 keeps (1 - 0.75) ** 0.5 = half (10 of 20); round 2 re-scores the masked
    # network and keeps the best 5 of those 10.
    keep = "lowest" if pruner == "grasp" else "highest"
    score = grasp_scores if pruner == "grasp" else snip_scores
    prunable = prunable_leaves(networks["net"])
    first = masks_from_scores(score(_jax_loss, networks["net"], batches, prunable), 0.5, keep=keep,
                              min_kept_per_layer=0)
    assert kept_count(first) == 10
    rescored = score(_jax_loss, apply_mask(networks["net"], first), batches, prunable)
    candidates = [(float(rescored[layer]["kernel"].ravel()[i]), layer, i) for layer in LAYERS
                  for i in range(rescored[layer]["kernel"].size) if bool(first[layer]["kernel"].ravel()[i])]
    candidates.sort(key=lambda item: item[0], reverse=keep == "highest")
    chosen = {(layer, i) for _, layer, i in candidates[:5]}
    for layer in LAYERS:
        flat = np.asarray(two_rounds["net"][layer]["kernel"]).ravel()
        assert {(layer, i) for i in np.flatnonzero(flat)} == {item for item in chosen if item[0] == layer}


@pytest.mark.parametrize("changes, pruner, fragment", [
    ({"temperature": 200.0}, "snip", "temperature is a grasp option"),
    ({"temperature": 0.0}, "grasp", "temperature must be > 0"),
    ({"reinit": True}, "snip", "reinit is a grasp option"),
    ({"iterations": 0}, "snip", "iterations must be an integer >= 1"),
    ({"iterations": 3}, "random", "iterations (rounds of re-scoring) apply to snip and grasp"),
    ({"iterations": 3}, "synflow", "use synflow_iterations"),
])
def test_pruner_options_reject_what_the_pruner_does_not_take(changes, pruner, fragment):
    with pytest.raises(QrlInputError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        PruneSettings(**changes).check(pruner)
