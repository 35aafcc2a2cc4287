"""Bad inputs to launch.export: run directories that are not runs, bad schemes, bad output paths."""

from tests.bad_input import Case, a_file
from tests.bad_inputs.ptq import _DQN_RUN, _empty_run_dir, _file_at_run, _run_dir

_W = "--workdir={tmp}/run"
_OUT = "--out={tmp}/policy.onnx"


def _dqn_run_and_file(tmp):
    _DQN_RUN(tmp)
    a_file(tmp)


def _dqn_run_and_directory_at_out(tmp):
    _DQN_RUN(tmp)
    (tmp / "policy.onnx").mkdir()


def _offline_run_without_its_dataset(tmp):
    """A launch.prune_offline run directory whose dataset file is gone."""
    from qrl import workdirs

    _run_dir({"algo": "bc", "env": "gym:Pendulum-v1", "agent_config": {}, "dataset": str(tmp / "gone.hdf5")})(tmp)
    workdirs.write_marker(str(tmp / "run"), "prune_offline", ["config.json"])


def _case(name, fragment, *args, setup=_DQN_RUN):
    return Case("launch.export", name, tuple(args), fragment, setup)


CASES = [
    _case("no-workdir", "--workdir is required", _OUT, setup=None),
    _case("missing-workdir", "does not exist", _W, _OUT, setup=None),
    _case("workdir-is-a-file", "is not a directory", _W, _OUT, setup=_file_at_run),
    _case("no-config", "has no config.json", _W, _OUT, setup=_empty_run_dir),
    _case("corrupt-config", "corrupt JSON", _W, _OUT, setup=_run_dir("{not json")),
    _case("no-checkpoint", "checkpoint", _W, _OUT),
    _case("no-out", "--out is required", _W),
    _case("out-directory-missing", "does not exist", _W, "--out={tmp}/absent/policy.onnx"),
    _case("out-under-a-file", "does not exist", _W, "--out={tmp}/afile/policy.onnx", setup=_dqn_run_and_file),
    _case("out-is-a-directory", "is a directory", _W, _OUT, setup=_dqn_run_and_directory_at_out),
    _case("unknown-precision", "unknown precision 'fp8'", _W, _OUT, "--precision=fp8"),
    _case("precision-list", "one scheme, not a list", _W, _OUT, "--precision=int8,fp16"),
    _case("edge-bits-on-weight-only", "takes no modifiers", _W, _OUT, "--precision=quarl4-e8"),
    _case("zero-probe-steps", "--probe_steps must be >= 1", _W, _OUT, "--probe_steps=0"),
    _case("unknown-ranges", "--ranges", _W, _OUT, "--ranges=guess"),
    _case("offline-dataset-gone", "gone.hdf5, which no longer exists", _W, _OUT, setup=_offline_run_without_its_dataset),
    _case("offline-trained-ranges", "is an offline run", _W, _OUT, "--ranges=trained",
          setup=_offline_run_without_its_dataset),
]
