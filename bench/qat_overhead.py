"""The cost of quantization-aware training: one training update at fp32 and with the QAT layers
on both backends (`qat_backend=qrl`: qrl's fake quantization on the int<N> grids; `aqt`: AQT's
fake-quantized dot_general), each tracking its moving-average input ranges in training mode,
side by side in one process.

    .venv/bin/python -m bench.qat_overhead [--quick] [--batch=256] [--width=256] [--json=PATH]

The model is an MLP 17 -> W -> W -> 6 trained with a squared-error loss and Adam; each call
runs K=10 updates fused under one `lax.scan` (as the agents do). Besides the full update the
script times the forward pass and forward+backward alone for each candidate, so the report
says where the QAT time goes: the extra elementwise passes (max-abs scales, round, clip) over
activations and weights in the forward, and their straight-through backward.
"""

import argparse
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from bench.timing import interleaved_medians
from qrl import runtime
from qrl.networks.layers import Dense
from qrl.quant import FP32, apply_frozen, apply_tracking, qat_precision

INPUT_SIZE = 17
OUTPUTS = 6
FUSED_UPDATES = 10
TARGET_RATIO = 1.5  # QAT update / fp32 update; AQT measured ≈4× before this script existed.


class QrlMLP(nn.Module):
    width: int
    precision: object = FP32

    @nn.compact
    def __call__(self, x):
        for index in range(2):
            x = nn.relu(Dense(self.width, precision=self.precision, name=f"dense_{index}", reads_observation=index == 0)(x))
        return Dense(OUTPUTS, precision=self.precision, name="head", is_output=True)(x)


def make_candidates(batch: int, width: int) -> dict:
    """name -> (forward call, forward+backward call, fused-update call), each blocking."""
    key = jax.random.PRNGKey(0)
    inputs = jax.random.normal(key, (FUSED_UPDATES, batch, INPUT_SIZE))
    targets = jax.random.normal(jax.random.PRNGKey(1), (FUSED_UPDATES, batch, OUTPUTS))
    networks = {
        "fp32": QrlMLP(width),
        "qrl qat8": QrlMLP(width, qat_precision(8)),
        "qrl qat4": QrlMLP(width, qat_precision(4)),
        "aqt qat8": QrlMLP(width, qat_precision(8, "aqt")),
        "aqt qat4": QrlMLP(width, qat_precision(4, "aqt")),
    }
    optimizer = optax.adam(1e-3)
    candidates = {}
    for name, network in networks.items():
        variables = network.init(key, inputs[0])
        params, ranges = variables["params"], variables.get("quant_ranges", {})
        if ranges:
            ranges = apply_tracking(network, params, ranges, inputs[0])[1]

        def loss(params, ranges, x, y, network=network):
            outputs, ranges = apply_tracking(network, params, ranges, x)
            return jnp.mean(jnp.square(outputs - y)), ranges

        forward = jax.jit(lambda params, ranges, x, network=network: apply_frozen(network, params, ranges, x))
        grad = jax.jit(jax.grad(loss, has_aux=True))

        @jax.jit
        def update(params, opt_state, ranges, xs, ys, loss=loss):
            def one(carry, batch):
                params, opt_state, ranges = carry
                grads, ranges = jax.grad(loss, has_aux=True)(params, ranges, *batch)
                updates, opt_state = optimizer.update(grads, opt_state, params)
                return (optax.apply_updates(params, updates), opt_state, ranges), None

            return jax.lax.scan(one, (params, opt_state, ranges), (xs, ys))[0]

        opt_state = optimizer.init(params)
        candidates[name] = (
            lambda forward=forward, params=params, ranges=ranges: jax.block_until_ready(forward(params, ranges, inputs[0])),
            lambda grad=grad, params=params, ranges=ranges: jax.block_until_ready(
                grad(params, ranges, inputs[0], targets[0])
            ),
            lambda update=update, params=params, opt_state=opt_state, ranges=ranges: jax.block_until_ready(
                update(params, opt_state, ranges, inputs, targets)
            ),
        )
    return candidates


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 short rounds (a smoke test)")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--xla_threads", type=int, default=0, help="XLA:CPU threads (0: one per core)")
    parser.add_argument("--json", default=None, help="also write the results to this JSON file")
    args = parser.parse_args(argv)
    runtime.configure_jax(args.xla_threads)
    rounds, round_seconds = (3, 0.01) if args.quick else (15, 0.05)
    candidates = make_candidates(args.batch, args.width)
    results = {}
    for part, index in (("forward", 0), ("forward+backward", 1), ("update", 2)):
        timed = interleaved_medians({name: calls[index] for name, calls in candidates.items()}, rounds, round_seconds)
        results[part] = {name: times["wall"] for name, times in timed.items()}
    print(f"MLP {INPUT_SIZE}->{args.width}->{args.width}->{OUTPUTS}, batch {args.batch}; "
          f"update = {FUSED_UPDATES} fused Adam steps. Times per call, ratio to fp32.")
    print(f"{'candidate':>10} | " + " | ".join(f"{part:>24}" for part in results))
    for name in candidates:
        cells = []
        for part, times in results.items():
            cells.append(f"{times[name] * 1e6:10.1f} µs {times[name] / times['fp32']:6.2f}×")
        print(f"{name:>10} | " + " | ".join(f"{cell:>24}" for cell in cells))
    ratio = results["update"]["qrl qat8"] / results["update"]["fp32"]
    aqt_ratio = results["update"]["aqt qat8"] / results["update"]["fp32"]
    verdict = "PASS" if ratio <= TARGET_RATIO else "FAIL"
    print(f"qat8 update / fp32 update: qat_backend=qrl {ratio:.2f}× (target ≤ {TARGET_RATIO}×: {verdict}); "
          f"qat_backend=aqt {aqt_ratio:.2f}×")
    if args.json:
        from bench.machine import write_json

        from bench.tables import cell

        cells = [cell(f"QAT cost, MLP {args.width}-{args.width}, batch {args.batch}", name, part, times[name] * 1e6,
                      "µs", times[name] / times["fp32"]) for name in candidates for part, times in results.items()]
        write_json(args.json, {"batch": args.batch, "width": args.width, "seconds": results,
                               "qat8_update_ratio": ratio, "aqt8_update_ratio": aqt_ratio}, cells=cells)
    return 0


if __name__ == "__main__":
    sys.exit(main())
