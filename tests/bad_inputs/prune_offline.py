"""Bad inputs to launch.prune_offline: each case varies one flag of a run on a tiny valid dataset."""

import numpy as np

from tests.bad_input import Case

ENV_ID = "gym:Pendulum-v1"


def write_tiny_dataset(path, env_id=ENV_ID, observation_size=3, steps=200):
    """A valid D4RL HDF5 file of `steps` random Pendulum-shaped steps (episodes of 50), naming
    `env_id` and reference returns in its metadata."""
    from qrl.datasets.writers import write_d4rl_hdf5

    rng = np.random.default_rng(0)
    timeouts = np.zeros(steps, bool)
    timeouts[49::50] = True
    arrays = dict(observations=rng.normal(size=(steps, observation_size)).astype(np.float32),
                  actions=rng.uniform(-2.0, 2.0, size=(steps, 1)).astype(np.float32),
                  rewards=rng.normal(size=steps).astype(np.float32), terminals=np.zeros(steps, bool),
                  timeouts=timeouts)
    write_d4rl_hdf5(path, arrays, {"env_id": env_id, "ref_min_score": -1400.0, "ref_max_score": -200.0})


def _dataset(tmp):
    write_tiny_dataset(tmp / "data.hdf5")


def _dataset_and_file_at_run(tmp):
    _dataset(tmp)
    (tmp / "run").write_text("not a directory")


def _wide_dataset(tmp):
    write_tiny_dataset(tmp / "data.hdf5", observation_size=5)


def _discrete_env_dataset(tmp):
    write_tiny_dataset(tmp / "data.hdf5", env_id="gym:CartPole-v1")


_BASE = ("--dataset={tmp}/data.hdf5", "--workdir={tmp}/run", "--steps=20", "--eval_episodes=1", "--progress=false",
         "--set=hidden_sizes=16-16", "--set=batch_size=16", "--prune_batch_size=16")


def _case(name, fragment, *args, setup=_dataset):
    return Case("launch.prune_offline", name, _BASE + tuple(args), fragment, setup)


CASES = [
    _case("missing-dataset", "no such dataset", setup=None),
    _case("observation-size-mismatch", "dataset observations have 5 dims", setup=_wide_dataset),
    _case("discrete-env", "continuous actions", setup=_discrete_env_dataset),
    _case("workdir-is-a-file", "is not a directory", setup=_dataset_and_file_at_run),
    _case("unknown-algo", "unknown offline algorithm 'cql'", "--algo=cql"),
    _case("unknown-pruner", "unknown pruner 'snap'", "--pruner=snap"),
    _case("sparsity-one", "--sparsity must be in [0, 1)", "--sparsity=1"),
    _case("nan-sparsity", "--sparsity must be a finite number", "--sparsity=nan"),
    _case("zero-temperature", "--temperature must be > 0", "--temperature=0"),
    _case("zero-steps", "--steps must be >= 1", "--steps=0"),
    _case("negative-eval-every", "--eval_every must be >= 0", "--eval_every=-5"),
    _case("zero-eval-episodes", "--eval_episodes must be >= 1", "--eval_episodes=0"),
    _case("negative-min-kept", "--min_kept_per_layer must be >= 0", "--min_kept_per_layer=-1"),
    _case("nan-learning-rate", "learning_rate must be a finite number", "--set=learning_rate=nan"),
    _case("separate-names-no-network", "names no network", "--separate=vae/encoder"),
    _case("vae-option-without-a-vae", "vae=dense applies to agents with a VAE (bcq), not bc", "--vae=dense"),
    _case("scoring-batch-beyond-the-dataset", "prune_batch_size=5000 is larger than the dataset", "--prune_batch_size=5000"),
    _case("zero-iterations", "--iterations must be >= 1", "--iterations=0"),
    _case("iterations-for-random", "iterations (rounds of re-scoring) apply to snip and grasp, not random",
          "--pruner=random", "--iterations=2"),
    _case("temperature-for-snip", "temperature is a grasp option; snip does not take it", "--temperature=200"),
    _case("reinit-for-snip", "reinit is a grasp option; snip does not take it", "--reinit"),
    _case("masks-from-nowhere", "no masks.msgpack", "--masks_from={tmp}/nowhere"),
]
