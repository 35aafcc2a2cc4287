"""The machine a benchmark ran on, written into every benchmark's JSON output.

int8 and bf16 ratios depend on the CPU's matrix units (AMX, AVX-512 VNNI / BF16, or AVX2 only),
and machines of one size differ from run to run, so a figure without its machine is not a
result. `record()` names the CPU model, its ISA class and flags, cores, load, and the JAX / XLA
setup; `kind()` is the ISA class and core count that results of the same kind are compared
within. Imports nothing heavy (versions come from package metadata), so peer processes that
must not load JAX can use it.
"""

import datetime
import json
import os
import platform
from importlib import metadata
from typing import Any, Mapping, Optional

from qrl.cpu import cpu_info, isa_class

# The flags that decide int8 / bf16 speed on x86, in the order they are reported.
ISA_FLAGS = ("amx_int8", "amx_bf16", "avx512_vnni", "avx512_bf16", "avx_vnni", "avx512f", "avx2")
PACKAGES = ("jax", "jaxlib", "onnxruntime", "numpy")


def kind(isa: str, cpu_count: Optional[int]) -> str:
    """The machine kind results are compared within: "<ISA class>, <n> cores"."""
    return f"{isa}, {cpu_count or '?'} cores"


def _version(package: str) -> Optional[str]:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def record(threads: Optional[int] = None) -> dict:
    """This machine: `{"cpu", "isa_class", "isa", "cpu_count", "kind", "load_average", "threads",
    "xla_flags", "versions", "platform", "time"}`; `threads`: the XLA / runtime threads the
    benchmark used where it chose them."""
    model, flags = cpu_info()
    klass = isa_class(flags)
    return {
        "cpu": model or platform.processor() or platform.machine(),
        "isa_class": klass,
        "isa": [flag for flag in ISA_FLAGS if flag in (flags or set())],
        "cpu_count": os.cpu_count(),
        "kind": kind(klass, os.cpu_count()),
        "load_average": [round(value, 2) for value in os.getloadavg()] if hasattr(os, "getloadavg") else None,
        "threads": threads,
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "versions": {package: _version(package) for package in PACKAGES},
        "platform": platform.platform(),
        "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def describe(machine: Mapping[str, Any]) -> str:
    """One line for a benchmark's printout: "AMD EPYC (AVX2: avx2; 2 cores, load 1.9)"."""
    load = machine.get("load_average") or [float("nan")]
    return (f"{machine['cpu']} ({machine['isa_class']}: {', '.join(machine['isa']) or 'no listed flags'}; "
            f"{machine['cpu_count']} cores, load {load[0]:.1f})")


def write_json(path: str, results: Mapping[str, Any], threads: Optional[int] = None,
               cells: Optional[list] = None) -> None:
    """Writes `results` to `path` atomically, in the order they were measured, with this
    machine's `record` under "machine" (a machine the benchmark recorded itself, at its start, is
    kept) and the headline figures `cells` (`bench.tables.cell` records: what the README's tables
    and `make bench-check` read)."""
    from qrl.io import atomic_write_text, to_json_compatible

    results = {**results, "cells": list(cells or []), "machine": results.get("machine") or record(threads)}
    atomic_write_text(path, json.dumps(to_json_compatible(results), indent=2) + "\n")
