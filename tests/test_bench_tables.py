"""`bench.tables` (the README's benchmark tables from stored JSON) and `bench.suite` (record a
machine kind's figures; `make bench-check`: what moved against them)."""

import json
import os
import subprocess
import sys

import pytest

from bench import machine, suite, tables

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def store(root, kind, bench, cells, cpu="Test CPU"):
    """A stored run of `bench` on a machine of `kind` under `root`."""
    directory = root / tables.kind_directory(kind)
    directory.mkdir(parents=True, exist_ok=True)
    record = {"cpu": cpu, "kind": kind, "load_average": [0.5, 0.4, 0.3], "time": "2026-12-07T10:00:00+00:00",
              "versions": {"jax": "0.0.test"}, "isa_class": kind.split(",")[0], "isa": [], "cpu_count": 2}
    (directory / f"{bench}.json").write_text(json.dumps({"cells": cells, "machine": record}))


def latency_cells(fp32, int8):
    return tables.grid("MLP latency", {"jax fp32": {1: fp32}, "jax int8": {1: int8}}, "µs",
                       {"jax fp32": {1: 1.0}, "jax int8": {1: int8 / fp32}}, lambda batch: f"batch {batch}")


def test_cells_and_numbers_are_formatted_as_the_readme_shows_them():
    record = tables.cell("t", "r", "c", 1234.56, "steps/s", 0.5)
    assert record == {"table": "t", "row": "r", "column": "c", "value": 1234.56, "unit": "steps/s", "ratio": 0.5}
    assert tables.format_cell(record) == "1,235 (0.50×)"
    assert [tables.format_number(value, "µs") for value in (3.14159, 31.4159, 314.159)] == ["3.14", "31.4", "314"]
    assert tables.format_number(1.2345, "×") == "1.23×" and tables.format_number(None, "µs") == "–"
    assert tables.kind_directory("AVX-512 VNNI+BF16, 2 cores") == "avx-512-vnni-bf16-2-cores"


def test_a_readme_region_is_rewritten_from_every_machine_kind_and_names_each_line_s_machine(tmp_path):
    store(tmp_path, "AVX2, 2 cores", "inference", latency_cells(20.0, 30.0), cpu="AMD EPYC")
    store(tmp_path, "AMX, 2 cores", "inference", latency_cells(10.0, 5.0), cpu="Intel Xeon")
    readme = tmp_path / "README.md"
    readme.write_text("intro\n<!-- bench-table: inference / MLP latency -->\nstale\n<!-- /bench-table -->\nend\n")
    assert tables.main([f"--readme={readme}", f"--results={tmp_path}", "--check"]) == 1
    assert tables.main([f"--readme={readme}", f"--results={tmp_path}"]) == 0
    text = readme.read_text()
    assert text.startswith("intro\n<!-- bench-table: inference / MLP latency -->\n| | batch 1 | machine |\n")
    assert text.endswith("<!-- /bench-table -->\nend\n") and "stale" not in text
    # amx-2-cores sorts before avx2-2-cores: each kind's rows, each naming its machine.
    assert "| jax int8 | 5.00 (0.50×) | AMX, 2 cores |" in text
    assert "| jax int8 | 30.0 (1.50×) | AVX2, 2 cores |" in text
    assert text.index("AMX, 2 cores |") < text.index("AVX2, 2 cores |")
    assert "*AVX2, 2 cores*: AMD EPYC, 2026-12-07, load 0.5, jax 0.0.test" in text
    assert tables.main([f"--readme={readme}", f"--results={tmp_path}", "--check"]) == 0
    tables.main([f"--readme={readme}", f"--results={tmp_path}"])
    assert readme.read_text() == text


@pytest.mark.parametrize("body, message", [
    ("<!-- bench-table: inference / CNN latency -->\n<!-- /bench-table -->\n", "no stored run of inference has a table"),
    ("<!-- bench-table: inference / MLP latency -->\nno end\n", "unbalanced bench-table markers"),
])
def test_a_region_that_cannot_be_generated_is_one_line_and_exit_2(tmp_path, capsys, body, message):
    store(tmp_path, "AVX2, 2 cores", "inference", latency_cells(20.0, 30.0))
    readme = tmp_path / "README.md"
    readme.write_text(body)
    assert tables.main([f"--readme={readme}", f"--results={tmp_path}"]) == 2
    error = capsys.readouterr().err
    assert message in error and error.count("\n") == 1
    assert readme.read_text() == body


def test_compare_reports_ratios_that_moved_beyond_the_tolerance_and_what_was_not_measured():
    stored = latency_cells(20.0, 30.0) + [tables.cell("DQN", "zoo", "qrl / sbx", 2.0, "×"),
                                          tables.cell("DQN", "zoo", "qrl steps/s", 1000.0, "steps/s"),
                                          tables.cell("DQN", "nature", "qrl / sbx", 3.0, "×")]
    fresh = latency_cells(10.0, 16.0) + [tables.cell("DQN", "zoo", "qrl / sbx", 2.2, "×"),
                                         tables.cell("DQN", "zoo", "qrl steps/s", 500.0, "steps/s")]
    moved, missing = suite.compare(stored, fresh, tolerance=0.15)
    # int8/fp32 went 1.50 -> 1.60 (+6.7%): not moved; 2.0 -> 2.2 (+10%): not moved; steps/s is absolute.
    assert moved == [] and missing == ["DQN / nature / qrl / sbx"]
    moved, _ = suite.compare(stored, fresh, tolerance=0.05)
    assert [(entry["row"], round(entry["change"], 3)) for entry in moved] == [("jax int8", 0.067), ("zoo", 0.1)]
    moved, _ = suite.compare(stored, fresh, tolerance=0.15, absolute=True)
    assert [(entry["column"], entry["change"]) for entry in moved] == [("qrl steps/s", -0.5)]


def test_check_against_a_fresh_directory_prints_what_moved_and_exits_1(tmp_path, capsys):
    kind = machine.record()["kind"]
    store(tmp_path / "stored", kind, "qat_overhead", [tables.cell("QAT", "qrl qat8", "update", 100.0, "µs", 1.2)])
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    (fresh / "qat_overhead.json").write_text(json.dumps({
        "cells": [tables.cell("QAT", "qrl qat8", "update", 90.0, "µs", 1.5)], "machine": machine.record()}))
    arguments = [f"--results={tmp_path / 'stored'}", f"--fresh={fresh}", "--check"]
    assert suite.main(arguments) == 1
    output = capsys.readouterr().out
    assert "qat_overhead:" in output and "1 moved by more than 15%" in output
    assert "QAT / qrl qat8 / update: 1.2 -> 1.5 (+25%)" in output
    assert suite.main(arguments + ["--tolerance=0.3"]) == 0


@pytest.mark.parametrize("arguments, message", [
    (["--check", "--tolerance=0"], "--tolerance must be in (0, 10)"),
    (["--check", "--benches=inference,nope"], "unknown benchmark(s) nope"),
    (["--record", "--fresh=."], "--fresh goes with --check"),
    (["--check", "--fresh=/no/such/dir"], "--fresh: no directory"),
    (["--check"], "no stored run of any benchmark for this machine kind"),
    (["--record", "--quick", f"--results={tables.RESULTS_ROOT}"], "--quick runs are smoke tests"),
])
def test_suite_bad_input_is_one_line_and_exit_2(tmp_path, capsys, arguments, message):
    if "--record" not in arguments or "--quick" not in arguments:
        arguments = arguments + [f"--results={tmp_path}"]
    assert suite.main(arguments) == 2
    error = capsys.readouterr().err
    assert message in error and error.count("\n") == 1
    assert list(tmp_path.iterdir()) == []


def test_record_then_render_end_to_end(tmp_path):
    """A quick recorded run of one benchmark lands under its machine kind and renders a README table."""
    results = tmp_path / "results"
    completed = subprocess.run([sys.executable, "-m", "bench.suite", "--record", "--quick", "--benches=qat_overhead",
                                f"--results={results}"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert completed.returncode == 0, completed.stderr[-2000:]
    stored = results / tables.kind_directory(machine.record()["kind"]) / "qat_overhead.json"
    run = tables.load_runs_file(str(stored))
    assert run["machine"]["kind"] == machine.record()["kind"]
    table = run["cells"][0]["table"]
    assert table == "QAT cost, MLP 256-256, batch 256"
    assert {(record["row"], record["column"]) for record in run["cells"]} >= {("fp32", "update"), ("qrl qat8", "update")}
    assert all(record["ratio"] == 1.0 for record in run["cells"] if record["row"] == "fp32")
    readme = tmp_path / "README.md"
    readme.write_text(f"<!-- bench-table: qat_overhead / {table} -->\n<!-- /bench-table -->\n")
    assert tables.main([f"--readme={readme}", f"--results={results}"]) == 0
    assert "| qrl qat8 | " in readme.read_text()
    completed = subprocess.run([sys.executable, "-m", "bench.suite", "--check", f"--fresh={results / stored.parent.name}",
                                f"--results={results}"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0 and "0 moved by more than 15%" in completed.stdout


def test_the_readme_tables_match_the_stored_runs():
    assert tables.main(["--check"]) == 0
