"""Bad inputs to launch.prune_ablation: each case varies one flag of a tiny valid ablation."""

from tests.bad_input import Case
from tests.bad_inputs.prune_offline import write_tiny_dataset


def _dataset(tmp):
    write_tiny_dataset(tmp / "data.hdf5")


_BASE = ("--datasets={tmp}/data.hdf5", "--workdir={tmp}/ablation", "--algos=bc", "--pruners=snip", "--seeds=0",
         "--steps=5", "--eval_episodes=1", "--progress=false", "--scoring=16x1,32x1", "--baseline=16x1",
         "--iterations=2", "--set=bc.hidden_sizes=8", "--set=bc.batch_size=8")


def _case(name, fragment, *args, setup=_dataset):
    return Case("launch.prune_ablation", name, _BASE + tuple(args), fragment, setup)


CASES = [
    _case("malformed-scoring", "--scoring takes <batch size>x<batches>", "--scoring=16y1"),
    _case("zero-batches", "--scoring takes <batch size>x<batches> with both >= 1", "--scoring=16x0,16x1"),
    _case("baseline-not-an-arm", "--baseline=64x1 must be one of --scoring", "--baseline=64x1"),
    _case("one-round-is-no-iteration", "--iterations values must be >= 2", "--iterations=1"),
    _case("data-free-pruner", "--pruners takes snip and grasp, not random", "--pruners=random"),
    _case("scoring-batch-beyond-the-dataset", "prune_batch_size=5000 is larger than the dataset",
          "--scoring=16x1,5000x1"),
    _case("sparsity-one", "--sparsity must be in (0, 1)", "--sparsity=1"),
    _case("vae-without-a-vae", "--vae applies to agents with a VAE", "--vae=dense"),
    _case("no-parallel-workers", "--parallel must be >= 1", "--parallel=0"),
    _case("ray-address-without-ray", "--ray_address needs --launcher=ray", "--ray_address=127.0.0.1:1"),
]
