#!/usr/bin/env bash
# ActorQ on a GPU machine with many cores, in one bounded command: QuaRL's D4PG setup
# (--preset=quarl) on DM Control cartpole-balance, walker-stand and cheetah-run (the harder task),
# fp32 vs int8 actors in ONNX Runtime, the learner on the GPU, one actor per free core; then the
# study report (report.md, summary.json, plots) and the scale model calibrated on each task's
# cells (launch.actorq_scale: scale.json, projection.png).
#
#   bash bench/device/actorq.sh OUT [SECONDS_PER_CELL] [SEEDS]     # e.g. OUT=$OUT 100 0
#   bash bench/device/actorq.sh --dry-run OUT                       # print the commands only
#
# Needs a Python with qrl's requirements and JAX's CUDA backend (`make venv-cuda`; PYTHON
# overrides .venv/bin/python) and Ray (the cells run --launcher=ray, a process per node). Wall
# time: 3 tasks x 2 precisions x seeds x SECONDS_PER_CELL plus start-up (~20 s a cell) and the
# report: with the defaults (100 s, one seed) about 12 minutes.
set -euo pipefail
cd "$(dirname "$0")/../.."

dry_run=0
if [[ "${1:-}" == "--dry-run" ]]; then dry_run=1; shift; fi
bad_input() {
  echo "error: $1 (usage: bench/device/actorq.sh [--dry-run] OUT [SECONDS_PER_CELL] [SEEDS])" >&2
  exit 2
}
[[ -n "${1:-}" ]] || bad_input "OUT: give the directory for the reports"
out="$1"
seconds="${2:-100}"
seeds="${3:-0}"
[[ "$seconds" =~ ^[1-9][0-9]*$ ]] || bad_input "SECONDS_PER_CELL must be a positive integer, got '$seconds'"
[[ "$seeds" =~ ^[0-9]+(,[0-9]+)*$ ]] || bad_input "SEEDS must be a comma-separated list of integers, got '$seeds'"
python="${PYTHON:-.venv/bin/python}"
cores="$(nproc)"
# The learner, the replay/broadcaster/counter and the evaluator keep three cores; one actor per core left.
actors=$(( cores > 4 ? cores - 3 : 1 ))

declare -A targets=(["dmc:cartpole-balance"]=800 ["dmc:walker-stand"]=800 ["dmc:cheetah-run"]=400)
run() {
  echo "+ $*"
  if [[ $dry_run == 0 ]]; then "$@"; fi
}

if [[ $dry_run == 0 ]]; then
  mkdir -p "$out"
  "$python" - <<'PY' | tee "$out/machine.txt"
import os, platform, jax
print("cpu:", platform.processor() or platform.machine(), "cores:", os.cpu_count())
print("jax", jax.__version__, "devices:", jax.devices())
assert jax.devices("gpu"), "no GPU visible to JAX: install JAX's CUDA backend (make venv-cuda)"
PY
fi

for env in "dmc:cartpole-balance" "dmc:walker-stand" "dmc:cheetah-run"; do
  slug="${env//:/_}"
  run "$python" -m launch.actorq_study --launcher=ray --agent=d4pg --envs="$env" --precisions=fp32,int8 \
    --seeds="$seeds" --target_return="${targets[$env]}" --max_seconds="$seconds" --workdir="$out/$slug" \
    --run_flag=--preset=quarl --run_flag=--learner_device=gpu --run_flag=--actor_runtime=onnx \
    --run_flag=--num_actors="$actors" --run_flag=--learner_cpus=1 --run_flag=--eval_every_seconds=10 \
    --run_flag=--eval_episodes=3
  first_seed="${seeds%%,*}"
  run "$python" -m launch.actorq_scale \
    --profile="$out/$slug/cells/${slug/:/_}/fp32/seed$first_seed,$out/$slug/cells/${slug/:/_}/int8/seed$first_seed" \
    --cores="$cores" --actors=1,2,4,8,16,32,64,128 --out="$out/$slug/scale"
done
