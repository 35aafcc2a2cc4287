"""Smoke test of the ActorQ benchmark (`bench/actorq.py --quick`): every section prints its
ratios and the summary names the three targets."""

import json
import os
import subprocess
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_quick_benchmark_prints_ratios_and_targets(tmp_path):
    json_path = tmp_path / "actorq.json"
    completed = subprocess.run(
        [sys.executable, "-m", "bench.actorq", "--quick", f"--json={json_path}"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
    )

    assert completed.returncode == 0, completed.stderr[-3000:]
    output = completed.stdout
    actor_section = output.split("1. actor env steps/s")[1].split("2. bytes per publish")[0]
    assert actor_section.count("ratios: bf16/fp32") == 3
    assert actor_section.count("fp16/fp32") == 2  # the two paper-size configs
    assert actor_section.count("int8/fp32") == 3 and actor_section.count("int8@onnx/fp32") == 3
    assert "d4pg 300-200 dmc:cartpole-balance x1" in actor_section and "dqn 256-256 gym:CartPole-v1 x1" in actor_section
    assert "env " in actor_section and "inference " in actor_section and "other " in actor_section
    bytes_section = output.split("2. bytes per publish")[1].split("3. update at an actor")[0]
    assert "d4pg 300-200 int8/fp32 0." in bytes_section and "dqn 256-256 int8/fp32 0." in bytes_section
    update_section = output.split("3. update at an actor")[1].split("targets")[0]
    assert update_section.count("int8 -> int8") == 6 and update_section.count("int8 -> int8 (onnx)") == 3
    assert "speedup vs fp32 -> fp32 1.00×" in update_section
    assert "through Ray: skipped" in update_section
    summary = output.split("\ntargets\n")[1]
    for target in ("1a. actor env steps/s int8 (jax) / fastest fp32 >= 1.5×: ",
                   "1b. actor env steps/s int8 (onnx) / fastest fp32 >= 1.5×: ", "2. bytes per publish int8/fp32 <= 0.26: ",
                   "3. update (pull + deserialize + load) int8->int8 >= 3.0× faster"):
        line = next(line for line in summary.splitlines() if target in line)
        assert "PASS" in line or "MISS" in line

    results = json.loads(json_path.read_text())
    assert results["machine"]["isa_class"] and results["machine"]["cpu_count"] == os.cpu_count()
    assert [result["label"].split()[0] for result in results["actor"]] == ["d4pg", "dqn", "dqn"]
    assert all(values["steps_per_second"] > 0 for result in results["actor"] for values in result["precisions"].values())
    # DQN 4-256-256-2: 67,072 kernel and 514 bias values. fp16 halves every leaf; int8 keeps one
    # byte per kernel value plus an fp32 bias and an fp32 kernel scale per output unit:
    # (67,072 + 8 * 514) / (4 * 67,586) = 0.263 before msgpack's few bytes per leaf.
    paper_dqn = results["bytes"]["dqn 256-256"]
    cells = {(record["table"], record["row"], record["column"]): record for record in results["cells"]}
    assert cells[("bytes per publish", "dqn 256-256", "int8")]["ratio"] == paper_dqn["ratio_to_fp32"]["int8"]
    assert {record["table"] for record in results["cells"]} >= {"actor env steps/s", "bytes per publish",
                                                                 "update ms (speedup vs fp32 -> fp32)"}
    assert 0.49 < paper_dqn["ratio_to_fp32"]["fp16"] < 0.51
    assert 0.262 < paper_dqn["ratio_to_fp32"]["int8"] < 0.27
