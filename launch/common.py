"""What the entry points share: flag parsing with exit status 2 on bad input, dispatch mode."""

from typing import Any, Callable, Optional, Sequence

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


def require_workdir(workdir: Optional[str]) -> str:
    if not workdir:
        raise QrlInputError("--workdir is required")
    return workdir


def parse_overrides(items: Optional[Sequence[str]]) -> dict:
    """`["lr=0.001", "hidden_sizes=64-64"]` -> `{"lr": "0.001", "hidden_sizes": "64-64"}`."""
    overrides = {}
    for item in items or ():
        key, separator, value = item.partition("=")
        if not separator or not key.strip():
            raise QrlInputError(f"--set expects key=value, got {item!r}")
        overrides[key.strip()] = value.strip()
    return overrides
