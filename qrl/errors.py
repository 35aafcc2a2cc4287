"""The one exception type for bad user input, and the CLI wrapper that turns it into exit 2."""

import sys
from typing import Callable, NoReturn


class QrlInputError(ValueError):
    """Bad input from the user: an unknown id, out-of-range bits, a missing or corrupt file.

    Entry points print its message as one line and exit with status 2.
    """


def fail(message: str) -> NoReturn:
    """Prints `error: message` as one line on stderr and exits with status 2."""
    print(f"error: {' '.join(str(message).split())}", file=sys.stderr, flush=True)
    sys.exit(2)


def exit_on_input_error(main: Callable[[], None]) -> None:
    """Runs `main`; a `QrlInputError` becomes one line on stderr and exit status 2."""
    try:
        main()
    except QrlInputError as error:
        fail(str(error))
