"""Bad inputs to launch.train."""

from tests.bad_input import Case

_W = "--workdir={tmp}/run"


def _case(name, fragment, *args, setup=None):
    return Case("launch.train", name, tuple(args), fragment, setup)


CASES = [
    _case("unknown-agent", "unknown agent", "--agent=nope", _W),
    _case("unknown-env", "NoSuchEnv", "--env=gym:NoSuchEnv-v0", _W),
    _case("zero-steps", "steps", "--steps=0", _W),
    _case("no-workdir", "--workdir is required"),
]
