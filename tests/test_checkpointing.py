"""Checkpointer round-trips flax/optax train states and turns every bad checkpoint into one line."""

import glob
import logging
import os
import subprocess
import sys
import textwrap
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import struct

from qrl.checkpointing import Checkpointer
from qrl.errors import QrlInputError

REPOSITORY_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@struct.dataclass
class _Networks:
    online: Any
    target: Any


@struct.dataclass
class _TrainState:
    params: _Networks
    opt_state: Any
    step: int
    rng_state: np.ndarray


def _make_state(seed: int, hidden: int = 8) -> _TrainState:
    """A small DQN-like state: flax params (online and target), adam state, an int step."""
    model = nn.Sequential([nn.Dense(hidden), nn.relu, nn.Dense(2)])
    params = model.init(jax.random.PRNGKey(seed), jnp.zeros((1, 3)))
    return _TrainState(
        params=_Networks(online=params, target=jax.tree_util.tree_map(jnp.copy, params)),
        opt_state=optax.adam(1e-3).init(params),
        step=seed * 100,
        rng_state=np.arange(4, dtype=np.uint32) + seed,
    )


def _assert_same_state(actual: _TrainState, expected: _TrainState) -> None:
    assert type(actual) is type(expected)
    assert jax.tree_util.tree_structure(actual) == jax.tree_util.tree_structure(expected)
    for actual_leaf, expected_leaf in zip(
        jax.tree_util.tree_leaves(actual), jax.tree_util.tree_leaves(expected)
    ):
        assert type(actual_leaf) is type(expected_leaf)
        assert np.asarray(actual_leaf).dtype == np.asarray(expected_leaf).dtype
        np.testing.assert_array_equal(np.asarray(actual_leaf), np.asarray(expected_leaf))


def _save_one(directory, step=1, **state_kwargs):
    with Checkpointer(directory) as checkpointer:
        checkpointer.save(step, _make_state(seed=1, **state_kwargs), extra={"config": {"a": 1}})


def test_round_trip_restores_structure_values_and_types(tmp_path):
    saved = _make_state(seed=1)
    checkpointer = Checkpointer(tmp_path / "ckpt")
    checkpointer.save(7, saved, extra={"config": {"lr": np.float32(0.5), "layers": (8, 2)}})

    restored = checkpointer.restore(_make_state(seed=2))

    _assert_same_state(restored, saved)
    assert isinstance(restored.step, int) and restored.step == 100
    assert isinstance(restored.rng_state, np.ndarray)
    assert isinstance(restored.opt_state[0], optax.ScaleByAdamState)
    assert checkpointer.restore_extra() == {"config": {"layers": [8, 2], "lr": 0.5}}
    checkpointer.close()


def test_restore_into_abstract_target_follows_its_dtypes(tmp_path):
    saved = _make_state(seed=1)
    checkpointer = Checkpointer(tmp_path)
    checkpointer.save(1, saved)
    abstract = jax.tree_util.tree_map(
        lambda leaf: jax.ShapeDtypeStruct(leaf.shape, jnp.bfloat16)
        if isinstance(leaf, jax.Array) and leaf.dtype == jnp.float32
        else leaf,
        _make_state(seed=2),
    )

    restored = checkpointer.restore(abstract)

    kernel = restored.params.online["params"]["layers_0"]["kernel"]
    assert kernel.dtype == jnp.bfloat16
    np.testing.assert_allclose(
        np.asarray(kernel, np.float32),
        np.asarray(saved.params.online["params"]["layers_0"]["kernel"]),
        rtol=1e-2,
    )
    assert restored.step == 100


def test_restores_latest_by_default_and_any_kept_step_on_request(tmp_path):
    checkpointer = Checkpointer(tmp_path)
    for seed in (1, 2, 3):
        checkpointer.save(seed * 10, _make_state(seed), extra={"seed": seed})

    assert checkpointer.latest_step() == 30
    assert checkpointer.restore(_make_state(0)).step == 300
    assert checkpointer.restore(_make_state(0), step=20).step == 200
    assert checkpointer.restore_extra(step=10) == {"seed": 1}


def test_max_to_keep_deletes_oldest_steps_on_disk(tmp_path):
    checkpointer = Checkpointer(tmp_path, max_to_keep=2)
    for step in range(1, 6):
        checkpointer.save(step, _make_state(seed=step))

    assert checkpointer.all_steps() == [4, 5]
    assert sorted(os.listdir(tmp_path)) == ["4", "5"]
    assert Checkpointer(tmp_path).all_steps() == [4, 5]


def test_saving_an_existing_or_older_step_is_not_skipped(tmp_path):
    checkpointer = Checkpointer(tmp_path)
    checkpointer.save(5, _make_state(seed=1))
    checkpointer.save(5, _make_state(seed=2), extra={"again": True})
    checkpointer.save(3, _make_state(seed=3))

    assert checkpointer.all_steps() == [3, 5]
    assert checkpointer.restore(_make_state(0), step=5).step == 200
    assert checkpointer.restore_extra(step=5) == {"again": True}
    assert checkpointer.restore_extra(step=3) is None


def test_missing_or_empty_directory_has_no_checkpoint(tmp_path):
    missing = Checkpointer(tmp_path / "absent")
    assert missing.latest_step() is None
    assert not os.path.exists(tmp_path / "absent")
    with pytest.raises(QrlInputError, match="^no checkpoint in .*absent$"):
        missing.restore(_make_state(0))

    (tmp_path / "empty").mkdir()
    with pytest.raises(QrlInputError, match="^no checkpoint in .*empty$"):
        Checkpointer(tmp_path / "empty").restore_extra()


def test_unknown_step_lists_the_steps_there(tmp_path):
    _save_one(tmp_path, step=4)

    expected = r"no checkpoint for step 9 in .* \(steps there: \[4\]\)"
    with pytest.raises(QrlInputError, match=expected):
        Checkpointer(tmp_path).restore(_make_state(0), step=9)


def _truncate(path):
    with open(path, "r+b") as file:
        file.truncate(os.path.getsize(path) // 2)


def _overwrite_with_garbage(path):
    with open(path, "wb") as file:
        file.write(b"\x00garbage\xff" * 4)


@pytest.mark.parametrize(
    "pattern, corrupt",
    [
        ("state/_METADATA", _overwrite_with_garbage),
        ("state/_METADATA", os.remove),
        ("state/manifest.ocdbt", _truncate),
        ("state/d/*", _truncate),
        ("state/d/*", os.remove),
    ],
    ids=["garbage-tree-metadata", "no-tree-metadata", "truncated-manifest", "truncated-data",
         "deleted-data"],
)
def test_corrupt_state_files_are_one_line_input_errors(tmp_path, pattern, corrupt):
    _save_one(tmp_path, hidden=64)
    paths = glob.glob(str(tmp_path / "1" / pattern))
    assert paths, f"orbax no longer writes {pattern}"
    for path in paths:
        corrupt(path)

    with pytest.raises(QrlInputError, match=f"^corrupt checkpoint in {tmp_path}/1: ") as error:
        Checkpointer(tmp_path).restore(_make_state(0, hidden=64))
    assert "\n" not in str(error.value)


def test_corrupt_extra_is_input_error_and_state_still_restores(tmp_path):
    _save_one(tmp_path)
    _overwrite_with_garbage(tmp_path / "1" / "extra" / "metadata")
    checkpointer = Checkpointer(tmp_path)

    with pytest.raises(QrlInputError, match="^corrupt checkpoint in .*/1: "):
        checkpointer.restore_extra()
    assert checkpointer.restore(_make_state(0)).step == 100


def test_mismatched_shapes_are_named(tmp_path):
    _save_one(tmp_path, hidden=8)

    with pytest.raises(QrlInputError) as error:
        Checkpointer(tmp_path).restore(_make_state(0, hidden=16))

    message = str(error.value)
    assert message.startswith(f"checkpoint in {tmp_path}/1 does not match the target state: ")
    assert "params.online.params.layers_0.kernel is (3, 8) on disk, (3, 16) in target" in message
    assert "and 9 more" in message and "\n" not in message


def test_mismatched_structure_names_missing_and_unexpected_leaves(tmp_path):
    _save_one(tmp_path)
    target = _make_state(0)
    target = target.replace(params=target.params.replace(target={"other": jnp.zeros(3)}))

    with pytest.raises(QrlInputError, match="does not match the target state") as error:
        Checkpointer(tmp_path).restore(target)

    message = str(error.value)
    assert "missing params.target.other" in message
    assert "unexpected params.target.params.layers_0.bias" in message


def test_save_and_failed_restore_keep_stderr_clean_and_exit_promptly(tmp_path):
    script = textwrap.dedent(
        f"""
        import glob, os
        import jax.numpy as jnp
        from qrl.checkpointing import Checkpointer
        from qrl.errors import QrlInputError

        state = {{"w": jnp.ones((64, 64)), "b": jnp.zeros(64), "step": 3}}
        checkpointer = Checkpointer({str(tmp_path)!r})
        checkpointer.save(1, state, extra={{"name": "x"}})
        for path in glob.glob({str(tmp_path / "1" / "state" / "d" / "*")!r}):
            os.remove(path)
        os.remove({str(tmp_path / "1" / "_CHECKPOINT_METADATA")!r})
        try:
            Checkpointer({str(tmp_path)!r}).restore(state)
        except QrlInputError as error:
            print("input error")
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPOSITORY_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )

    assert result.returncode == 0, result.stderr
    assert result.stdout == "input error\n"
    assert result.stderr == "", result.stderr


def _save_three(directory):
    checkpointer = Checkpointer(directory)
    for seed in (1, 2, 3):
        checkpointer.save(seed, _make_state(seed, hidden=64))
    checkpointer.close()


def _garble_arrays(directory, step):
    paths = glob.glob(str(directory / str(step) / "state" / "d" / "*"))
    assert paths, "orbax no longer writes state/d/*"
    for path in paths:
        _overwrite_with_garbage(path)


def test_restore_falls_back_to_the_newest_intact_checkpoint(tmp_path, capsys):
    _save_three(tmp_path)
    _garble_arrays(tmp_path, 3)

    step, state = Checkpointer(tmp_path).restore_newest_intact(_make_state(0, hidden=64))

    assert step == 2
    _assert_same_state(state, _make_state(2, hidden=64))
    warnings = capsys.readouterr().err.strip().splitlines()
    assert len(warnings) == 1
    assert warnings[0].startswith(f"warning: checkpoint 3 in {tmp_path} is corrupt (")
    assert warnings[0].endswith("; restored step 2")
    _assert_same_state(Checkpointer(tmp_path).restore(_make_state(0, hidden=64)), _make_state(2, hidden=64))


def test_explicit_corrupt_step_still_raises(tmp_path):
    _save_three(tmp_path)
    _garble_arrays(tmp_path, 3)

    with pytest.raises(QrlInputError, match=f"^corrupt checkpoint in {tmp_path}/3: "):
        Checkpointer(tmp_path).restore(_make_state(0, hidden=64), step=3)


def test_every_checkpoint_corrupt_is_one_line_input_error(tmp_path):
    _save_three(tmp_path)
    for step in (1, 2, 3):
        _garble_arrays(tmp_path, step)

    with pytest.raises(QrlInputError, match=r"^every checkpoint in .* is corrupt \(steps \[1, 2, 3\]\)") as error:
        Checkpointer(tmp_path).restore(_make_state(0, hidden=64))
    assert "\n" not in str(error.value)


def test_mismatched_newest_checkpoint_is_not_skipped(tmp_path):
    _save_three(tmp_path)
    Checkpointer(tmp_path).save(4, _make_state(4, hidden=16))

    with pytest.raises(QrlInputError, match="does not match the target state"):
        Checkpointer(tmp_path).restore(_make_state(0, hidden=64))


def test_orphaned_orbax_read_errors_are_dropped_from_asyncio_logs_and_others_kept():
    """asyncio reports an abandoned read's error as '<class> exception was never retrieved' when
    it is collected, for a Task, a Future or (timing-dependent) the _GatheringFuture over them."""
    from qrl.checkpointing import _DropOrphanedOrbaxTaskErrors

    def record(message, error=None):
        exc_info = (type(error), error, None) if error is not None else None
        return logging.LogRecord("asyncio", logging.ERROR, __file__, 1, message, (), exc_info)

    read_error = ValueError('NOT_FOUND: Error opening "zarr" driver: Error reading "step/.zarray" in OCDBT database')
    log_filter = _DropOrphanedOrbaxTaskErrors()
    for kind in ("Task", "Future", "_GatheringFuture"):
        orphaned = record(f"{kind} exception was never retrieved\nfuture: <{kind} finished exception={read_error!r}>")
        assert not log_filter.filter(orphaned), kind
    assert not log_filter.filter(record("_GatheringFuture exception was never retrieved", read_error))
    assert log_filter.filter(record("Task exception was never retrieved\nfuture: <Task exception=KeyError('x')>"))
    assert log_filter.filter(record("unrelated asyncio error mentioning zarr"))
