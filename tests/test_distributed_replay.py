"""The distributed replay node: rate limiter arithmetic, blocking, ring buffer, prioritized replay."""

import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from qrl.distributed.rate_limiters import MinSize, SampleToInsertRatio, default_error_buffer
from qrl.distributed.replay import ReplayServer, SumTree
from qrl.errors import QrlInputError


def make_chunk(values) -> dict:
    """Transitions whose observation rows are `[v, -v]` for each value `v`, so rows identify items."""
    values = np.asarray(values, np.float32)
    return {
        "observation": np.stack([values, -values], axis=1),
        "action": values.astype(np.int32),
        "reward": values,
        "discount": np.ones_like(values),
        "next_observation": np.stack([values + 1, -values - 1], axis=1),
    }


def wait_until(predicate, timeout=2.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.005)


# ------------------------------------------------------------------------------ rate limiters


def test_sample_to_insert_ratio_step_by_step():
    # spi=2, min_size=3, error_buffer=2: offset 6, min_diff 4, max_diff 8; diff = 2 * inserts - samples.
    limiter = SampleToInsertRatio(2.0, 3, 2.0)
    assert (limiter.min_diff, limiter.max_diff) == (4.0, 8.0)
    # The first 3 inserts are free, the 4th makes diff 8 <= 8, the 5th would make diff 10.
    assert [limiter.can_insert(inserts, 0) for inserts in range(6)] == [True, True, True, True, False, False]
    assert limiter.insert_allowance(0, 0, 10) == 4
    assert limiter.insert_allowance(0, 0, 2) == 2
    assert limiter.insert_allowance(4, 0, 10) == 0
    # No sample before 3 inserts; at 3 inserts diff 6: up to 2 items; at 4 inserts diff 8: up to 4.
    assert not limiter.can_sample(2, 0, 1)
    assert limiter.can_sample(3, 0, 2) and not limiter.can_sample(3, 0, 3)
    assert limiter.can_sample(4, 0, 4) and not limiter.can_sample(4, 0, 5)
    # After sampling 4 items at 4 inserts, diff 4: two inserts (diff 6, 8) but no sample fit.
    assert limiter.insert_allowance(4, 4, 10) == 2
    assert not limiter.can_sample(4, 4, 1)
    assert limiter.can_sample(6, 4, 4) and not limiter.can_sample(6, 4, 5)


def test_sample_to_insert_ratio_fractional_allowance_matches_predicate():
    limiter = SampleToInsertRatio(0.3, 7, 1.1)
    for inserts in range(0, 30):
        for samples in range(0, 12):
            expected = 0
            while expected < 50 and limiter.can_insert(inserts + expected, samples):
                expected += 1
            assert limiter.insert_allowance(inserts, samples, 50) == expected


def test_min_size_limiter():
    limiter = MinSize(3)
    assert limiter.insert_allowance(1000, 0, 17) == 17 and limiter.can_insert(10**9, 0)
    assert not limiter.can_sample(2, 0, 1)
    assert limiter.can_sample(3, 10**6, 10**6)


def test_default_error_buffer_values():
    # Acme's tolerance rule dominates for large min sizes: 10000 * 1 * 0.1.
    assert default_error_buffer(1.0, 10000, 32, 1) == pytest.approx(1000.0)
    # The liveness term dominates otherwise: 256 + 1 * 2.
    assert default_error_buffer(2.0, 1000, 256, 1) == pytest.approx(258.0)
    assert default_error_buffer(0.5, 100, 64, 10, tolerance=0.2) == pytest.approx(69.0)


@pytest.mark.parametrize(
    "make",
    [
        lambda: SampleToInsertRatio(0.0, 1, 1.0),
        lambda: SampleToInsertRatio(-1.0, 1, 1.0),
        lambda: SampleToInsertRatio(float("nan"), 1, 1.0),
        lambda: SampleToInsertRatio(1.0, 0, 1.0),
        lambda: SampleToInsertRatio(1.0, 2.5, 1.0),
        lambda: SampleToInsertRatio(1.0, 1, -0.5),
        lambda: MinSize(0),
        lambda: ReplayServer(0, MinSize(1)),
        lambda: ReplayServer(4, MinSize(5)),
        lambda: ReplayServer(4, MinSize(1), prioritized=True, priority_exponent=-1.0),
        lambda: ReplayServer(4, MinSize(1), prioritized=True, importance_exponent=-0.1),
        lambda: ReplayServer(4, MinSize(1), max_times_sampled=0),
    ],
)
def test_bad_constructor_arguments_raise(make):
    with pytest.raises(QrlInputError):
        make()


def test_bad_insert_sample_and_update_arguments_raise():
    replay = ReplayServer(8, MinSize(1), prioritized=True)
    with pytest.raises(QrlInputError):
        replay.insert({})
    bad_lengths = make_chunk([1.0, 2.0])
    bad_lengths["reward"] = np.zeros(3, np.float32)
    with pytest.raises(QrlInputError):
        replay.insert(bad_lengths)
    with pytest.raises(QrlInputError):
        replay.insert(make_chunk([1.0, 2.0]), priorities=np.array([1.0, -1.0]))
    with pytest.raises(QrlInputError):
        replay.insert(make_chunk([1.0, 2.0]), priorities=np.array([1.0]))
    assert replay.insert(make_chunk([1.0, 2.0])) == 2
    missing = make_chunk([3.0])
    del missing["discount"]
    with pytest.raises(QrlInputError):
        replay.insert(missing)
    reshaped = make_chunk([3.0])
    reshaped["observation"] = np.zeros((1, 5), np.float32)
    with pytest.raises(QrlInputError):
        replay.insert(reshaped)
    with pytest.raises(QrlInputError):
        replay.sample(0, 1)
    with pytest.raises(QrlInputError):
        replay.update_priorities(np.array([0, 1]), np.array([1.0]))
    with pytest.raises(QrlInputError):
        replay.update_priorities(np.array([0]), np.array([np.inf]))
    assert replay.size() == 2


def test_modules_do_not_import_jax():
    code = "import sys, qrl.distributed.replay, qrl.distributed.rate_limiters; print('jax' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


# ------------------------------------------------------------------------------ blocking


def test_blocked_insert_wakes_when_a_sample_frees_room():
    # spi=1, min_size=1, error_buffer=1: max_diff 2, so 2 items go in, the 3rd waits for a sample.
    replay = ReplayServer(16, SampleToInsertRatio(1.0, 1, 1.0))
    results = []
    inserter = threading.Thread(target=lambda: results.append(replay.insert(make_chunk([0, 1, 2]), timeout=5.0)))
    inserter.start()
    wait_until(lambda: replay.stats()["inserted"] == 2)
    time.sleep(0.05)
    assert inserter.is_alive() and replay.size() == 2
    assert replay.sample(1, 1, timeout=1.0) is not None
    inserter.join(timeout=2.0)
    assert results == [3]
    stats = replay.stats()
    assert stats["inserted"] == 3 and stats["sampled"] == 1 and stats["insert_wait_seconds"] > 0.0


def test_insert_timeout_returns_the_inserted_prefix():
    replay = ReplayServer(16, SampleToInsertRatio(1.0, 1, 1.0))
    began = time.monotonic()
    assert replay.insert(make_chunk([0, 1, 2, 3]), timeout=0.05) == 2
    assert time.monotonic() - began >= 0.05
    assert replay.insert(make_chunk([4]), timeout=0.0) == 0


def test_sample_times_out_returning_none():
    replay = ReplayServer(8, MinSize(2))
    replay.insert(make_chunk([0]))
    began = time.monotonic()
    assert replay.sample(1, 1, timeout=0.05) is None
    assert time.monotonic() - began >= 0.05
    assert replay.stats()["sample_wait_seconds"] > 0.0 and replay.stats()["sampled"] == 0


def test_close_wakes_blocked_sampler_and_inserter():
    # error_buffer 0.5 is too small (2 * 0.5 < spi + 1): after one insert diff is 1, a second
    # insert needs diff + 1 <= 1.5 and a sample of one needs diff - 1 >= 0.5, so both sides wait.
    replay = ReplayServer(8, SampleToInsertRatio(1.0, 1, 0.5))
    outcomes = {}
    sampler = threading.Thread(target=lambda: outcomes.update(sample=replay.sample(1, 1)))
    sampler.start()
    assert replay.insert(make_chunk([0, 1, 2]), timeout=0.05) == 1
    inserter = threading.Thread(target=lambda: outcomes.update(insert=replay.insert(make_chunk([5, 6]))))
    inserter.start()
    runner = threading.Thread(target=replay.run)
    runner.start()
    time.sleep(0.05)
    assert sampler.is_alive() and inserter.is_alive() and runner.is_alive()
    replay.close()
    for thread in (sampler, inserter, runner):
        thread.join(timeout=1.0)
        assert not thread.is_alive()
    assert outcomes == {"sample": None, "insert": 0}
    assert replay.insert(make_chunk([7])) == 0 and replay.sample(1, 1) is None


def test_default_error_buffer_keeps_concurrent_inserter_and_sampler_live():
    spi, min_size, batch, num_batches, chunk = 4.0, 10, 4, 2, 3
    error_buffer = default_error_buffer(spi, min_size, batch * num_batches, chunk)
    replay = ReplayServer(64, SampleToInsertRatio(spi, min_size, error_buffer))
    inserted = []
    done = threading.Event()

    def insert_all():
        for step in range(100):
            inserted.append(replay.insert(make_chunk(np.arange(chunk) + chunk * step), timeout=2.0))
        done.set()

    inserter = threading.Thread(target=insert_all)
    inserter.start()
    samples = 0
    while not done.is_set():
        samples += replay.sample(batch, num_batches, timeout=0.05) is not None
    inserter.join()
    assert sum(inserted) == 300 and samples > 0
    stats = replay.stats()
    diff = stats["inserted"] * spi - stats["sampled"]
    assert spi * min_size - error_buffer <= diff <= spi * min_size + error_buffer


# ------------------------------------------------------------------------------ ring buffer, uniform


def test_ring_buffer_keeps_the_last_capacity_items_and_indices_are_insert_numbers():
    replay = ReplayServer(4, MinSize(1), seed=1)
    assert replay.insert(make_chunk([0, 1, 2])) == 3
    assert replay.insert(make_chunk([3, 4, 5])) == 3
    assert replay.size() == 4
    batch = replay.sample(50, 4)
    seen = batch["transitions"]["reward"]
    assert set(seen.reshape(-1).tolist()) == {2.0, 3.0, 4.0, 5.0}
    # The index of an item is its insert number: item v was the v-th inserted.
    np.testing.assert_array_equal(batch["indices"], seen.astype(np.int64))
    # One chunk longer than the ring keeps its tail.
    replay.insert(make_chunk(np.arange(6, 16)))
    seen = replay.sample(50, 4)["transitions"]["observation"][..., 0]
    assert set(seen.reshape(-1).tolist()) == {12.0, 13.0, 14.0, 15.0}
    assert replay.stats()["inserted"] == 16


def test_uniform_sample_shapes_dtypes_and_weights():
    replay = ReplayServer(10, MinSize(3))
    replay.insert(make_chunk([0, 1, 2, 3, 4]))
    batch = replay.sample(batch_size=6, num_batches=3)
    transitions = batch["transitions"]
    assert transitions["observation"].shape == (3, 6, 2) and transitions["observation"].dtype == np.float32
    assert transitions["action"].shape == (3, 6) and transitions["action"].dtype == np.int32
    assert transitions["reward"].dtype == np.float32 and transitions["discount"].shape == (3, 6)
    np.testing.assert_array_equal(transitions["next_observation"], transitions["observation"] + [1, -1])
    assert batch["indices"].dtype == np.int64 and batch["indices"].shape == (3, 6)
    assert batch["weights"].dtype == np.float32
    np.testing.assert_array_equal(batch["weights"], np.ones((3, 6), np.float32))
    assert set(batch["indices"].reshape(-1).tolist()) <= {0, 1, 2, 3, 4}
    stats = replay.stats()
    assert set(stats) == {"inserted", "sampled", "size", "insert_seconds", "sample_seconds",
                          "insert_wait_seconds", "sample_wait_seconds", "process_cpu_seconds"}
    assert (stats["inserted"], stats["sampled"], stats["size"]) == (5, 18, 5)
    assert stats["insert_seconds"] > 0.0 and stats["sample_seconds"] > 0.0


def test_uniform_update_priorities_is_a_no_op():
    replay = ReplayServer(4, MinSize(1))
    replay.insert(make_chunk([0, 1]))
    replay.update_priorities(np.array([0, 1]), np.array([5.0, 0.0]))
    assert replay.sample(2, 1)["weights"].tolist() == [[1.0, 1.0]]


# ------------------------------------------------------------------------------ sum tree, prioritized


def test_sum_tree_totals_updates_and_search_match_numpy():
    rng = np.random.default_rng(0)
    tree = SumTree(11)  # padded to 16 leaves
    values = np.zeros(11)
    for count in (4, 9, 1, 20, 3, 7):  # both the scalar (<= 4 leaves) and the vectorised path
        rows = rng.integers(0, 11, size=count)
        new = rng.random(count)
        tree.update(rows, new)
        values[rows] = new  # numpy's last-write-wins on repeated rows, as the tree documents
        assert tree.total() == pytest.approx(values.sum())
        np.testing.assert_allclose(tree.values(np.arange(11)), values)
    values[3] = 0.0
    tree.update(np.array([3]), np.array([0.0]))
    targets = rng.random((7, 9)) * values.sum()
    expected = np.searchsorted(np.cumsum(values), targets, side="right")
    np.testing.assert_array_equal(tree.find(targets), expected)
    # A target at (or past) the total never lands on a padded or zero leaf.
    assert tree.find(np.array([values.sum(), values.sum() * 1.01])).tolist() == [10, 10]


def test_sum_tree_single_leaf():
    tree = SumTree(1)
    tree.update(np.array([0]), np.array([2.5]))
    assert tree.total() == 2.5 and tree.find(np.array([0.0, 2.4])).tolist() == [0, 0]


def test_prioritized_stratified_rows_and_importance_weights_hand_computed():
    # alpha=1, beta=1, priorities [1, 1, 2]: P = [.25, .25, .5], N * P = [.75, .75, 1.5],
    # w = [4/3, 4/3, 2/3]. Four strata of mass 1 each pick items [0, 1, 2, 2] in every batch.
    replay = ReplayServer(4, MinSize(1), prioritized=True, priority_exponent=1.0, importance_exponent=1.0)
    replay.insert(make_chunk([0, 1, 2]), priorities=np.array([1.0, 1.0, 2.0]))
    batch = replay.sample(batch_size=4, num_batches=3)
    np.testing.assert_array_equal(batch["indices"], np.tile([0, 1, 2, 2], (3, 1)))
    np.testing.assert_allclose(batch["weights"], np.tile([1.0, 1.0, 0.5, 0.5], (3, 1)), rtol=1e-6)


def test_prioritized_exponents_hand_computed():
    # alpha=0.5: priorities [1, 4] -> masses [1, 2]; three strata pick [0, 1, 1].
    # beta=0.5: N * P = [2/3, 4/3] -> w = [sqrt(3/2), sqrt(3/4)], normalised [1, sqrt(1/2)].
    replay = ReplayServer(2, MinSize(1), prioritized=True, priority_exponent=0.5, importance_exponent=0.5)
    replay.insert(make_chunk([0, 1]), priorities=np.array([1.0, 4.0]))
    batch = replay.sample(batch_size=3, num_batches=2)
    np.testing.assert_array_equal(batch["indices"], [[0, 1, 1], [0, 1, 1]])
    np.testing.assert_allclose(batch["weights"], [[1.0, 0.5**0.5, 0.5**0.5]] * 2, rtol=1e-6)


def test_prioritized_frequencies_follow_priorities_to_the_alpha():
    alpha = 0.6
    priorities = np.array([1.0, 2.0, 3.0, 4.0, 8.0])
    replay = ReplayServer(8, MinSize(1), prioritized=True, priority_exponent=alpha, seed=3)
    replay.insert(make_chunk(np.arange(5)), priorities=priorities)
    rows = replay.sample(batch_size=7, num_batches=3000)["indices"]
    frequencies = np.bincount(rows.reshape(-1), minlength=5) / rows.size
    expected = priorities**alpha / np.sum(priorities**alpha)
    np.testing.assert_allclose(frequencies, expected, atol=0.005)


def test_new_items_get_the_max_priority_seen_and_updates_change_frequencies():
    replay = ReplayServer(4, MinSize(1), prioritized=True, priority_exponent=1.0, importance_exponent=0.0)
    replay.insert(make_chunk([0]), priorities=np.array([3.0]))
    replay.insert(make_chunk([1]))  # gets the max seen so far: 3
    assert replay.sample(2, 1)["indices"].tolist() == [[0, 1]]
    replay.update_priorities(np.array([0, 1]), np.array([1.0, 7.0]))  # masses [1, 7], total 8
    rows = replay.sample(batch_size=8, num_batches=2)["indices"]
    np.testing.assert_array_equal(rows, [[0, 1, 1, 1, 1, 1, 1, 1]] * 2)
    replay.insert(make_chunk([2]))  # max seen is now 7
    np.testing.assert_array_equal(replay.sample(15, 1)["indices"], [[0] + [1] * 7 + [2] * 7])
    assert replay.sample(3, 1)["weights"].tolist() == [[1.0, 1.0, 1.0]]  # beta = 0


def test_stale_priority_updates_are_ignored():
    replay = ReplayServer(2, MinSize(1), prioritized=True, priority_exponent=1.0)
    replay.insert(make_chunk([0, 1]), priorities=np.array([1.0, 1.0]))
    old = replay.sample(2, 1)["indices"]
    np.testing.assert_array_equal(old, [[0, 1]])
    replay.insert(make_chunk([2, 3]), priorities=np.array([1.0, 1.0]))  # overwrites both rows
    replay.update_priorities(old, np.array([[100.0, 0.0]]))
    batch = replay.sample(2, 1)
    np.testing.assert_array_equal(batch["indices"], [[2, 3]])  # masses still [1, 1]
    assert batch["transitions"]["reward"].tolist() == [[2.0, 3.0]]
    # Current indices (row + generation * capacity) still update: item 3 lives in row 1.
    replay.update_priorities(np.array([3]), np.array([0.0]))
    np.testing.assert_array_equal(replay.sample(4, 1)["indices"], [[2, 2, 2, 2]])


def test_all_zero_priorities_fall_back_to_uniform():
    replay = ReplayServer(4, MinSize(1), prioritized=True, seed=0)
    replay.insert(make_chunk([0, 1, 2]), priorities=np.zeros(3))
    batch = replay.sample(30, 2)
    assert set(batch["indices"].reshape(-1).tolist()) == {0, 1, 2}
    np.testing.assert_array_equal(batch["weights"], np.ones((2, 30), np.float32))


# ------------------------------------------------------------------------------ consumed items


def sampled_values(replay, batch_size, num_batches=1):
    result = replay.sample(batch_size, num_batches, timeout=0.05)
    return None if result is None else result["transitions"]["reward"].reshape(-1)


def test_each_item_is_drawn_at_most_max_times_sampled_then_removed():
    replay = ReplayServer(8, MinSize(1), max_times_sampled=3, seed=1)
    replay.insert(make_chunk([0, 1, 2, 3]))
    drawn = np.concatenate([sampled_values(replay, 4) for _ in range(3)])  # 12 draws: 4 items × 3.
    np.testing.assert_array_equal(np.sort(drawn), np.repeat([0, 1, 2, 3], 3))
    assert replay.size() == 0 and sampled_values(replay, 1) is None  # nothing left to draw: the learner waits.
    stats = replay.stats()
    assert stats["removed_sampled_out"] == 4 and stats["removed_evicted"] == 0 and stats["sampled"] == 12
    replay.insert(make_chunk([7]))  # a new item is drawable again, up to 3 times in one batch.
    np.testing.assert_array_equal(sampled_values(replay, 3), [7, 7, 7])


def test_a_full_table_evicts_its_oldest_item_and_fills_freed_rows_first():
    replay = ReplayServer(4, MinSize(1), max_times_sampled=1, seed=0)
    replay.insert(make_chunk([0, 1, 2, 3, 4, 5]))  # full at 4: items 0 and 1 are evicted, oldest first.
    assert replay.size() == 4 and replay.stats()["removed_evicted"] == 2
    (gone,) = sampled_values(replay, 1)  # drawn once: removed, its row freed.
    assert gone in (2, 3, 4, 5)
    replay.insert(make_chunk([6]))  # goes into the freed row: nothing evicted.
    assert replay.size() == 4 and replay.stats()["removed_evicted"] == 2
    replay.insert(make_chunk([7]))  # full again: the oldest item still held goes.
    held = sorted({2, 3, 4, 5, 6} - {gone} - {min({2, 3, 4, 5} - {gone})}) + [7]
    assert replay.stats()["removed_evicted"] == 3
    np.testing.assert_array_equal(np.sort(sampled_values(replay, 4)), held)


def test_min_size_counts_the_items_held_not_the_items_ever_inserted():
    replay = ReplayServer(8, MinSize(3), max_times_sampled=1, seed=0)
    replay.insert(make_chunk([0, 1, 2]))
    assert len(sampled_values(replay, 1)) == 1
    assert sampled_values(replay, 1) is None  # 2 held < min size 3, though 3 were inserted.
    replay.insert(make_chunk([3]))
    assert len(sampled_values(replay, 2)) == 2


def test_consumed_prioritized_items_follow_priorities_and_ignore_stale_indices():
    replay = ReplayServer(8, MinSize(1), prioritized=True, priority_exponent=1.0, max_times_sampled=1, seed=0)
    replay.insert(make_chunk([0, 1, 2]), priorities=np.array([1.0, 0.0, 3.0]))
    result = replay.sample(2, 1, timeout=0.05)  # item 1 has priority 0: never drawn while others remain.
    np.testing.assert_array_equal(np.sort(result["transitions"]["reward"].reshape(-1)), [0, 2])
    # Weights (N P)^-0.4 / max with N = 3 held and P the probability when drawn: both items in
    # the first round (P = 1/4, 3/4), or item 2 twice in it (the second draw refused) and item 0
    # alone in the next round (P = 1).
    drawn = result["transitions"]["reward"][0]
    candidates = []
    for p0 in (0.25, 1.0):
        probabilities = np.where(drawn == 2, 0.75, p0)
        weights = (3 * probabilities) ** -0.4
        candidates.append(weights / weights.max())
    assert any(np.allclose(result["weights"][0], candidate, rtol=1e-6) for candidate in candidates), result["weights"]
    replay.update_priorities(result["indices"], np.array([[5.0, 5.0]]))  # both drawn out: ignored.
    (last,) = sampled_values(replay, 1)  # only zero priorities left: uniform over what is held.
    assert last == 1 and replay.size() == 0
