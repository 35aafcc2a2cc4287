"""Run metrics (a CSV plus TensorBoard scalars) and a progress bar that keeps CI logs clean."""

import csv
import io
import math
import os
import sys
import time
from typing import Any, Dict, List, Mapping, Optional

import numpy as np
import tqdm

from qrl import io as qrl_io
from qrl.errors import QrlInputError

STEP_COLUMN = "step"


class MetricsLogger:
    """Appends metrics to `workdir/metrics.csv` and, optionally, TensorBoard under `workdir/tb/`.

    The CSV header is `step` followed by every metric name seen so far, in order of first
    appearance. When a new name appears the file is rewritten atomically with the wider header,
    so the CSV stays rectangular. Every row is flushed to the OS at once, so a killed run keeps
    its metrics. Reopening an existing workdir appends to its CSV.
    """

    def __init__(self, workdir: qrl_io.PathLike, tensorboard: bool = True):
        self.workdir = os.fspath(workdir)
        self.csv_path = os.path.join(self.workdir, "metrics.csv")
        try:
            os.makedirs(self.workdir, exist_ok=True)
        except OSError as error:
            raise QrlInputError(
                f"cannot create workdir {self.workdir}: {error.strerror}"
            ) from error
        self._drop_partial_last_row()
        self._columns = self._read_existing_columns()
        self._csv_file = open(self.csv_path, "a", newline="", encoding="utf-8")
        self._csv_writer = csv.writer(self._csv_file)
        if not self._columns:
            self._columns = [STEP_COLUMN]
            self._csv_writer.writerow(self._columns)
            self._csv_file.flush()
        self._tb_writer = None
        if tensorboard:
            import tensorboardX  # Imported lazily: it pulls in protobuf, slow for CSV-only use.

            self._tb_writer = tensorboardX.SummaryWriter(
                logdir=os.path.join(self.workdir, "tb"), flush_secs=5
            )

    def write(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Records `metrics` (name -> scalar; python, numpy or jax) at `step`."""
        step = int(step)
        values = {name: _to_float(name, value) for name, value in metrics.items()}
        if STEP_COLUMN in values:
            raise ValueError(f"metric name {STEP_COLUMN!r} is reserved for the step column")
        new_names = [name for name in values if name not in self._columns]
        if new_names:
            self._widen_header(new_names)
        row = [str(step)] + [
            repr(values[name]) if name in values else "" for name in self._columns[1:]
        ]
        self._csv_writer.writerow(row)
        self._csv_file.flush()
        if self._tb_writer is not None:
            for name, value in values.items():
                self._tb_writer.add_scalar(name, value, global_step=step)

    def close(self) -> None:
        """Flushes and closes the CSV file and the TensorBoard writer; safe to call twice."""
        if not self._csv_file.closed:
            self._csv_file.close()
        if self._tb_writer is not None:
            self._tb_writer.close()
            self._tb_writer = None

    def __enter__(self) -> "MetricsLogger":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def _drop_partial_last_row(self) -> None:
        """Cuts a row left unfinished by a killed run, so appended rows start on a new line."""
        try:
            with open(self.csv_path, "rb+") as csv_file:
                size = csv_file.seek(0, os.SEEK_END)
                if size == 0:
                    return
                csv_file.seek(size - 1)
                if csv_file.read(1) != b"\n":
                    csv_file.seek(0)
                    csv_file.truncate(csv_file.read().rfind(b"\n") + 1)
        except FileNotFoundError:
            pass
        except OSError as error:
            raise QrlInputError(f"cannot open {self.csv_path}: {error.strerror}") from error

    def _read_existing_columns(self) -> List[str]:
        """Returns the header of an existing metrics.csv, or [] when there is none yet."""
        try:
            with open(self.csv_path, newline="", encoding="utf-8") as csv_file:
                header = next(csv.reader(csv_file), [])
        except FileNotFoundError:
            return []
        except (OSError, UnicodeDecodeError, csv.Error) as error:
            raise QrlInputError(f"cannot read {self.csv_path}: {error}") from error
        if header and header[0] != STEP_COLUMN:
            raise QrlInputError(
                f"{self.csv_path} is not a metrics file: its first column is not {STEP_COLUMN!r}"
            )
        return header

    def _widen_header(self, new_names: List[str]) -> None:
        """Rewrites the CSV atomically with `new_names` added to the header."""
        self._csv_file.close()
        with open(self.csv_path, newline="", encoding="utf-8") as csv_file:
            rows = list(csv.reader(csv_file))[1:]
        self._columns = self._columns + new_names
        padding = [""] * len(new_names)
        text = io.StringIO()
        writer = csv.writer(text)
        writer.writerow(self._columns)
        writer.writerows(row + padding for row in rows)
        qrl_io.atomic_write_text(self.csv_path, text.getvalue())
        self._csv_file = open(self.csv_path, "a", newline="", encoding="utf-8")
        self._csv_writer = csv.writer(self._csv_file)


def _to_float(name: str, value: Any) -> float:
    """Converts a python/numpy/jax scalar to float, naming the metric when it is not a scalar."""
    array = np.asarray(value)
    if array.size != 1:
        raise ValueError(f"metric {name!r} must be a scalar, got shape {array.shape}")
    return float(array.reshape(()))


class ProgressBar:
    """A tqdm progress bar over environment steps showing steps/s and the latest return.

    `disable=None` shows the bar only when stderr is a terminal; `False` forces it on and
    `True` silences it. When it is off because stderr is not a terminal (CI, pytest, log files),
    a one-line summary goes to stderr at most every `summary_every_s` seconds instead, so long
    non-interactive runs still show progress while short ones print nothing.
    """

    def __init__(
        self,
        total_steps: int,
        desc: str = "",
        disable: Optional[bool] = None,
        summary_every_s: float = 10.0,
    ):
        self.total_steps = int(total_steps)
        self.desc = desc
        self.summary_every_s = summary_every_s
        interactive = sys.stderr.isatty() if disable is None else not disable
        self._print_summaries = disable is None and not interactive
        self._postfix: Dict[str, Any] = {}
        self._steps_done = 0
        self._start_time = time.monotonic()
        self._last_summary_time = self._start_time
        self._last_summary_steps = 0
        self._bar = tqdm.tqdm(
            total=self.total_steps,
            desc=desc,
            unit="step",
            unit_scale=True,
            dynamic_ncols=True,
            disable=not interactive,
            file=sys.stderr,
        )

    def update(
        self, steps_done_total: int, latest_return: Optional[float] = None, **extra: Any
    ) -> None:
        """Moves the bar to `steps_done_total`; the return and extras stay shown until replaced."""
        steps_done_total = int(steps_done_total)
        if latest_return is not None:
            self._postfix["return"] = latest_return
        self._postfix.update(extra)
        if self._bar.disable:
            self._steps_done = steps_done_total
            self._maybe_print_summary()
            return
        self._bar.set_postfix_str(self._postfix_text(), refresh=False)
        self._bar.update(steps_done_total - self._bar.n)
        self._steps_done = steps_done_total

    def close(self) -> None:
        """Closes the bar; a non-interactive run that printed summaries ends with a final one."""
        if self._print_summaries and self._last_summary_time > self._start_time:
            self._print_summary(time.monotonic(), final=True)
            self._print_summaries = False
        self._bar.close()

    def __enter__(self) -> "ProgressBar":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def _postfix_text(self) -> str:
        return ", ".join(
            f"{name}={_format_postfix(value)}" for name, value in self._postfix.items()
        )

    def _maybe_print_summary(self) -> None:
        if not self._print_summaries:
            return
        now = time.monotonic()
        if now - self._last_summary_time >= self.summary_every_s:
            self._print_summary(now, final=False)

    def _print_summary(self, now: float, final: bool) -> None:
        """Prints one line: steps done, percent, recent (overall when final) rate, postfix."""
        if final:
            elapsed = now - self._start_time
            steps = self._steps_done
        else:
            elapsed = now - self._last_summary_time
            steps = self._steps_done - self._last_summary_steps
        rate = steps / elapsed if elapsed > 0 else math.inf
        percent = 100.0 * self._steps_done / self.total_steps if self.total_steps else 100.0
        parts = [
            f"{self.desc + ': ' if self.desc else ''}{self._steps_done}/{self.total_steps} steps"
            f" ({percent:.0f}%)",
            f"{rate:.1f} steps/s",
        ]
        if final:
            parts.append(f"done in {elapsed:.1f} s")
        if self._postfix:
            parts.append(self._postfix_text())
        print(", ".join(parts), file=sys.stderr, flush=True)
        self._last_summary_time = now
        self._last_summary_steps = self._steps_done


def _format_postfix(value: Any) -> str:
    """Formats a postfix value: floats (python, numpy or jax) to 4 significant digits."""
    if isinstance(value, (bool, str)):
        return str(value)
    array = np.asarray(value)
    if array.size == 1 and np.issubdtype(array.dtype, np.floating):
        return f"{float(array.reshape(())):.4g}"
    if array.size == 1 and np.issubdtype(array.dtype, np.integer):
        return str(int(array.reshape(())))
    return str(value)
