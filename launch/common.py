"""What the entry points share: flag parsing with exit status 2 on bad input, the checks of
numeric flags and of the directories a run writes, and `--set` parsing.

Every check here runs before an entry point writes anything.
"""

import dataclasses
import math
import numbers
import os
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

from absl import app, flags, logging

from qrl.errors import QrlInputError, exit_on_input_error, fail


def _parse_flags_or_fail(argv: list[str]) -> list[str]:
    """absl flag parsing whose errors (unknown flag, bad enum value) exit with status 2."""
    try:
        return flags.FLAGS(argv)
    except flags.Error as error:
        fail(str(error))


def run_entry_point(run: Callable[[], Any]) -> None:
    """Parses flags, then runs `run`; bad input of either kind is one line and exit status 2."""

    def main(argv: list[str]) -> None:
        logging.set_verbosity(logging.WARNING)
        if len(argv) > 1:
            fail(f"unexpected positional arguments: {' '.join(argv[1:])}")
        exit_on_input_error(run)

    app.run(main, flags_parser=_parse_flags_or_fail)


def require_workdir(workdir: Optional[str], flag: str = "--workdir", writable: bool = True) -> str:
    """`workdir`, given, neither a file nor under one, and, when `writable`, a place this process
    can write (a run directory that is only read, as PTQ reads its run, need not be)."""
    if not workdir:
        raise QrlInputError(f"{flag} is required")
    if writable:
        check_writable_directory(workdir, flag)
    else:
        check_directory_path(workdir, flag)
    return workdir


def check_directory_path(path: str, flag: str) -> str:
    """`path` is a directory or can become one: it is not a file, and its nearest existing
    ancestor, which this returns, is a directory."""
    absolute = os.path.abspath(path)
    if os.path.lexists(absolute) and not os.path.isdir(absolute):
        raise QrlInputError(f"{flag} {path} exists and is not a directory")
    ancestor = absolute
    while not os.path.lexists(ancestor):
        ancestor = os.path.dirname(ancestor)
    if not os.path.isdir(ancestor):
        raise QrlInputError(f"{flag} {path} lies under {ancestor}, which is not a directory")
    return ancestor


def check_writable_directory(path: str, flag: str) -> None:
    """`path` is a directory or can become one (`check_directory_path`), and its nearest existing
    ancestor is a directory this process may create entries in."""
    ancestor = check_directory_path(path, flag)
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise QrlInputError(f"{flag} {path}: directory {ancestor} is not writable")


@dataclasses.dataclass(frozen=True)
class Range:
    """Where a numeric input may lie: a finite number within `minimum` and `maximum` (None: no
    bound on that side); `open_minimum` / `open_maximum` leave the bound itself out, as in
    (0, inf) or [0, 1)."""

    minimum: Optional[float] = None
    maximum: Optional[float] = None
    open_minimum: bool = False
    open_maximum: bool = False

    def check(self, name: str, value: Any) -> None:
        """Raises a one-line QrlInputError naming `name` unless `value` lies in the range."""
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
            raise QrlInputError(f"{name} must be a finite number, got {value}")
        below = self.minimum is not None and (value <= self.minimum if self.open_minimum else value < self.minimum)
        above = self.maximum is not None and (value >= self.maximum if self.open_maximum else value > self.maximum)
        if below or above:
            raise QrlInputError(f"{name} must be {self._describe()}, got {value}")

    def _describe(self) -> str:
        if self.maximum is None:
            return f"{'>' if self.open_minimum else '>='} {self.minimum}"
        if self.minimum is None:
            return f"{'<' if self.open_maximum else '<='} {self.maximum}"
        return (f"in {'(' if self.open_minimum else '['}{self.minimum}, "
                f"{self.maximum}{')' if self.open_maximum else ']'}")


AT_LEAST_0 = Range(minimum=0)
AT_LEAST_1 = Range(minimum=1)
POSITIVE = Range(minimum=0, open_minimum=True)
FRACTION_BELOW_1 = Range(minimum=0, maximum=1, open_maximum=True)


def check_ranges(named_values: Iterable[tuple[str, Any, Range]]) -> None:
    """Each `(name, value, range)`: `value` lies in `range`; a None value (an unset option) passes."""
    for name, value, allowed in named_values:
        if value is not None:
            allowed.check(name, value)


def check_flag_ranges(ranges: Mapping[str, Range]) -> None:
    """Each flag named in `ranges` (`{flag name: Range}`) is unset or lies in its range."""
    check_ranges((f"--{name}", flags.FLAGS[name].value, allowed) for name, allowed in ranges.items())


def parse_overrides(items: Optional[Sequence[str]]) -> dict:
    """`["lr=0.001", "hidden_sizes=64-64"]` -> `{"lr": "0.001", "hidden_sizes": "64-64"}`."""
    overrides = {}
    for item in items or ():
        key, separator, value = item.partition("=")
        if not separator or not key.strip():
            raise QrlInputError(f"--set expects key=value, got {item!r}")
        overrides[key.strip()] = value.strip()
    return overrides
