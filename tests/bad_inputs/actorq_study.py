"""Bad inputs to launch.actorq_study: each refused with one line before any file is written or
any cell starts."""

from tests.bad_input import Case, a_file

_W = "--workdir={tmp}/study"
_SMALL = ("--agent=dqn", "--envs=gym:CartPole-v1")


def _case(name, fragment, *args, setup=None, stop=("--max_seconds=5",)):
    return Case("launch.actorq_study", name, (*_SMALL, *args, *stop), fragment, setup)


CASES = [
    _case("max-seconds-nan", "--max_seconds must be > 0 and finite", _W, stop=("--max_seconds=nan",)),
    _case("max-seconds-inf", "--max_seconds must be > 0 and finite", _W, stop=("--max_seconds=inf",)),
    _case("unknown-env", "NoSuchEnv", _W, "--envs=gym:CartPole-v1,gym:NoSuchEnv-v0"),
    _case("device-env", "host environments", _W, "--envs=brax:ant"),
    _case("unknown-precision", "unknown actor precision 'int4'", _W, "--precisions=fp32,int4"),
    _case("negative-seed", "--seeds values must be >= 0", _W, "--seeds=-1"),
    _case("no-actors", "--num_actors must be >= 1", _W, "--run_flag=--num_actors=0"),
    _case("cpus-nan", "--actor_cpus must be a finite number", _W, "--run_flag=--actor_cpus=nan"),
    _case("no-eval-episodes", "--eval_episodes must be >= 1", _W, "--run_flag=--eval_episodes=0"),
    _case("unknown-run-flag", "launch.actorq has no flag --bogus", _W, "--run_flag=--bogus=1"),
    _case("unknown-override", "nokey", _W, "--run_flag=--set=nokey=1"),
    _case("workdir-is-a-file", "exists and is not a directory", "--workdir={tmp}/afile", setup=a_file),
    _case("workdir-under-a-file", "which is not a directory", "--workdir={tmp}/afile/study", setup=a_file),
    _case("no-parallel", "--parallel must be >= 1", _W, "--parallel=0"),
    _case("ray-address-without-ray", "--ray_address needs --launcher=ray", _W, "--ray_address=127.0.0.1:1"),
    _case("unreachable-ray", "cannot reach a Ray cluster at 127.0.0.1:1", _W, "--launcher=ray",
          "--ray_address=127.0.0.1:1"),
    _case("bind-address-not-an-ip", "--ray_bind_address must be an IP address", _W, "--launcher=ray",
          "--ray_bind_address=999.1.1.1"),
]
