"""`bench.machine`: the machine record every benchmark's JSON carries, and its ISA classes."""

import json
import os

import pytest

from bench import machine
from qrl.cpu import cpu_info


@pytest.mark.parametrize("flags, expected", [
    ({"sse2", "avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_int8", "amx_bf16"}, "AMX"),
    ({"sse2", "avx2", "avx512f", "avx512_vnni", "avx512_bf16"}, "AVX-512 VNNI+BF16"),
    ({"sse2", "avx2", "avx512f", "avx512_vnni"}, "AVX-512 VNNI"),
    ({"sse2", "avx2", "avx512f"}, "AVX-512"),
    ({"sse2", "avx2", "avx_vnni"}, "AVX-VNNI"),
    ({"sse2", "avx2", "fma"}, "AVX2"),
    ({"sse2"}, "other x86"),
    (set(), "unknown"),
    (None, "unknown"),
])
def test_isa_class_names_the_units_that_set_int8_and_bf16_speed(flags, expected):
    assert machine.isa_class(flags) == expected


def test_record_names_this_machine():
    model, flags = cpu_info()
    host = machine.record(threads=2)
    assert host["isa_class"] == machine.isa_class(flags)
    assert host["kind"] == f"{host['isa_class']}, {os.cpu_count()} cores"
    assert host["isa"] == [flag for flag in machine.ISA_FLAGS if flag in (flags or set())]
    assert host["cpu"] == (model or host["cpu"]) and host["cpu"]
    assert host["threads"] == 2 and len(host["load_average"]) == 3
    assert host["versions"]["jax"] and host["versions"]["numpy"]
    assert machine.describe(host).startswith(f"{host['cpu']} ({host['isa_class']}: ")


def test_write_json_adds_the_machine_and_keeps_one_recorded_at_the_start(tmp_path):
    path = tmp_path / "bench.json"
    machine.write_json(str(path), {"rows": [1, 2]}, threads=1)
    written = json.loads(path.read_text())
    assert written["rows"] == [1, 2] and written["machine"]["threads"] == 1 and written["cells"] == []
    early = {"cpu": "recorded before the run", "kind": "AVX2, 2 cores"}
    machine.write_json(str(path), {"rows": [], "machine": early})
    assert json.loads(path.read_text())["machine"] == early
    assert [entry.name for entry in tmp_path.iterdir()] == ["bench.json"]


def test_every_benchmark_that_writes_json_writes_it_with_its_machine():
    """A benchmark with a --json flag writes through `machine.write_json` with its headline cells,
    so no figure leaves without its machine and every one can reach the README's tables."""
    bench_dir = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench")
    writers = []
    for name in sorted(os.listdir(bench_dir)):
        if name.endswith(".py"):
            source = open(os.path.join(bench_dir, name), encoding="utf-8").read()
            if '"--json"' in source:
                writers.append(name)
                assert "write_json(args.json" in source, f"bench/{name} writes --json without its machine"
                assert "cells=" in source, f"bench/{name} writes --json without its headline cells (bench.tables)"
    assert len(writers) >= 10
