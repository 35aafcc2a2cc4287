"""Every entry point refuses every bad input in its table with one line and exit status 2,
before writing anything (see tests/bad_input.py for the contract, tests/bad_inputs/ for the
tables)."""

import importlib
import pkgutil

import pytest

from tests import bad_inputs
from tests.bad_input import run_case

ENTRY_POINTS = ("actorq", "actorq_study", "dataset_info", "demo", "export", "make_dataset", "prune_offline",
                "prune_study", "ptq", "quarl_study", "train")
MIN_CASES_PER_ENTRY_POINT = 10


def _tables() -> dict:
    names = sorted(info.name for info in pkgutil.iter_modules(bad_inputs.__path__))
    return {name: importlib.import_module(f"tests.bad_inputs.{name}").CASES for name in names}


TABLES = _tables()
CASES = [case for cases in TABLES.values() for case in cases]


def test_every_entry_point_has_a_table_of_at_least_ten_cases():
    counts = {name: len(TABLES.get(name, ())) for name in ENTRY_POINTS}
    assert all(count >= MIN_CASES_PER_ENTRY_POINT for count in counts.values()), counts


def test_case_names_are_unique():
    ids = [case.id for case in CASES]
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_bad_input_is_one_line_and_exit_2_with_nothing_written(case, tmp_path):
    run_case(case, tmp_path)
