"""Bad inputs to launch.quarl_study: all refused before study.json or any cell is written."""

from tests.bad_input import Case

_W = "--workdir={tmp}/study"


def _file_at_study(tmp):
    (tmp / "study").write_text("not a directory")


def _case(name, fragment, *args, setup=None):
    return Case("launch.quarl_study", name, tuple(args), fragment, setup)


CASES = [
    _case("no-workdir", "--workdir is required"),
    _case("workdir-is-a-file", "is not a directory", _W, setup=_file_at_study),
    _case("workdir-under-a-file", "which is not a directory", "--workdir={tmp}/study/inner", setup=_file_at_study),
    _case("unknown-agent", "unknown agent 'nope'", _W, "--agents=nope"),
    _case("incompatible-pair", "unsupported algorithm/environment pair", _W, "--envs=gym:Pendulum-v1"),
    _case("negative-seed", "--seeds values must be >= 0", _W, "--seeds=-1"),
    _case("bits-out-of-range", "bits must be in 2..16", _W, "--precisions=int1"),
    _case("unknown-scheme-modifier", "unknown modifier -fast", _W, "--precisions=fp32,int8-fast"),
    _case("edge-bits-on-weight-only", "takes no modifiers", _W, "--precisions=quarl4-e8"),
    _case("qat-bits-out-of-range", "--qat_bits values must be in 2..8", _W, "--qat_bits=9"),
    _case("nan-quant-delay-fraction", "--quant_delay_fraction must be a finite number", _W,
          "--quant_delay_fraction=nan"),
    _case("quant-delay-fraction-one", "--quant_delay_fraction must be in [0, 1)", _W, "--quant_delay_fraction=1"),
    _case("zero-steps", "--steps must be >= 1", _W, "--steps=0"),
    _case("unknown-preset", "unknown DQN preset 'qaurl'", _W, "--set=dqn.preset=qaurl"),
    _case("zero-episodes", "--episodes must be >= 1", _W, "--episodes=0"),
    _case("zero-num-envs", "--num_envs must be >= 1", _W, "--num_envs=0"),
    _case("rollout-smaller-than-batch", "exceeds a rollout", _W, "--agents=ppo", "--set=ppo.batch_size=256",
          "--num_envs=1"),
    _case("inf-override", "learning_rate must be a finite number", _W, "--set=dqn.learning_rate=inf"),
    _case("zero-hidden-sizes", "hidden_sizes must be positive layer widths", _W, "--set=dqn.hidden_sizes=0-0"),
]
