"""Pruned policies on this machine: what sparse storage saves, and what training under a mask costs.

    .venv/bin/python -m bench.pruning [--quick] [--json=PATH]

1. Memory: a Hopper-sized policy (11 -> 256 -> 256 -> 3, the offline agents' actor) pruned by
   magnitude at each sparsity; bytes of every format (`pruning.sparse.memory_table`: bitmask, CSR,
   BCOO in fp32 and int8; PyTorch-style COO, 20 bytes per non-zero) over dense fp32. Target: a
   95%-sparse int8 policy ≤ 1/20 of dense fp32 (the pruning paper's COO: about 1/4).
2. Masked training cost: BC's fused update (`agents/bc`, batch 256, K updates per jitted call,
   sampling inside it) dense and under a 95% mask (`pruning.masked_optax.masked`: gradients and
   updates masked), timed round-robin in one process (`bench.timing`). Target: masked ≤ 1.10× dense.
"""

import argparse

import numpy as np

SPARSITIES = (0.5, 0.8, 0.9, 0.95, 0.98, 0.99)


def memory(args) -> list[dict]:
    import jax
    import jax.numpy as jnp

    from pruning import magnitude_scores, masks_from_scores, prunable_leaves, sparse
    from qrl.networks.torsos import MLP

    network = MLP((256, 256, 3), activate_final=False)
    params = network.init(jax.random.PRNGKey(0), jnp.zeros((1, 11)))["params"]
    rows = []
    print("policy 11-256-256-3; bytes over dense fp32 (over PyTorch COO in brackets)")
    print(f"{'sparsity':>8}  {'COO fp32':>9}  " + "  ".join(f"{kind + ' ' + precision:>16}"
                                                      for precision in sparse.PRECISIONS for kind in sparse.FORMATS))
    for sparsity in SPARSITIES:
        mask = masks_from_scores(magnitude_scores(params, prunable_leaves(params)), sparsity)
        table = sparse.memory_table(params, mask)
        cells = {(row["format"], row["precision"]): row for row in table}
        print(f"{sparsity:>8}  {cells[('pytorch_coo', 'fp32')]['vs_dense_fp32']:>9.3f}  " + "  ".join(
            f"{cells[(kind, precision)]['vs_dense_fp32']:>8.3f} ({cells[(kind, precision)]['vs_pytorch_coo']:.2f})"
            for precision in sparse.PRECISIONS for kind in sparse.FORMATS))
        rows.append({"sparsity": sparsity, "table": table})
    at_95 = {(row["format"], row["precision"]): row for row in rows[SPARSITIES.index(0.95)]["table"]}
    best = min(at_95[(kind, "int8")]["vs_dense_fp32"] for kind in sparse.FORMATS)
    print(f"95% sparse int8, best format: {best:.4f} of dense fp32 = 1/{1 / best:.1f} "
          f"(target ≤ 1/20: {'PASS' if best <= 1 / 20 else 'FAIL'})")
    return rows


def masked_cost(args) -> dict:
    import jax

    from agents import bc
    from bench.timing import interleaved_medians
    from pruning import magnitude_scores, masks_from_scores, prunable_leaves
    from qrl import offline
    from qrl.datasets import from_qlearning
    from dm_env import specs

    rng = np.random.default_rng(0)
    size = args.dataset_size
    dataset = from_qlearning({
        "observations": rng.normal(size=(size, 11)).astype(np.float32),
        "actions": rng.uniform(-1, 1, size=(size, 3)).astype(np.float32),
        "rewards": rng.normal(size=size).astype(np.float32), "terminals": np.zeros(size, bool),
        "next_observations": rng.normal(size=(size, 11)).astype(np.float32)})
    observation_spec = specs.Array((11,), np.float32)
    action_spec = specs.BoundedArray((3,), np.float32, -1.0, 1.0)
    config = bc.config_for({})
    dense = bc.build(config, observation_spec, action_spec)
    params = bc.learning.networks_at_init(dense.init(jax.random.PRNGKey(0)))["actor"]
    mask = masks_from_scores(magnitude_scores(params, prunable_leaves(params)), 0.95)
    masked = bc.build(config, observation_spec, action_spec, mask={"actor": mask})
    steps = {name: offline.make_fused_step(agent, dataset, config.batch_size, args.updates_per_call)
             for name, agent in (("dense", dense), ("masked 95%", masked))}
    states = {name: agent.init(jax.random.PRNGKey(0)) for name, agent in (("dense", dense), ("masked 95%", masked))}
    key = jax.random.PRNGKey(1)

    def call(name):
        def run():
            states[name], metrics = steps[name](states[name], key)
            jax.block_until_ready(metrics)
        return run

    medians = interleaved_medians({name: call(name) for name in steps}, rounds=args.rounds,
                                  round_seconds=args.round_seconds)
    per_update = {name: value["wall"] / args.updates_per_call for name, value in medians.items()}
    ratio = per_update["masked 95%"] / per_update["dense"]
    print(f"BC update (256-256, batch 256, {args.updates_per_call} per jitted call): dense "
          f"{per_update['dense'] * 1e6:.0f} µs, masked {per_update['masked 95%'] * 1e6:.0f} µs: {ratio:.3f}× "
          f"(target ≤ 1.10: {'PASS' if ratio <= 1.10 else 'FAIL'})")
    return {"per_update_seconds": per_update, "masked_over_dense": ratio}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few rounds, small data (a smoke test)")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--xla_threads", type=int, default=1)
    parser.add_argument("--dataset_size", type=int, default=100_000)
    parser.add_argument("--updates_per_call", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--round_seconds", type=float, default=1.0)
    args = parser.parse_args()
    if args.quick:
        args.dataset_size, args.rounds, args.round_seconds = 1_000, 2, 0.05

    from qrl import runtime

    runtime.configure_jax(args.xla_threads)
    results = {"memory": memory(args), "masked_cost": masked_cost(args)}
    if args.json:
        from bench.machine import write_json

        from bench.tables import cell

        cells = [cell("policy bytes, 11-256-256-3", f"sparsity {row['sparsity']}", f"{entry['format']} {entry['precision']}",
                      entry["bytes"], "bytes", entry["vs_dense_fp32"]) for row in results["memory"] for entry in row["table"]]
        cost = results["masked_cost"]
        cells += [cell("BC update under a mask", "BC 256-256, batch 256", f"{name} µs", seconds * 1e6, "µs")
                  for name, seconds in cost["per_update_seconds"].items()]
        cells.append(cell("BC update under a mask", "BC 256-256, batch 256", "masked / dense", cost["masked_over_dense"], "×"))
        write_json(args.json, results, threads=args.xla_threads, cells=cells)


if __name__ == "__main__":
    main()
