"""Where a number from a user (a flag, a config value) may lie: finite, within its bounds.

    check_ranges([("--episodes", episodes, AT_LEAST_1), ("--sparsity", sparsity, FRACTION_BELOW_1)])

Entry points (`launch.common.check_flag_ranges`) and library validators (ActorQ's config) share
these, so every refusal reads the same: `--name must be >= 1, got 0`.
"""

import dataclasses
import math
import numbers
from typing import Any, Iterable, Optional

from qrl.errors import QrlInputError


@dataclasses.dataclass(frozen=True)
class Range:
    """A finite number within `minimum` and `maximum` (None: no bound on that side);
    `open_minimum` / `open_maximum` leave the bound itself out, as in (0, inf) or [0, 1)."""

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


ANY_FINITE = Range()
AT_LEAST_0 = Range(minimum=0)
AT_LEAST_1 = Range(minimum=1)
POSITIVE = Range(minimum=0, open_minimum=True)
FRACTION_BELOW_1 = Range(minimum=0, maximum=1, open_maximum=True)


def check_ranges(named_values: Iterable[tuple[str, Any, Range]]) -> None:
    """Each `(name, value, range)`: `value` lies in `range`; a None value (an unset option) passes."""
    for name, value, allowed in named_values:
        if value is not None:
            allowed.check(name, value)
