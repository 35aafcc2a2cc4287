"""Atomic file writes and checked JSON reads for everything a run puts in its workdir.

Every writer goes through a temporary file in the target's directory and `os.replace`, so a
reader (or a crash) sees either the old file or the complete new one, never half of it.
"""

import dataclasses
import enum
import io
import json
import os
import pathlib
import re
import uuid
from typing import Any, Optional, Union

import numpy as np

from qrl.errors import QrlInputError

PathLike = Union[str, os.PathLike]
# Where a write is staged (`tmp`) or an old copy waits while its replacement is renamed in
# (`old`): `.<name>.<32 hex digits>.<kind>` beside the target `<name>`.
TEMP_NAME = re.compile(r"\.(?P<name>.+)\.[0-9a-f]{32}\.(?P<kind>tmp|old)")


def temp_sibling(path: PathLike, kind: str = "tmp") -> str:
    """A fresh hidden sibling of `path` named as `TEMP_NAME` says."""
    directory, name = os.path.split(os.path.abspath(os.fspath(path)))
    return os.path.join(directory, f".{name}.{uuid.uuid4().hex}.{kind}")


def temp_target(entry: str) -> Optional[str]:
    """The name a directory entry named like `temp_sibling`'s stands beside, else None."""
    match = TEMP_NAME.fullmatch(entry)
    return match.group("name") if match else None


def atomic_write_bytes(path: PathLike, data: bytes) -> None:
    """Writes `data` to `path` through a temporary sibling file and an atomic rename.

    Creates missing parent directories. On any failure the temporary file is removed and
    an existing file at `path` is left untouched; an unwritable location raises
    `QrlInputError`.
    """
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    temp_path = temp_sibling(path)
    try:
        os.makedirs(directory, exist_ok=True)
        # Mode 0o666 lets the process umask decide permissions, as for a plain open().
        descriptor = os.open(temp_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except OSError as error:
        raise QrlInputError(f"cannot write {path}: {error.strerror or error}") from error
    try:
        with os.fdopen(descriptor, "wb") as temp_file:
            temp_file.write(data)
            temp_file.flush()
            os.fsync(temp_file.fileno())
        os.replace(temp_path, path)
    except BaseException as error:
        _remove_quietly(temp_path)
        if isinstance(error, OSError):
            raise QrlInputError(f"cannot write {path}: {error.strerror or error}") from error
        raise


def atomic_write_text(path: PathLike, text: str) -> None:
    """Writes `text` as UTF-8 to `path` atomically (see `atomic_write_bytes`)."""
    atomic_write_bytes(path, text.encode("utf-8"))


def to_json_compatible(obj: Any) -> Any:
    """Returns `obj` with numpy/jax values, dataclasses, paths and enums as plain JSON types.

    Containers are converted recursively; tuples and sets become lists, mapping keys become
    strings. Raises TypeError for objects with no JSON form.
    """
    if isinstance(obj, np.generic):
        return obj.item()
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, dict):
        return {str(key): to_json_compatible(value) for key, value in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_json_compatible(value) for value in obj]
    if isinstance(obj, (set, frozenset)):
        return sorted(to_json_compatible(value) for value in obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {
            field.name: to_json_compatible(getattr(obj, field.name))
            for field in dataclasses.fields(obj)
        }
    if isinstance(obj, enum.Enum):
        return to_json_compatible(obj.value)
    if isinstance(obj, pathlib.PurePath):
        return str(obj)
    if hasattr(obj, "__array__"):
        return np.asarray(obj).tolist()
    raise TypeError(f"cannot convert {type(obj).__name__} to JSON")


def atomic_write_json(path: PathLike, obj: Any) -> None:
    """Writes `obj` as indented JSON with sorted keys to `path` atomically.

    numpy and jax scalars/arrays and dataclasses are converted to JSON types first.
    """
    text = json.dumps(to_json_compatible(obj), indent=2, sort_keys=True)
    atomic_write_text(path, text + "\n")


def read_json(path: PathLike) -> Any:
    """Reads a JSON file; a missing, unreadable or malformed file raises `QrlInputError`."""
    path = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as json_file:
            return json.load(json_file)
    except FileNotFoundError as error:
        raise QrlInputError(f"missing file: {path}") from error
    except json.JSONDecodeError as error:
        raise QrlInputError(
            f"corrupt JSON in {path}: {error.msg} at line {error.lineno} column {error.colno}"
        ) from error
    except UnicodeDecodeError as error:
        raise QrlInputError(f"corrupt JSON in {path}: not UTF-8 text") from error
    except OSError as error:
        raise QrlInputError(f"cannot read {path}: {error.strerror or error}") from error


def save_figure(fig: Any, path: PathLike, **savefig_kwargs: Any) -> None:
    """Saves a matplotlib figure as PNG to `path` atomically.

    The figure is rendered to memory first, so a rendering error leaves no file behind.
    Extra keyword arguments (dpi, bbox_inches, ...) go to `Figure.savefig`.
    """
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", **savefig_kwargs)
    atomic_write_bytes(path, buffer.getvalue())


def finish_plot(figure: Any, axis: Any, path: Optional[PathLike] = None) -> Any:
    """A one-axis figure's finish: grid, legend, tight layout, and `save_figure` when `path` is
    given. Returns the figure."""
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8)
    figure.tight_layout()
    if path is not None:
        save_figure(figure, path)
    return figure


def _remove_quietly(path: str) -> None:
    """Removes `path` if it exists, ignoring errors: used only while cleaning up a failure."""
    try:
        os.remove(path)
    except OSError:
        pass
