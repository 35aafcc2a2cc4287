"""Bad inputs to launch.train."""

from tests.bad_input import Case

_W = "--workdir={tmp}/run"


def _file_at_run(tmp):
    (tmp / "run").write_text("not a directory")


def _case(name, fragment, *args, setup=None):
    return Case("launch.train", name, tuple(args), fragment, setup)


CASES = [
    _case("unknown-agent", "unknown agent", "--agent=nope", _W),
    _case("unknown-env", "NoSuchEnv", "--env=gym:NoSuchEnv-v0", _W),
    _case("zero-steps", "steps", "--steps=0", _W),
    _case("no-workdir", "--workdir is required"),
    _case("nan-learning-rate", "learning_rate must be a finite number", "--set=learning_rate=nan", _W),
    _case("inf-gamma", "gamma must be a finite number", "--set=gamma=inf", _W),
    _case("zero-hidden-sizes", "hidden_sizes must be positive layer widths", "--set=hidden_sizes=0-0", _W),
    _case("negative-learning-rate", "learning_rate must be > 0", "--set=learning_rate=-1e-3", _W),
    _case("negative-checkpoint-every", "--checkpoint_every must be >= 0", "--checkpoint_every=-1", _W),
    _case("negative-xla-threads", "--xla_threads must be >= 0", "--xla_threads=-2", _W),
    _case("zero-eval-episodes", "--eval_episodes must be >= 1", "--eval_episodes=0", _W),
    _case("qat-bits-out-of-range", "qat_bits must be in 2..8", "--qat_bits=9", _W),
    _case("quant-delay-past-the-run", "quant_delay 100 updates is not shorter", "--steps=100", "--qat_bits=8",
          "--quant_delay=100", _W),
    _case("unknown-qat-backend", "qat_backend must be one of qrl, aqt", "--qat_bits=8", "--set=qat_backend=tflite", _W),
    _case("continuous-env-for-dqn", "discrete", "--env=gym:Pendulum-v1", _W),
    _case("unknown-preset", "unknown DQN preset 'qaurl'; known for gym:CartPole-v1: quarl", "--preset=qaurl", _W),
    _case("preset-of-another-env", "DQN has no named presets for gym:Acrobot-v1", "--env=gym:Acrobot-v1",
          "--set=preset=quarl", _W),
    _case("workdir-is-a-file", "is not a directory", _W, setup=_file_at_run),
    _case("workdir-under-a-file", "which is not a directory", "--workdir={tmp}/run/inner", setup=_file_at_run),
]
