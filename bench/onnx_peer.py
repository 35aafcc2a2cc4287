"""Out-of-process peers for the MLP latency benchmark: ONNX Runtime (fp32, int8) and numpy fp32.

Run by `bench/inference.py` in a separate process, because timing ONNX Runtime or numpy in a
process that has loaded JAX inflates them (DESIGN.md §6). Reads the MLP's weights from an .npz
file (`kernel_<i> [in, out]`, `bias_<i> [out]` per layer; ReLU between layers, none after the
last; `calibration [N, in]` observations for static int8), builds the ONNX graph with the
`onnx.helper` API and prints one JSON object on stdout:

    python -m bench.onnx_peer --weights=/tmp/mlp.npz --batches=1,32,256,4096
    python -m bench.onnx_peer --models=/tmp/exports --batches=1,8,32   # qrl.deploy exports

Candidates:
- `ort-fp32`: the MatMul/Add/Relu graph.
- `ort-int8-dynamic`: `onnxruntime.quantization.quantize_dynamic` (int8 weights per tensor;
  uint8 activations quantized per call by DynamicQuantizeLinear; MatMulInteger, which ORT fuses
  into DynamicQuantizeMatMul).
- `ort-int8-static`: `quantize_static` to a QDQ graph (int8 weights per output channel, uint8
  activations with MinMax-calibrated scales; ORT fuses QDQ pairs into QLinearMatMul/QGemm).
- `numpy-fp32`: `x @ W + b` and `np.maximum`, timed at batch 1 by default.

Sessions run with one intra-op thread by default: on the shared 2-vCPU machine ORT's default
pool (one spinning thread per core, per session) was slower at every batch size and erratic.
"""

import argparse
import json
import os
import sys
import tempfile

import numpy as np

from bench.timing import interleaved_medians

ONNX_OPSET = 17
ONNX_IR_VERSION = 8


def load_layers(path: str) -> tuple[list[tuple[np.ndarray, np.ndarray]], np.ndarray]:
    """(kernel, bias) per layer in order, and the calibration observations, from an .npz file."""
    with np.load(path, allow_pickle=False) as archive:
        layers = []
        while f"kernel_{len(layers)}" in archive:
            index = len(layers)
            kernel, bias = archive[f"kernel_{index}"], archive[f"bias_{index}"]
            layers.append((kernel.astype(np.float32), bias.astype(np.float32)))
        calibration = archive["calibration"].astype(np.float32)
    if not layers:
        raise ValueError(f"{path}: no kernel_0 array")
    return layers, calibration


def build_mlp_graph(layers: list[tuple[np.ndarray, np.ndarray]]):
    """ONNX model `x [batch, in] -> y [batch, out]`: MatMul, Add, and Relu between layers."""
    from onnx import TensorProto, helper, numpy_helper

    nodes, initializers = [], []
    current = "x"
    for index, (kernel, bias) in enumerate(layers):
        initializers += [
            numpy_helper.from_array(np.asarray(kernel, np.float32), f"kernel_{index}"),
            numpy_helper.from_array(np.asarray(bias, np.float32), f"bias_{index}"),
        ]
        nodes.append(
            helper.make_node("MatMul", [current, f"kernel_{index}"], [f"matmul_{index}"], name=f"matmul_{index}")
        )
        is_last = index == len(layers) - 1
        summed = "y" if is_last else f"add_{index}"
        nodes.append(helper.make_node("Add", [f"matmul_{index}", f"bias_{index}"], [summed], name=f"add_{index}"))
        if not is_last:
            nodes.append(helper.make_node("Relu", [summed], [f"relu_{index}"], name=f"relu_{index}"))
            current = f"relu_{index}"
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", layers[0][0].shape[0]])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", layers[-1][0].shape[1]])],
        initializer=initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", ONNX_OPSET)])
    model.ir_version = ONNX_IR_VERSION
    return model


def write_models(layers, calibration: np.ndarray, directory: str) -> dict[str, str]:
    """Writes the fp32, dynamic-int8 and static-int8 (QDQ) models; returns name -> path."""
    import onnx
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_dynamic,
        quantize_static,
    )

    class CalibrationReader(CalibrationDataReader):
        """Feeds the calibration observations to `quantize_static` in batches of 256."""

        def __init__(self):
            self._batches = iter([calibration[start : start + 256] for start in range(0, len(calibration), 256)])

        def get_next(self):
            batch = next(self._batches, None)
            return None if batch is None else {"x": batch}

    names = ("ort-fp32", "ort-int8-dynamic", "ort-int8-static")
    paths = {name: os.path.join(directory, f"{name}.onnx") for name in names}
    onnx.save(build_mlp_graph(layers), paths["ort-fp32"])
    quantize_dynamic(paths["ort-fp32"], paths["ort-int8-dynamic"], weight_type=QuantType.QInt8)
    quantize_static(
        paths["ort-fp32"],
        paths["ort-int8-static"],
        CalibrationReader(),
        quant_format=QuantFormat.QDQ,
        per_channel=True,
        activation_type=QuantType.QUInt8,
        weight_type=QuantType.QInt8,
    )
    return paths


def numpy_mlp(layers):
    """`x -> y` in numpy float32, ReLU between layers."""

    def apply(x: np.ndarray) -> np.ndarray:
        for index, (kernel, bias) in enumerate(layers):
            x = x @ kernel + bias
            if index < len(layers) - 1:
                x = np.maximum(x, 0.0)
        return x

    return apply


def ell_model(model):
    """`model` with every MatMul on a sparse initializer `w [K, N]` rewritten as a gather of the
    kept inputs (ELL layout: each output column's kept rows padded to the longest, k): Gather(x,
    rows [N, k], axis=1) -> [B, N, k], Mul by values [N, k], ReduceSum over k. Pure ONNX; the
    candidate a runtime without sparse kernels has."""
    import onnx
    from onnx import helper, numpy_helper

    from qrl.deploy.initializers import dense_of_sparse

    model = onnx.ModelProto.FromString(model.SerializeToString())
    graph = model.graph
    sparse = {tensor.values.name: dense_of_sparse(tensor) for tensor in graph.sparse_initializer}
    nodes, initializers = [], list(graph.initializer)
    axes = numpy_helper.from_array(np.array([-1], np.int64), "ell_axes")
    initializers.append(axes)
    for node in graph.node:
        if node.op_type != "MatMul" or node.input[1] not in sparse or sparse[node.input[1]].dtype != np.float32:
            nodes.append(node)
            continue
        columns = sparse.pop(node.input[1]).T  # [N, K]
        width = max(1, int((columns != 0).sum(axis=1).max()))
        rows = np.zeros((columns.shape[0], width), np.int64)
        values = np.zeros((columns.shape[0], width), np.float32)
        for output, column in enumerate(columns):
            kept = np.flatnonzero(column)
            rows[output, : kept.size], values[output, : kept.size] = kept, column[kept]
        name = node.input[1]
        initializers += [numpy_helper.from_array(rows, f"{name}_rows"), numpy_helper.from_array(values, f"{name}_values")]
        nodes += [helper.make_node("Gather", [node.input[0], f"{name}_rows"], [f"{name}_gathered"], axis=1),
                  helper.make_node("Mul", [f"{name}_gathered", f"{name}_values"], [f"{name}_products"]),
                  helper.make_node("ReduceSum", [f"{name}_products", "ell_axes"], [node.output[0]], keepdims=0)]
    remaining = [tensor for tensor in graph.sparse_initializer if tensor.values.name in sparse]
    new_graph = helper.make_graph(nodes, graph.name, graph.input, graph.output, initializers, sparse_initializer=remaining)
    new_model = helper.make_model(new_graph, opset_imports=model.opset_import)
    new_model.ir_version = model.ir_version
    return new_model


def time_exported_models(directory: str, batches: list[int], rounds: int, round_seconds: float, threads: int,
                         single_calls: int = 400) -> dict:
    """Times every `<model>__<scheme>.onnx` in `directory` (qrl.deploy exports, one input) with
    ONNX Runtime: medians per batch with the schemes of one model interleaved, and p50/p99 of
    `single_calls` single batch-1 calls taken in turn across the model's schemes. Models with
    sparse initializers (pruned) also run in qrl's CSR runtime (`<scheme>+csr`) and, for fp32,
    rewritten by `ell_model` (`<scheme>+ell`, ONNX Runtime)."""
    import time

    import onnx
    import onnxruntime as ort

    from qrl.deploy.csr_runtime import CsrProgram

    def session(model):
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])

    runners, inputs = {}, {}
    for file_name in sorted(os.listdir(directory)):
        if not file_name.endswith(".onnx"):
            continue
        name = file_name[: -len(".onnx")]
        model = onnx.load(os.path.join(directory, file_name))
        graph_input = model.graph.input[0]
        inputs[name.split("__")[0]] = (graph_input.name, [d.dim_value for d in graph_input.type.tensor_type.shape.dim[1:]],
                                      graph_input.type.tensor_type.elem_type == onnx.TensorProto.UINT8)
        main_session = session(model)
        runners[name] = lambda x, s=main_session, i=graph_input.name: s.run(None, {i: x})
        if model.graph.sparse_initializer:
            program = CsrProgram(model)
            runners[f"{name}+csr"] = lambda x, p=program, i=graph_input.name: p.run([], {i: x})
            if "fp32" in name:
                gathered = session(ell_model(model))
                runners[f"{name}+ell"] = lambda x, s=gathered, i=graph_input.name: s.run(None, {i: x})
    rng = np.random.default_rng(0)
    latency_us, p50_us, p99_us, max_abs_difference = {}, {}, {}, {}
    for model, (input_name, shape, integer_input) in inputs.items():
        names = [name for name in runners if name.split("__")[0] == model]

        def draw(batch):
            return (rng.integers(0, 256, (batch, *shape), dtype=np.uint8) if integer_input
                    else rng.standard_normal((batch, *shape)).astype(np.float32))

        for batch in batches:
            x = draw(batch)
            for name in names:  # a runtime of a pruned model computes what ORT computes on it.
                plain = name.split("+")[0]
                max_abs_difference.setdefault(name, {})[batch] = float(np.max(np.abs(
                    np.asarray(runners[name](x)[0], np.float64) - np.asarray(runners[plain](x)[0], np.float64))))
            calls = {name: (lambda runner=runners[name], x=x: runner(x)) for name in names}
            for name, seconds in interleaved_medians(calls, rounds, round_seconds).items():
                latency_us.setdefault(name, {})[batch] = seconds["wall"] * 1e6
        if single_calls < 1:
            continue
        x = draw(1)
        single = {name: [] for name in names}
        for _ in range(single_calls):
            for name in names:
                start = time.perf_counter()
                runners[name](x)
                single[name].append(time.perf_counter() - start)
        for name, times in single.items():
            p50_us[name] = float(np.percentile(times, 50) * 1e6)
            p99_us[name] = float(np.percentile(times, 99) * 1e6)
    return {"info": {"onnxruntime": ort.__version__, "ort_threads": threads, "cpu_count": os.cpu_count()},
            "latency_us": latency_us, "p50_us": p50_us, "p99_us": p99_us, "max_abs_difference": max_abs_difference}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--weights", default=None, help=".npz with kernel_<i>, bias_<i>, calibration")
    parser.add_argument("--models", default=None,
                        help="instead of --weights: a directory of qrl.deploy exports <model>__<scheme>.onnx to time")
    parser.add_argument("--batches", default="1,32,256,4096", help="comma-separated batch sizes")
    parser.add_argument("--rounds", type=int, default=20, help="round-robin rounds per batch size")
    parser.add_argument("--round_seconds", type=float, default=0.01, help="time per candidate turn")
    parser.add_argument(
        "--numpy_batches",
        default="1",
        help="batch sizes numpy is timed at (its multi-threaded BLAS fights ORT's threads on a loaded machine)",
    )
    parser.add_argument(
        "--ort_threads",
        type=int,
        default=1,
        help="intra-op threads per session (0: ORT's default, one per core, which was slower and erratic here)",
    )
    parser.add_argument("--single_calls", type=int, default=400,
                        help="with --models: single batch-1 calls per model for p50/p99")
    parser.add_argument("--no_ort", action="store_true", help="numpy only (onnxruntime not needed)")
    args = parser.parse_args(argv)
    batches = [int(batch) for batch in args.batches.split(",") if batch.strip()]
    if args.models:
        json.dump(time_exported_models(args.models, batches, args.rounds, args.round_seconds, args.ort_threads,
                                       args.single_calls), sys.stdout)
        sys.stdout.write("\n")
        return
    if not args.weights:
        parser.error("--weights or --models is required")

    layers, calibration = load_layers(args.weights)
    numpy_batches = [int(batch) for batch in args.numpy_batches.split(",") if batch.strip()]
    functions = {}
    info = {"cpu_count": os.cpu_count(), "numpy": np.__version__}
    with tempfile.TemporaryDirectory() as directory:
        if not args.no_ort:
            import onnx
            import onnxruntime as ort

            info.update(onnx=onnx.__version__, onnxruntime=ort.__version__, ort_threads=args.ort_threads)
            for name, path in write_models(layers, calibration, directory).items():
                options = ort.SessionOptions()
                options.intra_op_num_threads = args.ort_threads
                session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
                functions[name] = lambda x, session=session: session.run(None, {"x": x})[0]
        functions["numpy-fp32"] = numpy_mlp(layers)

        rng = np.random.default_rng(0)
        latency_us = {name: {} for name in functions}
        cpu_us = {name: {} for name in functions}
        max_abs_error = {name: {} for name in functions}
        for batch in batches:
            x = rng.standard_normal((batch, layers[0][0].shape[0])).astype(np.float32)
            reference = functions["numpy-fp32"](x)
            for name, function in functions.items():
                max_abs_error[name][batch] = float(np.max(np.abs(function(x) - reference)))
            candidates = {
                name: (lambda function=function, x=x: function(x))
                for name, function in functions.items()
                if name != "numpy-fp32" or batch in numpy_batches
            }
            for name, seconds in interleaved_medians(candidates, args.rounds, args.round_seconds).items():
                latency_us[name][batch] = seconds["wall"] * 1e6
                cpu_us[name][batch] = seconds["cpu"] * 1e6

    result = {"info": info, "latency_us": latency_us, "cpu_us": cpu_us, "max_abs_error_vs_numpy": max_abs_error}
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
