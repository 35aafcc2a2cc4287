"""Atomic writes leave either the old or the complete new file; JSON reads fail with one line."""

import dataclasses
import json
import os

import jax.numpy as jnp
import numpy as np
import pytest
from matplotlib.figure import Figure

from qrl import io as qrl_io
from qrl.errors import QrlInputError


@dataclasses.dataclass
class _Config:
    name: str
    learning_rate: float
    layer_sizes: tuple


def test_atomic_write_bytes_and_text_round_trip(tmp_path):
    qrl_io.atomic_write_bytes(tmp_path / "blob.bin", b"\x00\x01\xff")
    qrl_io.atomic_write_text(tmp_path / "note.txt", "héllo\n")

    assert (tmp_path / "blob.bin").read_bytes() == b"\x00\x01\xff"
    assert (tmp_path / "note.txt").read_text(encoding="utf-8") == "héllo\n"
    assert sorted(os.listdir(tmp_path)) == ["blob.bin", "note.txt"]


def test_atomic_write_creates_missing_parent_directories(tmp_path):
    qrl_io.atomic_write_text(tmp_path / "a" / "b" / "c.txt", "x")

    assert (tmp_path / "a" / "b" / "c.txt").read_text() == "x"


def test_atomic_write_json_is_sorted_indented_and_converts_numpy_jax_and_dataclasses(tmp_path):
    path = tmp_path / "results.json"
    qrl_io.atomic_write_json(
        path,
        {
            "zeta": np.float32(0.5),
            "alpha": np.int64(3),
            "flag": np.bool_(True),
            "matrix": np.arange(4).reshape(2, 2),
            "jax_value": jnp.float32(2.0),
            "config": _Config("dqn", 1e-3, (64, 64)),
        },
    )

    text = path.read_text()
    assert text == json.dumps(json.loads(text), indent=2, sort_keys=True) + "\n"
    assert qrl_io.read_json(path) == {
        "alpha": 3,
        "config": {"layer_sizes": [64, 64], "learning_rate": 1e-3, "name": "dqn"},
        "flag": True,
        "jax_value": 2.0,
        "matrix": [[0, 1], [2, 3]],
        "zeta": 0.5,
    }


def test_failed_replace_keeps_old_file_and_leaves_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "config.json"
    qrl_io.atomic_write_json(path, {"version": 1})

    def failing_replace(source, destination):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(QrlInputError, match="cannot write .*config.json: No space left"):
        qrl_io.atomic_write_json(path, {"version": 2})

    assert qrl_io.read_json(path) == {"version": 1}
    assert os.listdir(tmp_path) == ["config.json"]


def test_unconvertible_object_writes_nothing(tmp_path):
    with pytest.raises(TypeError, match="object"):
        qrl_io.atomic_write_json(tmp_path / "bad.json", {"value": object()})

    assert os.listdir(tmp_path) == []


def test_write_below_a_regular_file_raises_input_error(tmp_path):
    (tmp_path / "file").write_text("not a directory")

    with pytest.raises(QrlInputError, match="cannot write"):
        qrl_io.atomic_write_text(tmp_path / "file" / "out.txt", "x")


def test_read_json_missing_file_names_it(tmp_path):
    with pytest.raises(QrlInputError, match="missing file: .*absent.json"):
        qrl_io.read_json(tmp_path / "absent.json")


@pytest.mark.parametrize("content", [b'{"truncated": ', b"\xff\xfe garbage", b""])
def test_read_json_corrupt_file_is_one_line_input_error(tmp_path, content):
    path = tmp_path / "corrupt.json"
    path.write_bytes(content)

    with pytest.raises(QrlInputError, match="corrupt JSON in .*corrupt.json") as error:
        qrl_io.read_json(path)
    assert "\n" not in str(error.value)


def test_save_figure_writes_png(tmp_path):
    figure = Figure(figsize=(2, 2))
    figure.add_subplot().plot([0, 1], [1, 0])

    qrl_io.save_figure(figure, tmp_path / "plots" / "curve.png", dpi=50)

    assert (tmp_path / "plots" / "curve.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert os.listdir(tmp_path / "plots") == ["curve.png"]


def test_save_figure_rendering_error_leaves_no_file(tmp_path):
    figure = Figure(figsize=(2, 2))

    with pytest.raises(TypeError):
        qrl_io.save_figure(figure, tmp_path / "curve.png", no_such_option=True)

    assert os.listdir(tmp_path) == []
