"""Every notebook in colabs/ runs top to bottom at its smoke budget (QRL_SMOKE=1).

Each notebook executes in a fresh ipykernel running this interpreter (the virtual environment's
Python, whatever kernelspecs the machine has installed), with the repository root as working
directory and on PYTHONPATH so `import agents` and `import qrl` work. A cell that raises fails the
test with that cell's source and traceback.
"""

import json
import os
import pathlib
import re
import sys

import nbformat
import pytest
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import AsyncKernelManager
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((REPO_ROOT / "colabs").glob("*.ipynb"))
KERNEL_NAME = "python3"
CELL_TIMEOUT_S = 300
ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")  # colours in IPython tracebacks.


def kernel_manager(kernels_dir: pathlib.Path) -> AsyncKernelManager:
    """A kernel manager whose only `python3` kernelspec launches `sys.executable`."""
    spec_dir = kernels_dir / KERNEL_NAME
    spec_dir.mkdir(parents=True)
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (qrl tests)",
        "language": "python",
    }
    (spec_dir / "kernel.json").write_text(json.dumps(spec))
    return AsyncKernelManager(
        kernel_name=KERNEL_NAME, kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(kernels_dir)])
    )


def kernel_env() -> dict:
    """This process's environment plus the smoke budget and the repository root on PYTHONPATH."""
    env = dict(os.environ)
    env["QRL_SMOKE"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    return env


def test_there_are_notebooks():
    assert NOTEBOOKS, "no notebooks found in colabs/"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[path.name for path in NOTEBOOKS])
def test_notebook_runs_at_smoke_budget(path, tmp_path):
    notebook = nbformat.read(path, as_version=4)
    client = NotebookClient(
        notebook,
        km=kernel_manager(tmp_path / "kernels"),
        kernel_name=KERNEL_NAME,
        timeout=CELL_TIMEOUT_S,
        resources={"metadata": {"path": str(REPO_ROOT)}},  # the kernel's working directory.
    )
    try:
        client.execute(env=kernel_env())
    except CellExecutionError as error:
        pytest.fail(f"{path.name} failed:\n{ANSI_ESCAPE.sub('', str(error))}", pytrace=False)
