"""The README's benchmark tables, generated from the benchmarks' JSON files.

Every benchmark that writes `--json` also writes `cells`: its headline figures as flat records
`{"table", "row", "column", "value", "unit", "ratio"}` (`ratio`: to the table's reference, e.g.
fp32 at the same batch, or None). Stored runs live in `results/bench/<machine kind>/<bench>.json`
(`bench.suite --record` writes them), so each machine kind keeps its own figures. A README region

    <!-- bench-table: inference / MLP latency -->
    ...
    <!-- /bench-table -->

is rewritten from every stored run of that benchmark: one line per row and machine kind, the
machine named on every line, and under the table which CPU, day and load each kind was measured
on.

    python -m bench.tables            # rewrite README.md's benchmark tables
    python -m bench.tables --check    # exit 1 when README.md's tables differ from the stored runs
"""

import argparse
import json
import os
import re
import sys
from typing import Any, Callable, Iterable, Mapping, Optional

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS_ROOT = os.path.join(REPO_ROOT, "results", "bench")
RATIO_UNIT = "×"
MARKER = re.compile(r"<!-- bench-table: (?P<bench>[\w.-]+) / (?P<table>[^>]+?) -->\n(?P<body>.*?)<!-- /bench-table -->",
                    re.DOTALL)


class TableError(ValueError):
    """A README region that cannot be generated: no stored run has its table, or a marker is open."""


def cell(table: str, row: str, column: str, value: Optional[float], unit: str,
         ratio: Optional[float] = None) -> dict:
    """One headline figure: `value` in `unit` ("µs", "steps/s", "×" for a ratio, ...) at
    (`table`, `row`, `column`), with its `ratio` to the table's reference where there is one."""
    return {"table": table, "row": row, "column": column,
            "value": None if value is None else float(value), "unit": unit,
            "ratio": None if ratio is None else float(ratio)}


def grid(table: str, values: Mapping[str, Mapping[Any, float]], unit: str,
         ratios: Optional[Mapping[str, Mapping[Any, float]]] = None,
         column: Callable[[Any], str] = str) -> list[dict]:
    """Cells of a `values[row][key]` table (with `ratios[row][key]` where given); `column(key)`
    names the column."""
    cells = []
    for row, row_values in values.items():
        for key, value in row_values.items():
            ratio = (ratios or {}).get(row, {}).get(key)
            cells.append(cell(table, row, column(key), value, unit, ratio))
    return cells


def kind_directory(kind: str) -> str:
    """A machine kind as a directory name: "AVX-512 VNNI+BF16, 2 cores" -> "avx-512-vnni-bf16-2-cores"."""
    return re.sub(r"[^a-z0-9]+", "-", kind.lower()).strip("-")


def load_runs_file(path: str) -> dict:
    """One stored or fresh run: `{"bench", "machine", "cells", "path"}`."""
    with open(path, encoding="utf-8") as file:
        payload = json.load(file)
    name = os.path.basename(path)
    return {"bench": name[:-len(".json")] if name.endswith(".json") else name,
            "machine": payload.get("machine") or {}, "cells": payload.get("cells") or [], "path": path}


def load_runs(root: str = RESULTS_ROOT) -> list[dict]:
    """Every stored run under `root`: `{"bench", "machine", "cells", "path"}`, ordered by machine
    kind directory, then benchmark."""
    runs = []
    if not os.path.isdir(root):
        return runs
    for kind in sorted(os.listdir(root)):
        directory = os.path.join(root, kind)
        if not os.path.isdir(directory):
            continue
        for name in sorted(os.listdir(directory)):
            if name.endswith(".json"):
                runs.append(load_runs_file(os.path.join(directory, name)))
    return runs


def format_number(value: Optional[float], unit: str) -> str:
    """3 significant figures or more (thousands separated), "×" after ratios, "–" for None."""
    if value is None:
        return "–"
    if unit == RATIO_UNIT:
        return f"{value:.2f}×"
    magnitude = abs(value)
    if magnitude >= 100:
        return f"{value:,.0f}"
    return f"{value:.1f}" if magnitude >= 10 else f"{value:.2f}"


def format_cell(record: Mapping[str, Any]) -> str:
    text = format_number(record["value"], record["unit"])
    if record.get("ratio") is not None:
        text += f" ({record['ratio']:.2f}×)"
    return text


def _ordered(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(items))


def render_table(bench: str, table: str, runs: list[dict]) -> str:
    """The markdown of `bench`'s `table` over every stored run of it (one line per row and machine
    kind; columns in the order measured), and a line per machine kind naming what ran it."""
    measured = [(run, [record for record in run["cells"] if record["table"] == table])
                for run in runs if run["bench"] == bench]
    measured = [(run, records) for run, records in measured if records]
    if not measured:
        raise TableError(f"no stored run of {bench} has a table {table!r} (record one: python -m bench.suite "
                         f"--record --benches={bench})")
    columns = _ordered(record["column"] for _, records in measured for record in records)
    lines = ["| | " + " | ".join(columns) + " | machine |", "|---|" + "---|" * len(columns) + "---|"]
    for run, records in measured:
        by_position = {(record["row"], record["column"]): record for record in records}
        kind = run["machine"].get("kind", "unknown machine")
        for row in _ordered(record["row"] for record in records):
            texts = [format_cell(by_position[(row, column)]) if (row, column) in by_position else "" for column in columns]
            lines.append(f"| {row} | " + " | ".join(texts) + f" | {kind} |")
    lines.append("")
    for run, _ in measured:
        machine = run["machine"]
        load = (machine.get("load_average") or ["?"])[0]
        versions = machine.get("versions") or {}
        lines.append(f"*{machine.get('kind', 'unknown machine')}*: {machine.get('cpu', '?')}, "
                     f"{str(machine.get('time', '?'))[:10]}, load {load}, jax {versions.get('jax', '?')} "
                     f"(`{os.path.relpath(run['path'], REPO_ROOT)}`).")
    return "\n".join(lines) + "\n"


def rewrite(text: str, runs: list[dict]) -> tuple[str, list[str]]:
    """`text` with every bench-table region regenerated, and the names of the regions that changed."""
    changed = []

    def replace(match: re.Match) -> str:
        body = render_table(match["bench"], match["table"].strip(), runs)
        if body != match["body"]:
            changed.append(f"{match['bench']} / {match['table'].strip()}")
        return f"<!-- bench-table: {match['bench']} / {match['table']} -->\n{body}<!-- /bench-table -->"

    opened, closed = text.count("<!-- bench-table:"), text.count("<!-- /bench-table -->")
    if opened != closed or opened != len(MARKER.findall(text)):
        raise TableError(f"unbalanced bench-table markers: {opened} opened, {closed} closed")
    return MARKER.sub(replace, text), changed


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--readme", default=os.path.join(REPO_ROOT, "README.md"))
    parser.add_argument("--results", default=RESULTS_ROOT, help="stored runs: <results>/<machine kind>/<bench>.json")
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 when a table is out of date")
    args = parser.parse_args(argv)
    if not os.path.isfile(args.readme):
        print(f"error: no README at {args.readme}", file=sys.stderr)
        return 2
    with open(args.readme, encoding="utf-8") as file:
        text = file.read()
    try:
        new_text, changed = rewrite(text, load_runs(args.results))
    except (TableError, json.JSONDecodeError, KeyError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.check:
        for name in changed:
            print(f"out of date: {name}")
        return 1 if changed else 0
    if changed:
        from qrl.io import atomic_write_text

        atomic_write_text(args.readme, new_text)
    print(f"{len(changed)} table(s) rewritten" + (f": {', '.join(changed)}" if changed else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
