"""Bad inputs to launch.make_dataset: every one refused before the SAC workdir or any output is written."""

import os

from tests.bad_input import Case, a_file

_BASE = ("--env=gym:Hopper-v5", "--level=medium", "--workdir={tmp}/behavior")
_D4RL = (*_BASE, "--out={tmp}/hopper-medium.hdf5")
_MINARI = (*_BASE, "--format=minari", "--out={tmp}/minari", "--overwrite")


def _case(name, fragment, *args, setup=None):
    return Case("launch.make_dataset", name, tuple(args), fragment, setup)


def _victim(tmp):
    """A directory beside the datasets root that a bad id must never reach."""
    os.makedirs(tmp / "minari")
    os.makedirs(tmp / "victim-v0")
    (tmp / "victim-v0" / "keep.txt").write_text("precious\n")


def _escaping_link(tmp):
    """`minari/qrl` is a link to a directory outside the datasets root."""
    _victim(tmp)
    os.symlink(tmp / "victim-v0", tmp / "minari" / "qrl")


def _existing_bundle(tmp):
    os.makedirs(tmp / "bundle")
    (tmp / "bundle" / "keep.txt").write_text("precious\n")


def _existing_output(tmp):
    (tmp / "hopper-medium.hdf5").write_bytes(b"an earlier dataset")


CASES = [
    _case("missing-flags", "--env, --level and --out are required"),
    _case("unknown-env", "NoSuchEnv", "--env=gym:NoSuchEnv-v0", "--level=random", "--out={tmp}/x.hdf5",
          "--workdir={tmp}/behavior"),
    _case("discrete-env", "continuous", "--env=gym:CartPole-v1", "--level=random", "--out={tmp}/x.hdf5",
          "--workdir={tmp}/behavior"),
    _case("unknown-level", "level", "--env=gym:Hopper-v5", "--level=hard", "--out={tmp}/x.hdf5"),
    _case("negative-size", "--size", *_D4RL, "--size=-5"),
    _case("dataset-id-dot-dot", "not a Minari id", *_MINARI, "--dataset_id=../victim-v0", setup=_victim),
    _case("dataset-id-absolute", "not a Minari id", *_MINARI, "--dataset_id={tmp}/victim-v0", setup=_victim),
    _case("dataset-id-outside-out", "resolves outside", *_MINARI, "--dataset_id=qrl/victim-v0",
          setup=_escaping_link),
    _case("d4rl-out-is-directory", "is a directory", *_BASE, "--out={tmp}"),
    _case("out-exists", "pass --overwrite", *_D4RL, setup=_existing_output),
    _case("minari-out-is-file", "is a file", *_BASE, "--format=minari", "--out={tmp}/afile", setup=a_file),
    _case("out-under-a-file", "which is not a directory", *_BASE, "--out={tmp}/afile/sub/x.hdf5", setup=a_file),
    _case("nan-medium-fraction", "--medium_fraction", *_D4RL, "--medium_fraction=nan"),
    _case("zero-num-envs", "--num_envs", *_D4RL, "--num_envs=0"),
    _case("negative-checkpoint-every", "--checkpoint_every", *_D4RL, "--checkpoint_every=-10"),
    _case("zero-sac-steps", "--sac_steps", *_D4RL, "--sac_steps=0"),
    _case("bundle-out-exists", "a bundle is written into a new directory", *_D4RL, "--bundle_out={tmp}/bundle",
          setup=_existing_bundle),
    _case("bundle-out-under-a-file", "which is not a directory", *_D4RL, "--bundle_out={tmp}/afile/bundle",
          setup=a_file),
]
