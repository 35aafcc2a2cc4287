"""Sparse storage of pruned policies: exact round trips, hand-counted bytes, equal outputs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pruning import sparse
from pruning.masks import apply_mask, masks_from_scores
from pruning.scorers import magnitude_scores, prunable_leaves
from qrl.errors import QrlInputError
from qrl.networks.torsos import MLP
from qrl.quant import ptq
from qrl.quant.precision import parse_precision


def tiny():
    """One 4x3 kernel keeping 3 weights (rows 0, 0, 3), and its bias."""
    kernel = np.arange(1, 13, dtype=np.float32).reshape(4, 3) / 10
    kept = np.zeros((4, 3), bool)
    kept[0, 0] = kept[0, 2] = kept[3, 1] = True
    return {"dense": {"kernel": kernel, "bias": np.ones(3, np.float32)}}, {"dense": {"kernel": kept, "bias": None}}


def test_bytes_are_counted_by_hand():
    params, mask = tiny()
    shape_bytes = 2 * 8  # the kernel's shape, int64
    bias = 3 * 4
    # bitmask: 12 flags -> 2 bytes; 3 float32 values
    assert sparse.storage_bytes(sparse.export_sparse(params, mask, "bitmask")) == 2 + 12 + shape_bytes + bias
    # csr: 5 row pointers (uint8) + 3 column indices (uint8) + 3 float32 values
    assert sparse.storage_bytes(sparse.export_sparse(params, mask, "csr")) == 5 + 3 + 12 + shape_bytes + bias
    # bcoo: int32 coordinates [3, 2] + 3 float32 values
    assert sparse.storage_bytes(sparse.export_sparse(params, mask, "bcoo")) == 24 + 12 + shape_bytes + bias
    # int8 csr: 3 int8 values + a float32 scale per output channel (3)
    int8 = sparse.export_sparse(params, mask, "csr", precision="int8")
    assert sparse.storage_bytes(int8) == 5 + 3 + 3 + 12 + shape_bytes + bias
    assert sparse.dense_fp32_bytes(params) == 15 * 4
    assert sparse.pytorch_coo_bytes(params, mask) == 3 * 20 + bias


def test_csr_layout_and_smallest_index_types():
    params, mask = tiny()
    entry = sparse.export_sparse(params, mask, "csr")["sparse"]["dense/kernel"]
    np.testing.assert_array_equal(entry["row_pointers"], [0, 2, 2, 2, 3])
    np.testing.assert_array_equal(entry["column_indices"], [0, 2, 1])
    np.testing.assert_allclose(entry["values"], [0.1, 0.3, 1.1])
    assert sparse.index_dtype(255) == np.uint8 and sparse.index_dtype(256) == np.uint16
    assert sparse.index_dtype(70_000) == np.uint32 and sparse.index_dtype(2**33) == np.uint64
    wide = {"layer": {"kernel": np.ones((2, 300), np.float32)}}
    wide_mask = {"layer": {"kernel": np.ones((2, 300), bool)}}
    entry = sparse.export_sparse(wide, wide_mask, "csr")["sparse"]["layer/kernel"]
    assert entry["column_indices"].dtype == np.uint16 and entry["row_pointers"].dtype == np.uint16


def mlp_policy(sparsity=0.95):
    network = MLP((256, 256, 3), activate_final=False)
    params = network.init(jax.random.PRNGKey(0), jnp.zeros((1, 11)))["params"]
    mask = masks_from_scores(magnitude_scores(params, prunable_leaves(params)), sparsity)
    return network, params, mask


@pytest.mark.parametrize("kind", sparse.FORMATS)
def test_round_trips_are_exact_and_outputs_equal_the_dense_paths(kind):
    network, params, mask = mlp_policy()
    observations = np.random.default_rng(0).normal(size=(64, 11)).astype(np.float32)
    masked = apply_mask(params, mask)
    blob = sparse.from_bytes(sparse.to_bytes(sparse.export_sparse(params, mask, kind)))
    restored = sparse.densify(blob)
    for expected, actual in zip(jax.tree.leaves(masked), jax.tree.leaves(restored)):
        np.testing.assert_array_equal(np.asarray(expected), actual)
    np.testing.assert_array_equal(network.apply({"params": restored}, observations),
                                  network.apply({"params": masked}, observations))

    ranges = ptq.calibrate(network.apply, masked, observations)
    int8 = parse_precision("int8")
    dense_int8 = ptq.quantize_params(masked, int8, ranges)
    blob = sparse.from_bytes(sparse.to_bytes(sparse.export_sparse(params, mask, kind, "int8", ranges)))
    restored = sparse.densify(blob)
    assert jax.tree.structure(restored) == jax.tree.structure(dense_int8)
    for expected, actual in zip(jax.tree.leaves(dense_int8), jax.tree.leaves(restored)):
        assert np.asarray(expected).dtype == actual.dtype
        np.testing.assert_array_equal(np.asarray(expected), actual)
    assert blob["scheme"] == "int8"
    int8_network = MLP((256, 256, 3), precision=parse_precision(blob["scheme"]), activate_final=False)
    np.testing.assert_array_equal(int8_network.apply({"params": restored}, observations),
                                  int8_network.apply({"params": dense_int8}, observations))


def test_an_int8_blob_without_ranges_names_the_dynamic_scheme_its_params_need():
    network, params, mask = mlp_policy()
    observations = np.random.default_rng(1).normal(size=(8, 11)).astype(np.float32)
    blob = sparse.from_bytes(sparse.to_bytes(sparse.export_sparse(params, mask, "csr", "int8")))
    assert blob["scheme"] == "int8-obst-dyn"
    precision = parse_precision(blob["scheme"])
    int8_network = MLP((256, 256, 3), precision=precision, activate_final=False)
    expected = int8_network.apply({"params": ptq.quantize_params(apply_mask(params, mask), precision)}, observations)
    np.testing.assert_array_equal(int8_network.apply({"params": sparse.densify(blob)}, observations), expected)


def test_a_95_percent_sparse_int8_policy_takes_under_a_twentieth_of_dense_fp32():
    network, params, mask = mlp_policy(0.95)
    rows = {(row["format"], row["precision"]): row for row in sparse.memory_table(params, mask)}
    best_int8 = min(rows[(kind, "int8")]["vs_dense_fp32"] for kind in sparse.FORMATS)
    assert best_int8 <= 1 / 20
    assert rows[("pytorch_coo", "fp32")]["vs_dense_fp32"] > 0.2  # the paper's ~4x, no better
    assert rows[("bitmask", "int8")]["bytes"] < rows[("bitmask", "fp32")]["bytes"] < rows[("bcoo", "fp32")]["bytes"]


def test_bad_input_is_one_line():
    params, mask = tiny()
    with pytest.raises(QrlInputError, match="unknown sparse format 'coo'"):
        sparse.export_sparse(params, mask, "coo")
    with pytest.raises(QrlInputError, match="precision must be one of"):
        sparse.export_sparse(params, mask, "csr", precision="int4")
    wrong = {"dense": {"kernel": np.ones((3, 3), bool), "bias": None}}
    with pytest.raises(QrlInputError, match="mask"):
        sparse.export_sparse(params, wrong, "csr")
    for data in (b"not msgpack at all", sparse.to_bytes(sparse.export_sparse(params, mask))[:-7]):
        with pytest.raises(QrlInputError, match="corrupt sparse policy") as error:
            sparse.from_bytes(data)
        assert "\n" not in str(error.value)
