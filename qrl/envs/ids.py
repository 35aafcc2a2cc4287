"""Environment ids (`family:name`): parsing, option checks and the one-line errors for bad ones."""

import difflib
from typing import Iterable, Mapping

import numpy as np

from qrl.errors import QrlInputError

KNOWN_FAMILIES = ("gym", "atari", "dmc", "brax", "gymnax")
HOST_FAMILIES = ("gym", "atari", "dmc")
DEVICE_FAMILIES = ("brax", "gymnax")  # JAX-native: stepped on device under jit
EXAMPLE_IDS = "gym:CartPole-v1, atari:Pong, dmc:walker-walk, brax:halfcheetah"


def split_env_id(env_id: str) -> tuple[str, str]:
    """Splits `family:name` and checks the family; raises `QrlInputError` naming the families."""
    if not isinstance(env_id, str):
        raise QrlInputError(f"environment id must be a string like {EXAMPLE_IDS}, got {env_id!r}")
    family, sep, name = env_id.partition(":")
    if not sep or not name:
        raise QrlInputError(
            f"environment id {env_id!r} must look like family:name; "
            f"known families: {', '.join(KNOWN_FAMILIES)} (e.g. {EXAMPLE_IDS})"
        )
    if family not in KNOWN_FAMILIES:
        close = difflib.get_close_matches(family.lower(), KNOWN_FAMILIES, n=1)
        hint = f" (did you mean {close[0]}:{name}?)" if close else ""
        raise QrlInputError(
            f"unknown environment family {family!r} in {env_id!r}{hint}; "
            f"known families: {', '.join(KNOWN_FAMILIES)} (e.g. {EXAMPLE_IDS})"
        )
    return family, name


def unknown_id_error(family: str, name: str, known_names: Iterable[str]) -> QrlInputError:
    """The error for a name its family does not have, with up to three close matches."""
    close = difflib.get_close_matches(name, list(known_names), n=3, cutoff=0.6)
    hint = f" (did you mean {', '.join(f'{family}:{match}' for match in close)}?)" if close else ""
    return QrlInputError(
        f"unknown environment id '{family}:{name}'{hint}; "
        f"known families: {', '.join(KNOWN_FAMILIES)} (e.g. {EXAMPLE_IDS})"
    )


def check_seed(seed: int) -> int:
    """Returns `seed` as a Python int; negative or non-integer seeds are input errors."""
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise QrlInputError(f"seed must be a non-negative integer, got {seed!r}")
    return int(seed)


def check_options(env_id: str, options: Mapping[str, object], allowed: Iterable[str]) -> None:
    """Raises `QrlInputError` naming any option that `env_id`'s family does not take."""
    allowed = tuple(allowed)
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        accepted = ", ".join(allowed) if allowed else "none"
        raise QrlInputError(f"unknown option(s) {', '.join(unknown)} for {env_id}; accepted: {accepted}")


def one_line(text: object) -> str:
    """`text` with every run of whitespace (newlines included) collapsed to one space."""
    return " ".join(str(text).split())
