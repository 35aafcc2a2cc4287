"""Bad inputs to launch.demo: all refused before training starts."""

from tests.bad_input import Case

_W = "--workdir={tmp}/demo"


def _file_at_demo(tmp):
    (tmp / "demo").write_text("not a directory")


def _case(name, fragment, *args, setup=None):
    return Case("launch.demo", name, tuple(args), fragment, setup)


CASES = [
    _case("bits-out-of-range", "bits must be in 2..16", _W, "--precisions=fp32,int1"),
    _case("unknown-precision", "unknown precision 'fp8'", _W, "--precisions=fp8"),
    _case("edge-bits-on-weight-only", "takes no modifiers", _W, "--precisions=fp32,quarl2-e8"),
    _case("empty-precision-bits", "quarl0", _W, "--precisions=quarl0"),
    _case("zero-steps", "--steps must be >= 1", _W, "--steps=0"),
    _case("negative-steps", "--steps must be >= 1", _W, "--steps=-10"),
    _case("zero-episodes", "--episodes must be >= 1", _W, "--episodes=0"),
    _case("negative-seed", "--seed must be >= 0", _W, "--seed=-1"),
    _case("continuous-env", "discrete", _W, "--env=gym:Pendulum-v1"),
    _case("unknown-env", "NoSuchEnv", _W, "--env=gym:NoSuchEnv-v0"),
    _case("unknown-family", "known families", _W, "--env=mars:rover"),
    _case("workdir-is-a-file", "is not a directory", _W, setup=_file_at_demo),
    _case("workdir-under-a-file", "which is not a directory", "--workdir={tmp}/demo/inner", setup=_file_at_demo),
    _case("empty-workdir", "--workdir is required", "--workdir="),
    _case("steps-not-a-number", "--steps", _W, "--steps=many"),
    _case("positional-argument", "unexpected positional arguments", _W, "extra"),
]
