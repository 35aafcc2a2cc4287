"""MetricsLogger keeps a rectangular, flushed CSV plus TensorBoard scalars; ProgressBar stays
quiet in non-interactive logs except for rare one-line summaries."""

import csv
import os
import struct

import jax.numpy as jnp
import numpy as np
import pytest
from tensorboardX.proto import event_pb2

from qrl.errors import QrlInputError
from qrl.logging import MetricsLogger, ProgressBar


def _read_csv(path):
    with open(path, newline="") as csv_file:
        return list(csv.reader(csv_file))


def _read_tensorboard_scalars(tb_dir):
    """Returns {tag: [(step, value), ...]} from the TFRecord event files in `tb_dir`."""
    scalars = {}
    for name in sorted(os.listdir(tb_dir)):
        with open(os.path.join(tb_dir, name), "rb") as event_file:
            data = event_file.read()
        offset = 0
        while offset < len(data):
            (length,) = struct.unpack_from("<Q", data, offset)
            record = data[offset + 12 : offset + 12 + length]
            offset += 12 + length + 4
            event = event_pb2.Event.FromString(record)
            for value in event.summary.value:
                scalars.setdefault(value.tag, []).append((event.step, value.simple_value))
    return scalars


def test_metrics_csv_accepts_python_numpy_and_jax_scalars(tmp_path):
    with MetricsLogger(tmp_path, tensorboard=False) as logger:
        logger.write(10, {"loss": 0.5, "return": np.float32(1.25)})
        logger.write(np.int64(20), {"loss": jnp.float32(0.25), "return": jnp.array([2.0])})

    assert _read_csv(tmp_path / "metrics.csv") == [
        ["step", "loss", "return"],
        ["10", "0.5", "1.25"],
        ["20", "0.25", "2.0"],
    ]


def test_new_metric_widens_header_and_keeps_csv_rectangular(tmp_path):
    with MetricsLogger(tmp_path, tensorboard=False) as logger:
        logger.write(1, {"loss": 1.0})
        logger.write(2, {"loss": 0.5, "eval_return": 7.0})
        logger.write(3, {"loss": 0.25})

    assert _read_csv(tmp_path / "metrics.csv") == [
        ["step", "loss", "eval_return"],
        ["1", "1.0", ""],
        ["2", "0.5", "7.0"],
        ["3", "0.25", ""],
    ]
    assert sorted(os.listdir(tmp_path)) == ["metrics.csv"]


def test_rows_are_on_disk_before_close(tmp_path):
    logger = MetricsLogger(tmp_path, tensorboard=False)
    logger.write(1, {"loss": 1.0})

    assert _read_csv(tmp_path / "metrics.csv") == [["step", "loss"], ["1", "1.0"]]
    logger.close()


def test_reopened_workdir_appends_and_drops_a_row_cut_by_a_kill(tmp_path):
    with MetricsLogger(tmp_path, tensorboard=False) as logger:
        logger.write(1, {"loss": 1.0})
    with open(tmp_path / "metrics.csv", "a") as csv_file:
        csv_file.write("2,0.")

    with MetricsLogger(tmp_path, tensorboard=False) as logger:
        logger.write(2, {"loss": 0.5, "entropy": 0.1})

    assert _read_csv(tmp_path / "metrics.csv") == [
        ["step", "loss", "entropy"],
        ["1", "1.0", ""],
        ["2", "0.5", "0.1"],
    ]


def test_foreign_csv_in_workdir_is_input_error(tmp_path):
    (tmp_path / "metrics.csv").write_text("name,value\nx,1\n")

    with pytest.raises(QrlInputError, match="not a metrics file"):
        MetricsLogger(tmp_path, tensorboard=False)


def test_non_scalar_metric_and_reserved_name_are_rejected(tmp_path):
    with MetricsLogger(tmp_path, tensorboard=False) as logger:
        with pytest.raises(ValueError, match="'q_values' must be a scalar"):
            logger.write(1, {"q_values": np.zeros(3)})
        with pytest.raises(ValueError, match="reserved"):
            logger.write(1, {"step": 1.0})


def test_tensorboard_scalars_are_written_under_tb(tmp_path):
    with MetricsLogger(tmp_path) as logger:
        logger.write(5, {"loss": jnp.float32(0.5)})
        logger.write(6, {"loss": 0.25, "return": 3.0})

    scalars = _read_tensorboard_scalars(tmp_path / "tb")
    assert scalars == {"loss": [(5, 0.5), (6, 0.25)], "return": [(6, 3.0)]}


def test_progress_bar_is_silent_for_short_non_interactive_runs(capsys):
    with ProgressBar(100, "train") as bar:
        for steps in range(10, 101, 10):
            bar.update(steps, latest_return=1.0)

    captured = capsys.readouterr()
    assert captured.err == "" and captured.out == ""


def test_progress_bar_prints_one_line_summaries_when_not_a_terminal(capsys):
    with ProgressBar(100, "train", summary_every_s=0.0) as bar:
        bar.update(50, latest_return=np.float32(12.5), loss=jnp.float32(0.123456))
        bar.update(100)

    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 3
    assert lines[0].startswith("train: 50/100 steps (50%), ")
    assert "steps/s" in lines[0] and lines[0].endswith("return=12.5, loss=0.1235")
    assert lines[1].startswith("train: 100/100 steps (100%)")
    assert "done in" in lines[2] and "return=12.5" in lines[2]


def test_progress_bar_disable_true_prints_nothing(capsys):
    with ProgressBar(100, "train", disable=True, summary_every_s=0.0) as bar:
        bar.update(100, latest_return=1.0)

    assert capsys.readouterr().err == ""


def test_forced_progress_bar_shows_rate_and_latest_return(capsys):
    with ProgressBar(100, "train", disable=False) as bar:
        bar.update(40, latest_return=3.5)
        bar.update(100)

    err = capsys.readouterr().err
    assert "train" in err and "100/100" in err
    assert "step/s" in err and "return=3.5" in err
