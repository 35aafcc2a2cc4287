"""Orbax checkpoints of a train-state pytree, with JSON metadata (e.g. the config) beside it.

Saves are synchronous: when `save` returns, the step directory is committed on disk. Problems
a user can cause (missing directory, corrupt files, a checkpoint of another model) raise
`QrlInputError` with one line instead of orbax's or tensorstore's multi-line errors.
"""

import contextlib
import logging
import os
import sys
import traceback
from typing import Any, Dict, Iterator, List, Optional, Tuple

import numpy as np
import orbax.checkpoint as ocp

from qrl import io as qrl_io
from qrl.errors import QrlInputError

_STATE_ITEM = "state"
_EXTRA_ITEM = "extra"
_MAX_PATHS_IN_MESSAGE = 3
_ORBAX_PACKAGE_DIR = os.path.dirname(ocp.__file__)


class Checkpointer:
    """Saves and restores train states under `directory`, keeping the `max_to_keep` latest saves.

    Each step is one orbax step directory holding the state pytree (flax.struct dataclasses,
    optax states, jax/numpy arrays, python scalars) and optional JSON `extra`. Restoring needs
    a target pytree of the same structure (concrete or `jax.ShapeDtypeStruct` leaves); leaves
    come back with the target's dtypes.
    """

    def __init__(self, directory: qrl_io.PathLike, max_to_keep: int = 3):
        if max_to_keep < 1:
            raise QrlInputError(f"max_to_keep must be at least 1, got {max_to_keep}")
        self.directory = os.path.abspath(os.fspath(directory))
        self.max_to_keep = max_to_keep
        self._manager: Optional[ocp.CheckpointManager] = None

    def save(self, step: int, state: Any, extra: Optional[Dict[str, Any]] = None) -> None:
        """Writes `state` (and JSON-able `extra`) as checkpoint `step`, replacing one already there.

        The earliest saves beyond `max_to_keep` are deleted (orbax counts saves in the order
        they were made, so re-saving an old step keeps it and drops the earliest other one).
        """
        step = int(step)
        items = {_STATE_ITEM: ocp.args.StandardSave(state)}
        if extra is not None:
            items[_EXTRA_ITEM] = ocp.args.JsonSave(qrl_io.to_json_compatible(extra))
        with _orbax_quietly():
            manager = self._open_manager(create=True)
            if step in manager.all_steps():
                manager.delete(step)
            # force=True: orbax otherwise silently skips any step not above the latest one.
            manager.save(step, args=ocp.args.Composite(**items), force=True)
            manager.wait_until_finished()

    def all_steps(self) -> List[int]:
        """Steps with a complete checkpoint, ascending; [] when there is none."""
        with _orbax_quietly():
            manager = self._open_manager(create=False)
            return sorted(manager.all_steps()) if manager is not None else []

    def latest_step(self) -> Optional[int]:
        """The newest complete checkpoint's step, or None when there is none."""
        steps = self.all_steps()
        return steps[-1] if steps else None

    def restore(self, target_state: Any, step: Optional[int] = None) -> Any:
        """Returns the state saved at `step`, shaped like `target_state`.

        With `step` None, the newest intact checkpoint (see `restore_newest_intact`); an explicit
        `step` that is corrupt raises `QrlInputError`.
        """
        if step is None:
            return self.restore_newest_intact(target_state)[1]
        with _orbax_quietly():
            manager, step = self._find_step(step)
            return self._restore_step(manager, step, target_state)

    def restore_newest_intact(self, target_state: Any) -> Tuple[int, Any]:
        """Returns `(step, state)` of the newest checkpoint that restores.

        A corrupt newer checkpoint (garbled, truncated or missing files) is skipped with one
        warning line on stderr naming it and the step restored instead; `QrlInputError` when none
        is intact. A checkpoint of another model (mismatched shapes) raises at once: older steps
        of the same run would not match either.
        """
        with _orbax_quietly():
            manager, newest = self._find_step(None)
            steps = sorted(manager.all_steps(), reverse=True)
            skipped: List[Tuple[int, _CorruptCheckpoint]] = []
            for step in steps:
                try:
                    state = self._restore_step(manager, step, target_state)
                except _CorruptCheckpoint as error:
                    skipped.append((step, error))
                    continue
                for corrupt_step, error in skipped:
                    print(
                        f"warning: checkpoint {corrupt_step} in {self.directory} is corrupt "
                        f"({error.cause}); restored step {step}",
                        file=sys.stderr, flush=True,
                    )
                return step, state
        first_step, first_error = skipped[0]
        if len(skipped) == 1:
            raise QrlInputError(str(first_error))
        raise QrlInputError(
            f"every checkpoint in {self.directory} is corrupt (steps {sorted(steps)}); "
            f"newest, step {first_step}: {first_error.cause}"
        )

    def _restore_step(self, manager: ocp.CheckpointManager, step: int, target_state: Any) -> Any:
        args = ocp.args.Composite(**{_STATE_ITEM: ocp.args.StandardRestore(target_state)})
        self._check_matches(manager, step, target_state)
        try:
            return manager.restore(step, args=args)[_STATE_ITEM]
        except Exception as error:
            raise self._corrupt_error(step, error) from error

    def restore_extra(self, step: Optional[int] = None) -> Optional[Dict[str, Any]]:
        """Returns the JSON metadata saved with `step` (default: latest), or None if it had none."""
        args = ocp.args.Composite(**{_EXTRA_ITEM: ocp.args.JsonRestore()})
        with _orbax_quietly():
            manager, step = self._find_step(step)
            if not os.path.isdir(os.path.join(self._step_directory(step), _EXTRA_ITEM)):
                return None
            try:
                return manager.restore(step, args=args)[_EXTRA_ITEM]
            except Exception as error:
                raise self._corrupt_error(step, error) from error

    def close(self) -> None:
        """Waits for pending work and releases orbax's resources; safe to call twice."""
        if self._manager is not None:
            with _orbax_quietly():
                self._manager.close()
            self._manager = None

    def __enter__(self) -> "Checkpointer":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def _open_manager(self, create: bool) -> Optional[ocp.CheckpointManager]:
        """Returns the orbax manager; None when the directory is missing and `create` is False."""
        if self._manager is not None:
            return self._manager
        if not os.path.isdir(self.directory):
            if not create:
                return None
            try:
                os.makedirs(self.directory, exist_ok=True)
            except OSError as error:
                raise QrlInputError(
                    f"cannot create checkpoint directory {self.directory}: {error.strerror}"
                ) from error
        options = ocp.CheckpointManagerOptions(
            preservation_policy=ocp.checkpoint_managers.LatestN(n=self.max_to_keep),
            enable_async_checkpointing=False,
            create=False,
        )
        try:
            self._manager = ocp.CheckpointManager(
                self.directory,
                options=options,
                item_handlers={
                    _STATE_ITEM: ocp.StandardCheckpointHandler(),
                    _EXTRA_ITEM: ocp.JsonCheckpointHandler(),
                },
            )
        except Exception as error:
            raise QrlInputError(
                f"cannot read checkpoints in {self.directory}: {_one_line(error)}"
            ) from error
        return self._manager

    def _find_step(self, step: Optional[int]) -> Tuple[ocp.CheckpointManager, int]:
        """Returns the manager and the step to read, raising `QrlInputError` when it is absent."""
        manager = self._open_manager(create=False)
        steps = sorted(manager.all_steps()) if manager is not None else []
        if not steps:
            raise QrlInputError(f"no checkpoint in {self.directory}")
        if step is None:
            return manager, steps[-1]
        if int(step) not in steps:
            raise QrlInputError(
                f"no checkpoint for step {int(step)} in {self.directory} (steps there: {steps})"
            )
        return manager, int(step)

    def _check_matches(self, manager: ocp.CheckpointManager, step: int, target: Any) -> None:
        """Compares leaf paths and shapes on disk with `target`, before orbax reads any array."""
        try:
            metadata = manager.item_metadata(step)[_STATE_ITEM]
        except Exception as error:
            raise self._corrupt_error(step, error) from error
        if metadata is None:
            raise self._corrupt_error(step, "no state metadata")
        stored_shapes = {
            path: tuple(leaf.shape)
            for path, leaf in ocp.tree.to_flat_dict(metadata.tree, sep=".").items()
            if leaf is not None
        }
        target_shapes = {
            path: _shape_of(leaf) for path, leaf in ocp.tree.to_flat_dict(target, sep=".").items()
        }
        problems = []
        missing = [path for path in target_shapes if path not in stored_shapes]
        unexpected = [path for path in stored_shapes if path not in target_shapes]
        if missing:
            problems.append(f"missing {_abbreviate(missing)}")
        if unexpected:
            problems.append(f"unexpected {_abbreviate(unexpected)}")
        shape_mismatches = [
            f"{path} is {stored_shapes[path]} on disk, {target_shape} in target"
            for path, target_shape in target_shapes.items()
            if path in stored_shapes and stored_shapes[path] != target_shape
        ]
        if shape_mismatches:
            problems.append("shape of " + _abbreviate(shape_mismatches))
        if problems:
            raise QrlInputError(
                f"checkpoint in {self._step_directory(step)} does not match the target state: "
                + "; ".join(problems)
            )

    def _step_directory(self, step: int) -> str:
        return os.path.join(self.directory, str(step))

    def _corrupt_error(self, step: int, cause: Any) -> "_CorruptCheckpoint":
        return _CorruptCheckpoint(self._step_directory(step), _one_line(cause))


class _CorruptCheckpoint(QrlInputError):
    """A checkpoint whose files do not read back (garbled, truncated, missing)."""

    def __init__(self, step_directory: str, cause: str):
        super().__init__(f"corrupt checkpoint in {step_directory}: {cause}")
        self.cause = cause


def _shape_of(leaf: Any) -> Tuple[int, ...]:
    """Shape of an array, `jax.ShapeDtypeStruct` or python scalar leaf."""
    shape = getattr(leaf, "shape", None)
    return tuple(shape) if shape is not None else np.shape(leaf)


def _abbreviate(items: List[str]) -> str:
    """Joins the first few items, saying how many more there are."""
    shown = ", ".join(items[:_MAX_PATHS_IN_MESSAGE])
    hidden = len(items) - _MAX_PATHS_IN_MESSAGE
    return f"{shown} and {hidden} more" if hidden > 0 else shown


def _one_line(cause: Any) -> str:
    """The first line of an error message (orbax's run over many), without tensorstore's
    spec dump, capped in length."""
    lines = [line.strip() for line in str(cause).splitlines() if line.strip()]
    text = lines[0].split(" [tensorstore_spec=")[0] if lines else type(cause).__name__
    return text if len(text) <= 300 else text[:297] + "..."


class _DropOrbaxRecords(logging.Filter):
    """Drops log records emitted from orbax's own source files."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.pathname.startswith(_ORBAX_PACKAGE_DIR)


@contextlib.contextmanager
def _orbax_quietly() -> Iterator[None]:
    """Silences orbax's absl log lines while qrl calls it: every problem reaches the caller
    as an exception instead (orbax logs e.g. each unreadable metadata file at ERROR level)."""
    absl_logger = logging.getLogger("absl")
    log_filter = _DropOrbaxRecords()
    absl_logger.addFilter(log_filter)
    try:
        yield
    finally:
        absl_logger.removeFilter(log_filter)


class _DropOrphanedOrbaxTaskErrors(logging.Filter):
    """Drops asyncio's '<Task|Future|_GatheringFuture> exception was never retrieved' for
    orbax/tensorstore reads.

    When one array of a checkpoint fails to open, orbax re-raises the first error and
    abandons the sibling reads (and, depending on timing, the gather over them); asyncio reports
    their errors again when they are collected. Recognized by the message or its traceback
    naming orbax, tensorstore or their storage (OCDBT, zarr).
    """

    SOURCES = ("orbax", "tensorstore", "OCDBT", "zarr")

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if "exception was never retrieved" not in message.split("\n", 1)[0]:
            return True
        text = message
        if record.exc_info and record.exc_info[1] is not None:
            text += "".join(traceback.format_exception(*record.exc_info))
        return not any(source in text for source in self.SOURCES)


def _is_closed_loop_callback_error(unraisable: Any) -> bool:
    """True for tensorstore reads finishing after orbax closed its event loop (failed reads)."""
    error = unraisable.exc_value
    if not isinstance(error, RuntimeError) or str(error) != "Event loop is closed":
        return False
    error_traceback = unraisable.exc_traceback
    return error_traceback is not None and error_traceback.tb_frame.f_code.co_name == "call_soon_threadsafe"


def _install_noise_filters() -> None:
    """Keeps stderr clean after a corrupt checkpoint: both messages arrive after orbax returned,
    from background threads, so they are filtered for the whole process, as narrowly as possible.
    """
    logging.getLogger("asyncio").addFilter(_DropOrphanedOrbaxTaskErrors())
    previous_hook = sys.unraisablehook

    def unraisable_hook(unraisable: Any) -> None:
        if not _is_closed_loop_callback_error(unraisable):
            previous_hook(unraisable)

    sys.unraisablehook = unraisable_hook


_install_noise_filters()
