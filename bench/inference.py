"""Inference latency of the MLP and Nature-CNN policies at fp32, bf16 and real int8 (static and
dynamic activation scales), with ONNX Runtime and numpy as out-of-process peers for the MLP.

    .venv/bin/python -m bench.inference [--quick] [--json=PATH] [--cnn_4096] [--no_onnx] [--no_export]

Every JAX candidate is jitted and takes its parameters as arguments (as an actor that pulls
weights does); inputs live on the device. Candidates are timed round-robin in one process and
reported as medians over rounds with their ratio to fp32 at the same batch size: absolute times
on this shared machine move between runs, ratios measured side by side do not (DESIGN.md §3).
ONNX Runtime and numpy run in a separate process (`bench/onnx_peer.py`; timing them beside JAX
inflates them, DESIGN.md §6) on the same weights, passed through a temporary .npz file.

Models: MLP 17 -> 256 -> 256 -> 6 (ReLU, no final activation) on float observations, and the
Nature CNN torso ([B, 84, 84, 4] uint8 frames -> 512) with a 6-action `qrl.networks.Dense` head.

Exported policies (`--no_export` skips them): the MLPs of the study (256-256), ActorQ's D4PG
(300-200) and QuaRL's 2048-2048-2048, and the Nature CNN, exported by `qrl.deploy` at fp32,
int8 (static scales), int8-dyn and quarl_dyn8 in this process, then timed by ONNX Runtime in
the peer process (`bench/onnx_peer.py --models`) at batch 1, 8, 32 with each model's schemes
interleaved, plus p50/p99 of single batch-1 calls. Targets: int8 <= 0.5x the exported fp32 at
batch 1 for the 2048-wide policy, <= 1x for the small ones. The MLPs are also exported pruned
(95% of every kernel zero, `-pruned95`, stored as ONNX sparse initializers) and timed by ONNX
Runtime (which densifies them), by qrl's CSR runtime (`+csr`, `qrl.deploy.csr_runtime`) and as
per-layer gathers of the kept inputs (`+ell`); JAX's dense and BCSR forms of the same pruned
kernels run in this process. Target: the pruned policy's best runtime <= 0.5x the dense fp32
export at batch 1.

Two times per candidate: wall time (the latency; the targets use it) and the CPU time of the
process per call, which leaves out waiting for a core and so stays steadier on a loaded machine
(it counts every thread: above wall time means the call ran on several threads).

Threading knobs, read when JAX starts its CPU backend: async dispatch off by default (an actor's
per-call latency: ≈11 µs instead of 35-55 µs for the batch-1 MLP here); `--xla_threads=1`
(PJRT_NPROC) keeps XLA's int8 (YNNPACK) kernels on one thread, which made int8 faster than fp32
from batch 32 on this 2-vCPU machine; `--single_thread_eigen` changed nothing measurable.
"""

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

from bench.timing import interleaved_medians

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MLP_INPUT_SIZE = 17
MLP_LAYER_SIZES = (256, 256, 6)
CNN_FRAME_SHAPE = (84, 84, 4)
NUM_ACTIONS = 6
CALIBRATION_SIZE = 1024
CNN_CALIBRATION_SIZE = 64
PRECISIONS = ("fp32", "bf16", "int8-static", "int8-dynamic")
HOST_IO_CANDIDATE = "fp32 numpy-io"
SINGLE_THREAD_EIGEN_FLAG = "--xla_cpu_multi_thread_eigen=false"
# (model, batch, bound on int8 latency / fp32 latency).
INT8_TARGETS = (("mlp", 4096, 0.65), ("cnn", 32, 0.5))
JAX_OVER_ORT_BATCH1_TARGET = 2.0
# Exported policies (qrl.deploy), timed by ONNX Runtime in the peer process: name -> MLP layer
# sizes on 17 float features, or "cnn" (the Nature CNN above).
EXPORT_MODELS = {"mlp 256-256": (256, 256, 6), "d4pg 300-200": (300, 200, 6), "mlp 2048-2048-2048": (2048, 2048, 2048, 6),
                 "nature-cnn": "cnn"}
QUICK_EXPORT_MODELS = ("mlp 256-256",)
EXPORT_SCHEMES = ("fp32", "int8", "int8-dyn", "quarl_dyn8")
# The MLPs are also exported pruned: every kernel keeps a random PRUNED_DENSITY of its weights
# (latency depends on the kept count, not on which weights), at these schemes. ONNX Runtime runs
# them densified; the peer also runs them with qrl's CSR runtime ("+csr") and, for fp32, as a
# gather of the kept inputs per layer ("+ell"); JAX's BCSR runs in this process.
PRUNED_DENSITY = 0.05
PRUNED_SCHEMES = ("fp32", "int8")
PRUNED_SUFFIX = "-pruned95"
# (model, scheme, batch, bound on exported latency / exported fp32 latency).
EXPORT_TARGETS = (("mlp 2048-2048-2048", "int8", 1, 0.5), ("mlp 256-256", "int8", 1, 1.0), ("d4pg 300-200", "int8", 1, 1.0),
                  ("mlp 2048-2048-2048", "fp32-pruned95+csr", 1, 0.5), ("mlp 256-256", "fp32-pruned95+csr", 1, 0.5),
                  ("d4pg 300-200", "fp32-pruned95+csr", 1, 0.5))
FULL_DEFAULTS = {"rounds": 20, "round_seconds": 0.01, "mlp_batches": "1,32,256,4096", "cnn_batches": "1,32,256",
                 "export_batches": "1,8,32"}
QUICK_DEFAULTS = {"rounds": 3, "round_seconds": 0.005, "mlp_batches": "1,32", "cnn_batches": "1", "export_batches": "1"}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="defaults for a smoke test: 3 short rounds, MLP batches 1,32, CNN batch 1"
    )
    parser.add_argument("--json", default=None, help="also write the results to this JSON file")
    parser.add_argument("--rounds", type=int, default=None, help="round-robin rounds per batch size (20)")
    parser.add_argument("--round_seconds", type=float, default=None, help="time of one candidate's turn (0.01)")
    parser.add_argument("--mlp_batches", default=None, help="comma-separated (1,32,256,4096)")
    parser.add_argument("--cnn_batches", default=None, help="comma-separated (1,32,256)")
    parser.add_argument("--cnn_4096", action="store_true", help="also time the CNN at batch 4096 (slow)")
    parser.add_argument("--no_onnx", action="store_true", help="skip the ONNX Runtime / numpy peer process")
    parser.add_argument("--no_export", action="store_true", help="skip the exported policies (qrl.deploy) under ORT")
    parser.add_argument("--export_batches", default=None, help="batch sizes of the exported policies (1,8,32)")
    parser.add_argument(
        "--peer_python",
        default=sys.executable,
        help="interpreter for bench/onnx_peer.py (one with onnx, onnxruntime, numpy; e.g. .venv-bench/bin/python)",
    )
    parser.add_argument(
        "--ort_threads", type=int, default=1, help="ORT intra-op threads per session (0: ORT's default, one per core)"
    )
    parser.add_argument(
        "--single_thread_eigen",
        action=argparse.BooleanOptionalAction,
        default=False,
        help=f"add {SINGLE_THREAD_EIGEN_FLAG} to XLA_FLAGS before JAX starts",
    )
    parser.add_argument(
        "--xla_threads",
        type=int,
        default=0,
        help="size of XLA:CPU's intra-op thread pool (sets PJRT_NPROC before JAX starts); 0: one per core",
    )
    parser.add_argument(
        "--async_dispatch",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="jax_cpu_enable_async_dispatch (off by default: per-call latency, as in an actor loop)",
    )
    args = parser.parse_args(argv)
    defaults = QUICK_DEFAULTS if args.quick else FULL_DEFAULTS
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    args.mlp_batches = _batch_list(args.mlp_batches)
    args.export_batches = _batch_list(args.export_batches)
    args.cnn_batches = _batch_list(args.cnn_batches) + ([4096] if args.cnn_4096 else [])
    return args


def _batch_list(text: str) -> list[int]:
    return sorted({int(item) for item in str(text).split(",") if item.strip()})


def configure_jax(args: argparse.Namespace):
    """Sets XLA_FLAGS and PJRT_NPROC (read when JAX starts its CPU backend), imports jax and
    applies the dispatch mode."""
    if args.xla_threads > 0:
        os.environ["PJRT_NPROC"] = str(args.xla_threads)
    if args.single_thread_eigen and SINGLE_THREAD_EIGEN_FLAG not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {SINGLE_THREAD_EIGEN_FLAG}".strip()
    import jax

    jax.config.update("jax_cpu_enable_async_dispatch", args.async_dispatch)
    return jax


def build_models(precision_name: str):
    """(precision, {"mlp": module, "cnn": module}) for a precision named as in `PRECISIONS`."""
    import flax.linen as nn

    from qrl.networks import MLP, Dense, NatureCNN
    from qrl.quant import parse_precision

    base_name, _, activations = precision_name.partition("-")
    precision = parse_precision(base_name, activations=activations or "static")
    mlp = MLP(MLP_LAYER_SIZES, precision=precision, activate_final=False)
    cnn_policy = nn.Sequential([NatureCNN(precision=precision), Dense(NUM_ACTIONS, precision=precision)])
    return precision, {"mlp": mlp, "cnn": cnn_policy}


def prepare_candidates(model_name: str, fp32_params, calibration: np.ndarray) -> dict:
    """precision name -> (jitted `apply(params, x)`, params on device, parameter bytes)."""
    import jax

    from qrl.quant import calibrate, param_bytes, quantize_params

    fp32_model = build_models("fp32")[1][model_name]
    ranges = calibrate(fp32_model.apply, fp32_params, calibration)
    candidates = {}
    for name in PRECISIONS:
        precision, models = build_models(name)
        model = models[model_name]
        params = quantize_params(fp32_params, precision, ranges)
        apply = jax.jit(lambda params, x, model=model: model.apply({"params": params}, x))
        candidates[name] = (apply, jax.device_put(params), param_bytes(params))
    return candidates


def time_model(candidates: dict, inputs_for_batch, batches: list[int], args, host_io_batches=()) -> dict:
    """Wall and CPU µs per call and their ratios to fp32 per candidate and batch, parameter
    bytes, and max |output - fp32 output|."""
    import jax

    latency_us = {name: {} for name in candidates}
    cpu_us = {name: {} for name in candidates}
    max_abs_error = {name: {} for name in candidates}
    for batch in batches:
        x_host = inputs_for_batch(batch)
        x = jax.device_put(x_host)
        reference = np.asarray(candidates["fp32"][0](candidates["fp32"][1], x))
        calls = {}
        for name, (apply, params, _) in candidates.items():
            output = np.asarray(apply(params, x), np.float32)
            max_abs_error[name][batch] = float(np.max(np.abs(output - reference)))
            calls[name] = lambda apply=apply, params=params: apply(params, x).block_until_ready()
        if batch in host_io_batches:
            apply, params, _ = candidates["fp32"]
            calls[HOST_IO_CANDIDATE] = lambda: np.asarray(apply(params, x_host))
        for name, seconds in interleaved_medians(calls, args.rounds, args.round_seconds).items():
            latency_us.setdefault(name, {})[batch] = seconds["wall"] * 1e6
            cpu_us.setdefault(name, {})[batch] = seconds["cpu"] * 1e6
    return {
        "latency_us": latency_us,
        "ratio_to_fp32": ratios_to(latency_us, "fp32"),
        "cpu_us": cpu_us,
        "cpu_ratio_to_fp32": ratios_to(cpu_us, "fp32"),
        "max_abs_error_vs_fp32": max_abs_error,
        "param_bytes": {name: candidate[2] for name, candidate in candidates.items()},
    }


def ratios_to(values: dict, reference: str) -> dict:
    """`values[name][batch] / values[reference][batch]` for every name and batch."""
    return {
        name: {batch: value / values[reference][batch] for batch, value in row.items()}
        for name, row in values.items()
    }


def run_onnx_peer(fp32_params, calibration: np.ndarray, batches: list[int], args) -> dict:
    """Runs `bench/onnx_peer.py` in a fresh process on the MLP's weights; its JSON or an error."""
    arrays = {"calibration": calibration}
    for index in range(len(MLP_LAYER_SIZES)):
        layer = fp32_params[f"dense_{index}"]
        arrays[f"kernel_{index}"] = np.asarray(layer["kernel"], np.float32)
        arrays[f"bias_{index}"] = np.asarray(layer["bias"], np.float32)
    with tempfile.TemporaryDirectory() as directory:
        weights_path = os.path.join(directory, "mlp_weights.npz")
        np.savez(weights_path, **arrays)
        command = [
            args.peer_python, "-m", "bench.onnx_peer",
            f"--weights={weights_path}",
            f"--batches={','.join(map(str, batches))}",
            f"--rounds={args.rounds}",
            f"--round_seconds={args.round_seconds}",
            f"--ort_threads={args.ort_threads}",
        ]
        try:
            completed = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True)
        except OSError as error:
            return {"error": f"cannot start {args.peer_python}: {error}"}
    if completed.returncode != 0:
        lines = completed.stderr.strip().splitlines() or ["no output"]
        return {"error": f"onnx peer exited with status {completed.returncode}: {lines[-1]}"}
    result = json.loads(completed.stdout.strip().splitlines()[-1])
    for key in ("latency_us", "cpu_us"):
        result[key] = {name: {int(batch): value for batch, value in row.items()} for name, row in result[key].items()}
        result[key.replace("_us", "_ratio_to_ort_fp32")] = ratios_to(result[key], "ort-fp32")
    return result


def export_policies(directory: str, model_names, rng: np.random.Generator) -> dict:
    """Exports each model of `EXPORT_MODELS` at every `EXPORT_SCHEMES` scheme with qrl.deploy
    (static scales calibrated on random inputs) to `directory`; returns parameter bytes per
    model and scheme."""
    import jax

    import flax.linen as nn

    from qrl.deploy.onnx_graph import to_onnx
    from qrl.networks import MLP, Dense, NatureCNN
    from qrl.quant import calibrate, param_bytes, parse_precision, quantize_params

    sizes = {}
    for model_name in model_names:
        layers = EXPORT_MODELS[model_name]
        if layers == "cnn":
            build = lambda precision: nn.Sequential([NatureCNN(precision=precision), Dense(NUM_ACTIONS, precision=precision)])  # noqa: E731
            inputs = rng.integers(0, 256, (CNN_CALIBRATION_SIZE, *CNN_FRAME_SHAPE), dtype=np.uint8)
        else:
            build = lambda precision, layers=layers: MLP(layers, precision=precision, activate_final=False)  # noqa: E731
            inputs = rng.standard_normal((CALIBRATION_SIZE, MLP_INPUT_SIZE)).astype(np.float32)
        fp32 = build(parse_precision("fp32"))
        params = jax.jit(fp32.init)(jax.random.PRNGKey(0), inputs[:1])["params"]
        variants = [(scheme, params) for scheme in EXPORT_SCHEMES]
        if layers != "cnn":
            pruned = pruned_params(params, np.random.default_rng(3))
            variants += [(scheme + PRUNED_SUFFIX, pruned) for scheme in PRUNED_SCHEMES]
        sizes[model_name] = {}
        for name, variant_params in variants:
            precision = parse_precision(name.replace(PRUNED_SUFFIX, ""))
            network = build(precision)
            ranges = calibrate(fp32.apply, variant_params, inputs)
            quantized = jax.tree.map(np.asarray, quantize_params(variant_params, precision, ranges))
            model = to_onnx(lambda x, network=network, quantized=quantized: network.apply({"params": quantized}, x),
                            inputs.shape[1:], ["y"], observation_dtype=inputs.dtype)
            with open(os.path.join(directory, f"{model_name}__{name}.onnx"), "wb") as handle:
                handle.write(model.SerializeToString())
            sizes[model_name][name] = {"param_bytes": param_bytes(quantized), "model_bytes": model.ByteSize()}
    return sizes


def pruned_params(params, rng: np.random.Generator):
    """`params` with every kernel keeping a random `PRUNED_DENSITY` of its entries (exactly
    round(density * size) of them), biases kept."""
    import jax

    def prune(path, leaf):
        if not jax.tree_util.keystr(path).endswith("'kernel']"):
            return np.asarray(leaf)
        kept = np.zeros(leaf.size, bool)
        kept[rng.choice(leaf.size, max(1, round(PRUNED_DENSITY * leaf.size)), replace=False)] = True
        return np.where(kept.reshape(leaf.shape), np.asarray(leaf), 0).astype(leaf.dtype)

    return jax.tree_util.tree_map_with_path(prune, params)


def time_jax_sparse(model_names, batches: list[int], args) -> dict:
    """The pruned MLPs in JAX, side by side: the jitted dense product of the masked kernels and
    `jax.experimental.sparse.BCSR` products (kernels transposed, `[N, K] · xᵀ`). Wall µs per call
    and the ratio to the dense form."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import sparse as jax_sparse

    from qrl.networks import MLP
    from qrl.quant import parse_precision

    rng = np.random.default_rng(2)
    result = {"latency_us": {}, "ratio_to_dense": {}}
    for model_name in model_names:
        layers = EXPORT_MODELS[model_name]
        if layers == "cnn":
            continue
        network = MLP(layers, precision=parse_precision("fp32"), activate_final=False)
        inputs = rng.standard_normal((1, MLP_INPUT_SIZE)).astype(np.float32)
        params = pruned_params(jax.jit(network.init)(jax.random.PRNGKey(0), inputs)["params"], np.random.default_rng(3))
        kernels = [leaf for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]
                   if jax.tree_util.keystr(path).endswith("'kernel']")]
        biases = [leaf for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]
                  if jax.tree_util.keystr(path).endswith("'bias']")]
        sparse_kernels = [jax_sparse.BCSR.fromdense(jnp.asarray(kernel.T)) for kernel in kernels]

        @jax.jit
        def bcsr_apply(sparse_kernels, biases, x):
            h = x.T
            for index, (kernel, bias) in enumerate(zip(sparse_kernels, biases)):
                h = kernel @ h + bias[:, None]
                h = jax.nn.relu(h) if index < len(sparse_kernels) - 1 else h
            return h.T

        dense_apply = jax.jit(network.apply)
        latency = {"jax dense": {}, "jax bcsr": {}}
        for batch in batches:
            x = jnp.asarray(rng.standard_normal((batch, MLP_INPUT_SIZE)).astype(np.float32))
            np.testing.assert_allclose(np.asarray(bcsr_apply(sparse_kernels, biases, x)),
                                       np.asarray(dense_apply({"params": params}, x)), rtol=1e-4, atol=1e-4)
            calls = {"jax dense": lambda x=x: jax.block_until_ready(dense_apply({"params": params}, x)),
                     "jax bcsr": lambda x=x: jax.block_until_ready(bcsr_apply(sparse_kernels, biases, x))}
            for name, seconds in interleaved_medians(calls, args.rounds, args.round_seconds).items():
                latency[name][batch] = seconds["wall"] * 1e6
        result["latency_us"][model_name] = latency
        result["ratio_to_dense"][model_name] = ratios_to(latency, "jax dense")
    return result


def run_export_peer(args) -> dict:
    """Exports the `EXPORT_MODELS` policies and times them in `bench/onnx_peer.py --models`."""
    rng = np.random.default_rng(2)
    model_names = QUICK_EXPORT_MODELS if args.quick else tuple(EXPORT_MODELS)
    with tempfile.TemporaryDirectory() as directory:
        sizes = export_policies(directory, model_names, rng)
        command = [args.peer_python, "-m", "bench.onnx_peer", f"--models={directory}",
                   f"--batches={','.join(map(str, args.export_batches))}", f"--rounds={args.rounds}",
                   f"--round_seconds={args.round_seconds}", f"--ort_threads={args.ort_threads}"]
        completed = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True)
    if completed.returncode != 0:
        lines = completed.stderr.strip().splitlines() or ["no output"]
        return {"error": f"onnx peer exited with status {completed.returncode}: {lines[-1]}"}
    timed = json.loads(completed.stdout.strip().splitlines()[-1])
    result = {"sizes": sizes, "latency_us": {}, "ratio_to_fp32": {}, "p50_us": {}, "p99_us": {}, "info": timed["info"]}
    for model_name in model_names:
        candidates = [name.split("__", 1)[1] for name in timed["latency_us"] if name.split("__", 1)[0] == model_name]
        latency = {scheme: {int(b): v for b, v in timed["latency_us"][f"{model_name}__{scheme}"].items()}
                   for scheme in candidates}
        result["latency_us"][model_name] = latency
        result["ratio_to_fp32"][model_name] = ratios_to(latency, "fp32")
        for key in ("p50_us", "p99_us"):
            result[key][model_name] = {scheme: timed[key][f"{model_name}__{scheme}"] for scheme in candidates}
    return result


def format_table(title: str, rows: dict, batches: list[int], note: str = "") -> list[str]:
    """`rows`: name -> (latency µs per batch, ratio per batch)."""
    lines = [title, f"{'candidate':<26}" + "".join(f"{f'batch {batch}':>20}" for batch in batches)]
    for name, (latency, ratio) in rows.items():
        cells = []
        for batch in batches:
            if batch in latency:
                cells.append(f"{latency[batch]:>11.1f} ({ratio[batch]:.2f})")
            else:
                cells.append(f"{'-':>18}")
        lines.append(f"{name:<26}" + "".join(f"{cell:>20}" for cell in cells))
    if note:
        lines.append(note)
    return lines


def evaluate_targets(results: dict) -> list[dict]:
    """int8/fp32 targets per model and activation mode, and the JAX/ORT batch-1 target."""
    targets = []
    for model, batch, bound in INT8_TARGETS:
        for name in ("int8-static", "int8-dynamic"):
            ratio = results[model]["ratio_to_fp32"][name].get(batch)
            targets.append({
                "name": f"{model.upper()} {name}/fp32 at batch {batch}",
                "bound": bound,
                "value": ratio,
                "passed": None if ratio is None else ratio <= bound,
            })
    exported = results.get("exported", {})
    for model, scheme, batch, bound in EXPORT_TARGETS:
        ratio = exported.get("ratio_to_fp32", {}).get(model, {}).get(scheme, {}).get(batch)
        targets.append({
            "name": f"exported {model} {scheme}/fp32 under ORT at batch {batch}",
            "bound": bound,
            "value": ratio,
            "passed": None if ratio is None else ratio <= bound,
        })
    ort = results.get("onnx", {})
    jax_fp32 = results["mlp"]["latency_us"]["fp32"].get(1)
    ort_fp32 = ort.get("latency_us", {}).get("ort-fp32", {}).get(1)
    jax_fp32_host_io = results["mlp"]["latency_us"].get(HOST_IO_CANDIDATE, {}).get(1)
    for label, jax_latency in (
        ("JAX fp32 / ORT fp32 at batch 1", jax_fp32),
        ("JAX fp32 (numpy in/out) / ORT fp32 at batch 1", jax_fp32_host_io),
    ):
        ratio = None if jax_latency is None or ort_fp32 is None else jax_latency / ort_fp32
        targets.append({
            "name": label,
            "bound": JAX_OVER_ORT_BATCH1_TARGET,
            "value": ratio,
            "passed": None if ratio is None else ratio <= JAX_OVER_ORT_BATCH1_TARGET,
        })
    return targets


def _rows(timings: dict, prefix: str, values_key: str, ratios_key: str) -> dict:
    """Table rows `prefix + name -> (values per batch, ratios per batch)`."""
    return {f"{prefix}{name}": (timings[values_key][name], timings[ratios_key][name]) for name in timings[values_key]}


def report(results: dict, args) -> str:
    """The printed tables: wall and CPU µs per call with ratios, targets, parameter bytes."""
    environment = results["environment"]
    lines = [
        f"jax {environment['jax']}, XLA_FLAGS={environment['XLA_FLAGS']!r}, "
        f"PJRT_NPROC={environment['PJRT_NPROC'] or 'unset'}, "
        f"async dispatch {'on' if args.async_dispatch else 'off'}, {args.rounds} rounds, "
        f"cpu count {environment['cpu_count']}",
    ]
    ort = results.get("onnx", {})
    mlp_title = f"MLP {MLP_INPUT_SIZE}-{'-'.join(map(str, MLP_LAYER_SIZES))}"
    cnn_title = f"Nature CNN + {NUM_ACTIONS}-action head, uint8 84x84x4"
    kinds = (("wall", "latency_us", "ratio_to_fp32"), ("CPU", "cpu_us", "cpu_ratio_to_fp32"))
    for kind, values_key, ratios_key in kinds:
        rows = _rows(results["mlp"], "jax ", values_key, ratios_key)
        note = "ratios: to jax fp32 at the same batch."
        if values_key in ort:
            ort_rows = _rows(ort, "", values_key, values_key.replace("_us", "_ratio_to_ort_fp32"))
            rows.update({f"{name} *": row for name, row in ort_rows.items()})
            note += " * separate process (bench/onnx_peer.py); ratio to its ort-fp32."
        elif "error" in ort:
            note += f" ONNX peer: {ort['error']}"
        else:
            note += " ONNX peer: skipped."
        lines += [""] + format_table(f"{mlp_title}: median {kind} µs per call (ratio)", rows, args.mlp_batches, note)
        rows = _rows(results["cnn"], "jax ", values_key, ratios_key)
        cnn_table = format_table(f"{cnn_title}: median {kind} µs per call (ratio to jax fp32)", rows, args.cnn_batches)
        lines += [""] + cnn_table
    exported = results.get("exported", {})
    if "latency_us" in exported:
        for model_name, latency in exported["latency_us"].items():
            rows = {f"{scheme} (p99 b1 {exported['p99_us'][model_name][scheme]:.0f} µs)": (latency[scheme], exported["ratio_to_fp32"][model_name][scheme])
                    for scheme in latency}
            lines += [""] + format_table(
                f"exported {model_name} (qrl.deploy ONNX, ORT {args.ort_threads} thread): median wall µs per call (ratio to its fp32)",
                rows, args.export_batches)
    elif exported:
        lines += ["", f"exported policies: {exported.get('error') or exported.get('skipped')}"]
    for model_name, latency in results.get("pruned_jax", {}).get("latency_us", {}).items():
        rows = {name: (latency[name], results["pruned_jax"]["ratio_to_dense"][model_name][name]) for name in latency}
        lines += [""] + format_table(f"pruned {model_name} (95% of every kernel zero) in JAX: median wall µs per call "
                                     "(ratio to jax dense)", rows, args.export_batches)
    lines += ["", "targets (wall-time ratios)"]
    for target in results["targets"]:
        if target["value"] is None:
            verdict = "not measured"
        else:
            verdict = f"{target['value']:.2f} {'PASS' if target['passed'] else 'FAIL'}"
        lines.append(f"  {target['name']} <= {target['bound']}: {verdict}")
    lines += ["", "parameter bytes (ratio to fp32)"]
    for model in ("mlp", "cnn"):
        sizes = results[model]["param_bytes"]
        cells = ", ".join(f"{name} {size} ({size / sizes['fp32']:.2f})" for name, size in sizes.items())
        lines.append(f"  {model.upper()}: {cells}")
    return "\n".join(lines)


def headline_cells(results: dict) -> list[dict]:
    """The README's figures (`bench.tables` cells): median wall µs per call with the ratio to fp32
    at the same batch, for the MLP (JAX, and ONNX Runtime / numpy against ORT fp32), the CNN and
    the exported policies (against each model's exported fp32)."""
    from bench.tables import grid

    batch = lambda value: f"batch {value}"  # noqa: E731
    mlp, cnn, ort = results["mlp"], results["cnn"], results.get("onnx", {})
    cells = grid("MLP latency", {f"jax {name}": row for name, row in mlp["latency_us"].items()}, "µs",
                 {f"jax {name}": row for name, row in mlp["ratio_to_fp32"].items()}, batch)
    if "latency_us" in ort:
        cells += grid("MLP latency", ort["latency_us"], "µs", ort["latency_ratio_to_ort_fp32"], batch)
    cells += grid("CNN latency", {f"jax {name}": row for name, row in cnn["latency_us"].items()}, "µs",
                  {f"jax {name}": row for name, row in cnn["ratio_to_fp32"].items()}, batch)
    exported = results.get("exported", {})
    for model, latency in exported.get("latency_us", {}).items():
        cells += grid("exported latency", {f"{model} {scheme}": row for scheme, row in latency.items()}, "µs",
                      {f"{model} {scheme}": row for scheme, row in exported["ratio_to_fp32"][model].items()}, batch)
    return cells


def main(argv=None) -> None:
    args = parse_args(argv)
    jax = configure_jax(args)
    rng = np.random.default_rng(0)

    mlp_observations = rng.standard_normal((CALIBRATION_SIZE, MLP_INPUT_SIZE)).astype(np.float32)
    frames = rng.integers(0, 256, (CNN_CALIBRATION_SIZE, *CNN_FRAME_SHAPE), dtype=np.uint8)
    fp32_models = build_models("fp32")[1]
    mlp_params = jax.jit(fp32_models["mlp"].init)(jax.random.PRNGKey(0), mlp_observations[:1])["params"]
    cnn_params = jax.jit(fp32_models["cnn"].init)(jax.random.PRNGKey(1), frames[:1])["params"]

    results = {
        "environment": {
            "jax": jax.__version__,
            "XLA_FLAGS": os.environ.get("XLA_FLAGS", ""),
            "PJRT_NPROC": os.environ.get("PJRT_NPROC", ""),
            "async_dispatch": args.async_dispatch,
            "rounds": args.rounds,
            "round_seconds": args.round_seconds,
            "cpu_count": os.cpu_count(),
        },
        "mlp": time_model(
            prepare_candidates("mlp", mlp_params, mlp_observations),
            lambda batch: rng.standard_normal((batch, MLP_INPUT_SIZE)).astype(np.float32),
            args.mlp_batches,
            args,
            host_io_batches=(1,),
        ),
        "cnn": time_model(
            prepare_candidates("cnn", cnn_params, frames),
            lambda batch: rng.integers(0, 256, (batch, *CNN_FRAME_SHAPE), dtype=np.uint8),
            args.cnn_batches,
            args,
        ),
    }
    if args.no_onnx:
        results["onnx"] = {"skipped": "--no_onnx"}
    elif args.peer_python == sys.executable and not all(
        importlib.util.find_spec(name) for name in ("onnx", "onnxruntime")
    ):
        results["onnx"] = {"error": "onnx / onnxruntime not installed (pip install -r requirements-bench.txt)"}
    else:
        results["onnx"] = run_onnx_peer(mlp_params, mlp_observations, args.mlp_batches, args)
    results["exported"] = {"skipped": "--no_export"} if args.no_export else run_export_peer(args)
    if not args.no_export:
        results["pruned_jax"] = time_jax_sparse(QUICK_EXPORT_MODELS if args.quick else tuple(EXPORT_MODELS),
                                                args.export_batches, args)
    results["targets"] = evaluate_targets(results)

    print(report(results, args), flush=True)
    if args.json:
        from bench.machine import write_json

        write_json(args.json, results, cells=headline_cells(results))


if __name__ == "__main__":
    main()
