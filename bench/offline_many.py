"""Many pruned configurations in one program against the same configurations run one by one.

    .venv/bin/python -m bench.offline_many [--algo=bc] [--configs=8,32] [--steps=2000] [--quick] [--json=PATH]

For each C in `--configs`: C (seed, mask) configurations of one offline agent (the pruning study's
sizes by default: BC 256-256, batch 256; `--algo=bcq`: the reference's BCQ), masks from the
random pruner at 95% (configuration 0 dense), on a synthetic Hopper-shaped dataset (200k
transitions), each trained `--steps` updates and evaluated once at the end (`--eval_episodes` in
gym:Hopper-v5):
- sequential: `agent.train(...)` per configuration, as a study cell runs it (its own compile,
  its own evaluation), one after another;
- one program: `qrl.offline_many.train_many` over all C (one compile, C x E episodes per
  evaluation step).
Both run in this process on the same XLA threads (`--xla_threads`, default 1 as the study's
cells); the sequential arm is timed on min(C, `--sequential_cap`) configurations and scaled to C.
Prints the wall time of each arm and the ratio sequential / one program, the grid's throughput gain.
The two arms' final params are compared (max |difference|): they agree up to float rounding, which
Adam's steps let grow over a run (`qrl.offline_many`).
"""

import argparse
import time

import numpy as np

from bench.machine import describe, record


def synthetic_hopper(size: int, seed: int = 0):
    from qrl.datasets import from_qlearning

    rng = np.random.default_rng(seed)
    return from_qlearning({
        "observations": rng.normal(size=(size, 11)).astype(np.float32),
        "actions": rng.uniform(-1.0, 1.0, (size, 3)).astype(np.float32),
        "rewards": rng.normal(size=size).astype(np.float32),
        "terminals": rng.random(size) < 0.001,
        "next_observations": rng.normal(size=(size, 11)).astype(np.float32),
    })


def run(args) -> dict:
    import jax

    from agents import get_offline_agent
    from pruning import PruneSettings, prune_networks
    from qrl import offline, runtime
    from qrl.offline_many import train_many

    runtime.configure_jax(args.xla_threads)
    env_id = "gym:Hopper-v5"
    algo = get_offline_agent(args.algo)
    config = algo.config_for(dict(item.split("=", 1) for item in args.set))
    dataset = synthetic_hopper(args.dataset_size)
    observation_spec, action_spec = offline.env_specs(env_id)
    networks = algo.learning.networks_at_init(algo.build(config, observation_spec, action_spec).init(jax.random.PRNGKey(0)))
    rows = []
    host = record(threads=args.xla_threads)
    print(f"{describe(host)}\n{args.algo}, {args.steps} updates per configuration, batch {config.batch_size}, "
          f"{args.eval_episodes} evaluation episodes at the end, {args.xla_threads} XLA thread(s)")
    for count in args.configs:
        seeds = list(range(count))
        masks = [None] + [prune_networks("random", networks, {}, [], PruneSettings(sparsity=0.95),
                                         key=jax.random.PRNGKey(100 + c)) for c in range(1, count)]
        start = time.perf_counter()
        states, _ = train_many(algo.build, dataset, env_id, config, args.steps, seeds, masks, eval_every=0,
                               eval_episodes=args.eval_episodes, progress=False)
        jax.block_until_ready(states)
        many_seconds = time.perf_counter() - start
        timed = min(count, args.sequential_cap)
        start = time.perf_counter()
        difference = 0.0
        for c in range(timed):
            state, _ = algo.train(dataset, env_id, config, args.steps, seeds[c], mask=masks[c], eval_every=0,
                                  eval_episodes=args.eval_episodes, progress=False)
            mine = jax.tree.map(lambda leaf, c=c: leaf[c], states)
            difference = max(difference, max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
                                             for a, b in zip(jax.tree.leaves(algo.learning.policy_params(state)),
                                                             jax.tree.leaves(algo.learning.policy_params(mine)))))
        sequential_seconds = (time.perf_counter() - start) * count / timed
        row = {"configurations": count, "one_program_seconds": many_seconds, "sequential_seconds": sequential_seconds,
               "sequential_timed": timed, "gain": sequential_seconds / many_seconds,
               "max_param_difference": difference}
        rows.append(row)
        print(f"C={count:>3}: one program {many_seconds:7.1f} s, sequential {sequential_seconds:7.1f} s "
              f"({'timed' if timed == count else f'{timed} timed, scaled'}): gain {row['gain']:.2f}x "
              f"(goal >= 3x at 8); max |param difference| {difference:.1e}")
    return {"machine": host, "algo": args.algo, "steps": args.steps, "rows": rows,
            "config": config.to_dict(), "xla_threads": args.xla_threads}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algo", default="bc")
    parser.add_argument("--configs", default="8,32")
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--eval_episodes", type=int, default=10)
    parser.add_argument("--dataset_size", type=int, default=200_000)
    parser.add_argument("--sequential_cap", type=int, default=8)
    parser.add_argument("--xla_threads", type=int, default=1)
    parser.add_argument("--set", action="append", default=[], help="agent config override key=value")
    parser.add_argument("--quick", action="store_true", help="tiny sizes (a smoke test)")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    args.configs = [int(item) for item in args.configs.split(",")]
    if args.quick:
        args.configs, args.steps, args.eval_episodes, args.dataset_size = [2], 20, 1, 1000
        args.set = args.set + ["hidden_sizes=16-16", "batch_size=16"] if args.algo == "bc" else args.set
    results = run(args)
    if args.json:
        from bench.machine import write_json

        from bench.tables import cell

        table = f"{results['algo']} configurations as one program, {results['steps']} updates"
        cells = []
        for row in results["rows"]:
            name = f"{row['configurations']} configurations"
            cells += [cell(table, name, "one program s", row["one_program_seconds"], "s"),
                      cell(table, name, "sequential s", row["sequential_seconds"], "s"),
                      cell(table, name, "gain", row["gain"], "×")]
        write_json(args.json, results, threads=args.xla_threads, cells=cells)


if __name__ == "__main__":
    main()
