"""Bad inputs to launch.prune_study: each case varies one flag of a study of a tiny valid
dataset; all are refused before study.json or any cell is written."""

from tests.bad_input import Case
from tests.bad_inputs.prune_offline import write_tiny_dataset


def _dataset(tmp):
    write_tiny_dataset(tmp / "data.hdf5")


def _dataset_and_file_at_study(tmp):
    _dataset(tmp)
    (tmp / "study").write_text("not a directory")


def _wide_dataset(tmp):
    write_tiny_dataset(tmp / "data.hdf5", observation_size=5)


def _unknown_env_dataset(tmp):
    write_tiny_dataset(tmp / "data.hdf5", env_id="gym:NoSuchEnv-v0")


_BASE = ("--datasets={tmp}/data.hdf5", "--workdir={tmp}/study", "--algos=bc", "--pruners=snip", "--sparsities=0.9",
         "--seeds=0", "--steps=20", "--eval_episodes=1", "--progress=false", "--prune_batch_size=16",
         "--set=bc.hidden_sizes=16-16", "--set=bc.batch_size=16")


def _case(name, fragment, *args, setup=_dataset):
    return Case("launch.prune_study", name, _BASE + tuple(args), fragment, setup)


CASES = [
    _case("missing-dataset", "no such dataset", setup=None),
    _case("vae-option-without-a-vae", "--vae applies to agents with a VAE (bcq); --algos has none: bc", "--vae=dense"),
    _case("scoring-batch-beyond-the-dataset", "prune_batch_size=5000 is larger than the dataset",
          "--prune_batch_size=5000"),
    _case("zero-iterations", "--iterations must be >= 1", "--iterations=0"),
    _case("temperature-without-grasp", "--temperature and --reinit are grasp options", "--temperature=200"),
    _case("negative-temperature", "--temperature must be > 0", "--pruners=grasp", "--temperature=-1"),
    _case("observation-size-mismatch", "dataset observations have 5 dims", setup=_wide_dataset),
    _case("dataset-names-unknown-env", "NoSuchEnv", setup=_unknown_env_dataset),
    _case("workdir-is-a-file", "is not a directory", setup=_dataset_and_file_at_study),
    _case("workdir-under-a-file", "which is not a directory", "--workdir={tmp}/study/inner",
          setup=_dataset_and_file_at_study),
    _case("unknown-algo", "unknown offline algorithm 'cql'", "--algos=cql"),
    _case("unknown-pruner", "unknown pruner 'snap'", "--pruners=snap"),
    _case("sparsity-one", "sparsity must be in [0, 1)", "--sparsities=0,1"),
    _case("nan-sparsity", "sparsity must be in [0, 1)", "--sparsities=nan"),
    _case("negative-seed", "--seeds values must be >= 0", "--seeds=-1"),
    _case("zero-steps", "--steps must be >= 1", "--steps=0"),
    _case("negative-eval-every", "--eval_every must be >= 0", "--eval_every=-1"),
    _case("zero-prune-batches", "--prune_batches must be >= 1", "--prune_batches=0"),
    _case("nan-override", "learning_rate must be a finite number", "--set=bc.learning_rate=nan"),
    _case("zero-hidden-sizes", "hidden_sizes must be positive layer widths", "--set=bc.hidden_sizes=0-0"),
    Case("launch.prune_study", "separate-names-no-sub-network", (
        "--datasets={tmp}/data.hdf5", "--workdir={tmp}/study", "--algos=bcq", "--pruners=snip", "--sparsities=0.9",
        "--seeds=0", "--steps=20", "--progress=false", "--prune_batch_size=16", "--separate=vae/nope"),
        "names no sub-network", _dataset),
]
