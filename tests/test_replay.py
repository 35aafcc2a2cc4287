"""n-step accumulation and the uniform ring buffer."""

import numpy as np
import pytest

from qrl.replay import NStepAccumulator, Transition, UniformReplay


def test_one_step_transitions_pass_through_with_gamma():
    accumulator = NStepAccumulator(1, gamma=0.9)
    (transition,) = accumulator.add(np.array([0.0]), 1, 2.0, 1.0, np.array([1.0]), False)
    assert transition.reward == 2.0 and transition.discount == pytest.approx(0.9)
    (terminal,) = accumulator.add(np.array([1.0]), 0, 1.0, 0.0, np.array([2.0]), True)
    assert terminal.discount == 0.0


def test_three_step_returns_and_episode_tail_hand_computed():
    accumulator = NStepAccumulator(3, gamma=0.5)
    observations = [np.array([float(i)]) for i in range(5)]
    assert accumulator.add(observations[0], 0, 1.0, 1.0, observations[1], False) == []
    assert accumulator.add(observations[1], 1, 2.0, 1.0, observations[2], False) == []
    (first,) = accumulator.add(observations[2], 0, 4.0, 1.0, observations[3], False)
    # 1 + 0.5 * 2 + 0.25 * 4 = 3; bootstrap 0.5^3 from observation 3.
    assert first.reward == pytest.approx(3.0) and first.discount == pytest.approx(0.125)
    assert first.observation[0] == 0.0 and first.next_observation[0] == 3.0
    # The episode terminates at the next step: every pending transition is emitted, discount 0.
    tail = accumulator.add(observations[3], 1, 8.0, 0.0, observations[4], True)
    assert [t.observation[0] for t in tail] == [1.0, 2.0, 3.0]
    assert [t.reward for t in tail] == pytest.approx([2.0 + 0.5 * 4.0 + 0.25 * 8.0, 4.0 + 0.5 * 8.0, 8.0])
    assert [t.discount for t in tail] == [0.0, 0.0, 0.0]


def test_truncation_keeps_bootstrapping():
    accumulator = NStepAccumulator(2, gamma=0.5)
    accumulator.add(np.zeros(1), 0, 1.0, 1.0, np.ones(1), False)
    tail = accumulator.add(np.ones(1), 0, 1.0, 1.0, np.full(1, 2.0), True)  # truncated: discount 1
    assert [t.discount for t in tail] == pytest.approx([0.25, 0.5])


def test_uniform_replay_wraps_and_samples_fused_batches():
    replay = UniformReplay(capacity=4, seed=0)
    for i in range(6):
        replay.add(Transition(np.full(3, i, np.uint8), np.int32(i % 2), np.float32(i), np.float32(1.0), np.full(3, i + 1, np.uint8)))
    assert len(replay) == 4
    batch = replay.sample(batch_size=8, num_batches=5)
    assert batch.observation.shape == (5, 8, 3) and batch.observation.dtype == np.uint8
    assert set(np.unique(batch.reward)) <= {2.0, 3.0, 4.0, 5.0}  # 0 and 1 were overwritten
    np.testing.assert_array_equal(batch.next_observation, batch.observation + 1)
    with pytest.raises(ValueError):
        UniformReplay(capacity=2).sample(1)
