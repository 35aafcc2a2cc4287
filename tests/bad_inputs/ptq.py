"""Bad inputs to launch.ptq: run directories that are not runs, and bad sweep flags."""

import json

from tests.bad_input import Case

_W = "--workdir={tmp}/run"


def _run_dir(config):
    """A setup that writes `config` (text, or a dict as JSON) as {tmp}/run/config.json."""
    def setup(tmp):
        (tmp / "run").mkdir()
        text = config if isinstance(config, str) else json.dumps(config)
        (tmp / "run" / "config.json").write_text(text)
    return setup


_DQN_RUN = _run_dir({"agent": "dqn", "env": "gym:CartPole-v1", "agent_config": {}})


def _empty_run_dir(tmp):
    (tmp / "run").mkdir()


def _file_at_run(tmp):
    (tmp / "run").write_text("not a directory")


def _case(name, fragment, *args, setup=_DQN_RUN):
    return Case("launch.ptq", name, tuple(args), fragment, setup)


CASES = [
    _case("no-workdir", "--workdir is required", setup=None),
    _case("missing-workdir", "does not exist", _W, setup=None),
    _case("workdir-is-a-file", "is not a directory", _W, setup=_file_at_run),
    _case("no-config", "has no config.json", _W, setup=_empty_run_dir),
    _case("corrupt-config", "corrupt JSON", _W, setup=_run_dir("{not json")),
    _case("config-not-an-object", "malformed field", _W, setup=_run_dir("[1, 2]")),
    _case("config-unknown-agent", "unknown agent 'nope'", _W,
          setup=_run_dir({"agent": "nope", "env": "gym:CartPole-v1", "agent_config": {}})),
    _case("config-nan-value", "learning_rate must be a finite number", _W,
          setup=_run_dir('{"agent": "dqn", "env": "gym:CartPole-v1", "agent_config": {"learning_rate": NaN}}')),
    _case("no-checkpoint", "checkpoint", _W),
    _case("bits-out-of-range", "bits must be in 2..16", _W, "--precisions=int1"),
    _case("unknown-precision", "unknown precision 'fp8'", _W, "--precisions=fp8"),
    _case("edge-bits-on-weight-only", "takes no modifiers", _W, "--precisions=fp32,quarl4-e8"),
    _case("edge-bits-not-wider", "edge layers need more bits", _W, "--precisions=int8-e4"),
    _case("conflicting-observation-modes", "cannot both", _W, "--precisions=int6-obst-obsf"),
    _case("zero-episodes", "--episodes must be >= 1", _W, "--episodes=0"),
    _case("negative-max-steps", "--max_steps must be >= 1", _W, "--max_steps=-3"),
    _case("zero-calibration-steps", "--calibration_steps must be >= 1", _W, "--calibration_steps=0"),
    _case("out-is-a-file", "is not a directory", _W, "--out={tmp}/run/config.json"),
    _case("unknown-activations", "--activations", _W, "--activations=perchannel"),
]
