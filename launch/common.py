"""What the entry points share: flag parsing with exit status 2 on bad input, the checks of
numeric flags and of the directories a run writes, and `--set` parsing.

Every check here runs before an entry point writes anything.
"""

from typing import Any, Callable, Mapping, Optional, Sequence

from absl import app, flags, logging

from qrl import workdirs
from qrl.errors import QrlInputError, exit_on_input_error, fail
from qrl.ranges import AT_LEAST_0, AT_LEAST_1, FRACTION_BELOW_1, POSITIVE, Range, check_ranges  # noqa: F401


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
    workdirs.check_path(workdir, flag, writable=writable)
    return workdir


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
