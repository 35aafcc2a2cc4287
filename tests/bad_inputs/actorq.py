"""Bad inputs to launch.actorq: each refused with one line before any file is written or any
Ray process starts."""

from tests.bad_input import Case, a_file

_W = "--workdir={tmp}/run"
_SMALL = ("--agent=dqn", "--env=gym:CartPole-v1", "--set=hidden_sizes=16-16")


def _case(name, fragment, *args, setup=None, stop=("--max_seconds=5",)):
    return Case("launch.actorq", name, (*_SMALL, *args, *stop), fragment, setup)


CASES = [
    _case("max-seconds-nan", "--max_seconds must be a finite number", _W, stop=("--max_seconds=nan",)),
    _case("max-seconds-inf", "--max_seconds must be a finite number", _W, stop=("--max_seconds=inf",)),
    _case("target-return-nan", "--target_return must be a finite number", _W, stop=("--target_return=nan",)),
    _case("negative-actor-cpus", "--actor_cpus must be >= 0", _W, "--actor_cpus=-1"),
    _case("no-actors", "--num_actors must be >= 1", _W, "--num_actors=0"),
    _case("too-many-actors", "--num_actors must be <= 1024", _W, "--num_actors=100000"),
    _case("negative-exploration", "--exploration_first must be >= 0", _W, "--exploration_first=-0.1"),
    _case("zero-exploration-log-spaced", "--exploration_spacing=log needs nonzero --exploration_first", _W,
          "--exploration_first=0"),
    _case("unknown-preset", "--preset: dqn has no ActorQ preset 'acme'; it has: quarl", _W, "--preset=acme"),
    _case("negative-seed", "seed must be a non-negative integer", _W, "--seed=-1"),
    _case("unknown-precision", "unknown actor precision 'int4'", _W, "--actor_precision=int4"),
    _case("unknown-int8-scheme", "--actor_int8_scheme must be one of int8, int8-dyn, quarl_dyn8, int8-obst-sym, "
          "int8-obst-sym-dyn, got 'int4-dyn'", _W, "--actor_int8_scheme=int4-dyn"),
    _case("min-size-with-a-ratio", "--rate_limiter=min_size has none", _W, "--rate_limiter=min_size",
          "--samples_per_insert=4"),
    _case("max-times-sampled-zero", "--max_times_sampled must be >= 1", _W, "--max_times_sampled=0"),
    _case("gpu-learner-without-a-gpu", "--learner_device=gpu: JAX sees no gpu device here (it sees: cpu)", _W,
          "--learner_device=gpu"),
    _case("unknown-learner-device", "--learner_device must be one of cpu, gpu, got 'tpu'", _W, "--learner_device=tpu"),
    _case("actor-resources-without-ray", "--actor_resources places actors on Ray nodes: it needs --launcher=ray", _W,
          "--actor_resources=actor_host:1"),
    _case("actor-resources-malformed", "--actor_resources: 'actor_host' is not name:amount", _W,
          "--actor_resources=actor_host", "--launcher=ray"),
    _case("actor-resources-nowhere", "has no node offering actor_host 1", _W, "--actor_resources=actor_host:1",
          "--launcher=ray"),
    _case("unknown-actor-runtime", "--actor_runtime must be one of jax, onnx, got 'tflite'", _W, "--actor_runtime=tflite"),
    _case("unknown-env", "NoSuchEnv", _W, "--env=gym:NoSuchEnv-v0"),
    _case("workdir-is-a-file", "exists and is not a directory", "--workdir={tmp}/afile", setup=a_file),
    _case("workdir-under-a-file", "which is not a directory", "--workdir={tmp}/afile/run", setup=a_file),
    _case("unreachable-ray", "cannot reach a Ray cluster at 127.0.0.1:1", _W, "--launcher=ray",
          "--ray_address=127.0.0.1:1"),
    _case("bind-address-not-an-ip", "--ray_bind_address must be an IP address", _W, "--launcher=ray",
          "--ray_bind_address=somewhere"),
    _case("bind-address-not-this-machine", "is not an address of this machine", _W, "--launcher=ray",
          "--ray_bind_address=203.0.113.7"),
]
