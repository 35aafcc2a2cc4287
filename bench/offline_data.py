"""Offline datasets on this machine: what generating them costs and returns, and what sampling costs.

    .venv/bin/python -m bench.offline_data sampling [--quick] [--json=PATH]
    .venv/bin/python -m bench.offline_data generation --envs=gym:Hopper-v5 --sac_steps=200000 \\
        --size=200000 --workdir=runs/bench_offline [--set=matmul_dtype=bf16] [--json=PATH]

`sampling`: a Hopper-sized on-device dataset (11-dim observations, 3-dim actions, 1M
transitions by default). Three jitted programs, each `K` steps under one `lax.scan`, timed
round-robin in one process (`bench.timing`): K batches of 256 sampled (`qrl.datasets.sample`),
K behaviour-cloning updates on batches sampled beforehand (a 256-256 ReLU actor, MSE to the
dataset's actions, Adam 3e-4: the BC of the pruning study), and K updates that sample their own
batch (the fused loop an offline agent runs). Target: one sample < 5% of one BC update.

`generation`: `qrl.datasets.generate` per env (SAC trained once, as `launch.make_dataset`): the
training's wall time, then the random / medium / expert / medium-replay levels of `--size`
transitions, each level's wall time and the sampled return of its policy (mean over the level's
complete episodes), and the random / expert reference returns (100 episodes). Workdirs are
reused, so a second call reports what the first measured (levels come from their cache).
"""

import argparse
import os
import time

import numpy as np

LEVELS = ("random", "medium", "expert", "medium-replay")


def sampling(args) -> dict:
    import flax.linen as nn
    import jax
    import jax.numpy as jnp
    import optax

    from bench.timing import interleaved_medians
    from qrl.datasets import from_qlearning, sample
    from qrl.networks.torsos import MLP

    size, batch, steps = args.dataset_size, 256, args.scan_steps
    rng = np.random.default_rng(0)
    arrays = {"observations": rng.normal(size=(size, 11)).astype(np.float32),
              "actions": rng.uniform(-1, 1, size=(size, 3)).astype(np.float32),
              "rewards": rng.normal(size=size).astype(np.float32),
              "terminals": rng.uniform(size=size) < 0.001,
              "next_observations": rng.normal(size=(size, 11)).astype(np.float32)}
    dataset = from_qlearning(arrays)

    class Actor(nn.Module):
        @nn.compact
        def __call__(self, observations):
            return jnp.tanh(nn.Dense(3)(MLP((256, 256))(observations)))

    actor = Actor()
    optimizer = optax.adam(3e-4)
    params = actor.init(jax.random.PRNGKey(0), jnp.zeros((1, 11)))["params"]
    opt_state = optimizer.init(params)

    def bc_update(carry, batch_):
        params_, opt_state_ = carry

        def loss(p):
            return jnp.mean((actor.apply({"params": p}, batch_.observation) - batch_.action) ** 2)

        value, grads = jax.value_and_grad(loss)(params_)
        updates, opt_state_ = optimizer.update(grads, opt_state_, params_)
        return (optax.apply_updates(params_, updates), opt_state_), value

    @jax.jit
    def sample_only(key):
        def body(total, step_key):
            drawn = sample(dataset, step_key, batch)
            # every field read in full, so XLA cannot drop any part of the gather
            return total + sum(leaf.sum() for leaf in jax.tree.leaves(drawn)), None

        total, _ = jax.lax.scan(body, 0.0, jax.random.split(key, steps))
        return total

    @jax.jit
    def updates_only(carry, batches):
        return jax.lax.scan(bc_update, carry, batches)

    @jax.jit
    def updates_sampling(carry, key):
        def body(inner, step_key):
            return bc_update(inner, jax.tree.map(lambda x: x[0], sample(dataset, step_key, batch)))

        return jax.lax.scan(body, carry, jax.random.split(key, steps))

    key = jax.random.PRNGKey(1)
    presampled = jax.tree.map(lambda x: x.reshape((steps, batch) + x.shape[2:]), sample(dataset, key, batch, steps))
    carry = (params, opt_state)
    candidates = {
        "sample": lambda: sample_only(key).block_until_ready(),
        "bc_update": lambda: jax.block_until_ready(updates_only(carry, presampled)),
        "bc_update_sampling": lambda: jax.block_until_ready(updates_sampling(carry, key)),
    }
    medians = interleaved_medians(candidates, rounds=args.rounds, round_seconds=args.round_seconds)
    per_step = {name: value["wall"] / steps for name, value in medians.items()}
    ratio = per_step["sample"] / per_step["bc_update"]
    overhead = per_step["bc_update_sampling"] / per_step["bc_update"] - 1.0
    print(f"dataset {size} transitions (11-dim obs, 3-dim actions), batch {batch}, {steps} steps per jitted call, "
          f"XLA threads {args.xla_threads}")
    for name, seconds in per_step.items():
        print(f"  {name:<20} {seconds * 1e6:9.1f} µs per step")
    print(f"sample / BC update      {ratio:.3f}  (target < 0.05: {'PASS' if ratio < 0.05 else 'FAIL'})")
    print(f"fused loop vs presampled updates: {overhead * 100:+.1f}%")
    return {"per_step_seconds": per_step, "sample_over_update": ratio, "fused_overhead": overhead,
            "dataset_size": size, "batch_size": batch, "scan_steps": steps}


def generation(args) -> dict:
    from agents import sac
    from launch import common
    from launch.make_dataset import env_slug
    from qrl.datasets import d4rl, generate

    rows = []
    for env_id in args.envs.split(","):
        config = sac.config_for(env_id, common.parse_overrides(args.set))
        workdir = os.path.join(args.workdir, f"{env_slug(env_id)}-seed{args.seed}")
        behavior = generate.BehaviorRun(sac.AGENT, config, env_id, args.sac_steps, args.seed, workdir,
                                        checkpoint_every=args.checkpoint_every)
        record = behavior.train(progress=args.progress)
        references = record["references"]
        medium = behavior.medium_checkpoint()
        row = {"env": env_id, "sac_steps": args.sac_steps, "train_seconds": record["train_seconds"],
               "random_reference": references["random"]["return_mean"],
               "expert_reference": references["expert"]["return_mean"],
               "medium_step": medium["step"], "levels": {}}
        for level in LEVELS:
            started = time.perf_counter()
            arrays = behavior.level_arrays(level, None if level == "medium-replay" else args.size,
                                           num_envs=args.num_envs)
            metadata = arrays["metadata"]
            row["levels"][level] = {
                "transitions": int(len(arrays["rewards"])),
                "seconds": float(d4rl.metadata_value(metadata, "generation_seconds")),
                "seconds_this_call": time.perf_counter() - started,
                "policy_return": float(d4rl.metadata_value(metadata, "policy_return")),
                "policy_step": d4rl.metadata_value(metadata, "policy_step"),
            }
        rows.append(row)
        print(f"{env_id}: SAC {args.sac_steps} steps in {row['train_seconds'] / 60:.1f} min; references random "
              f"{row['random_reference']:.1f}, expert {row['expert_reference']:.1f} (100 episodes); "
              f"medium = step {medium['step']}")
        for level, values in row["levels"].items():
            print(f"  {level:<14} {values['transitions']:>8} transitions  {values['seconds']:7.1f} s  "
                  f"policy return {values['policy_return']:9.1f}  (policy step {values['policy_step']})")
    return {"generation": rows}


def headline_cells(results: dict) -> list[dict]:
    """The README's figures (`bench.tables` cells): µs per step of sampling and updates, and the
    sample / update ratio; or per env the SAC training minutes and each level's seconds."""
    from bench.tables import cell

    if "per_step_seconds" in results:
        cells = [cell("offline sampling", name, "µs per step", seconds * 1e6, "µs")
                 for name, seconds in results["per_step_seconds"].items()]
        return cells + [cell("offline sampling", "sample / BC update", "ratio", results["sample_over_update"], "×")]
    cells = []
    for row in results["generation"]:
        cells.append(cell("dataset generation", row["env"], "SAC minutes", row["train_seconds"] / 60, "min"))
        cells += [cell("dataset generation", row["env"], f"{level} s", values["seconds"], "s")
                  for level, values in row["levels"].items()]
    return cells


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("part", choices=("sampling", "generation"))
    parser.add_argument("--quick", action="store_true", help="small sizes and few rounds (a smoke test)")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--xla_threads", type=int, default=1)
    parser.add_argument("--dataset_size", type=int, default=1_000_000)
    parser.add_argument("--scan_steps", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--round_seconds", type=float, default=1.0)
    parser.add_argument("--envs", default="gym:HalfCheetah-v5,gym:Hopper-v5,gym:Walker2d-v5")
    parser.add_argument("--sac_steps", type=int, default=200_000)
    parser.add_argument("--checkpoint_every", type=int, default=10_000)
    parser.add_argument("--size", type=int, default=200_000)
    parser.add_argument("--num_envs", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workdir", default="runs/bench_offline")
    parser.add_argument("--set", action="append", default=[], help="SAC config override key=value")
    parser.add_argument("--progress", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.dataset_size, args.scan_steps, args.rounds, args.round_seconds = 10_000, 10, 2, 0.05

    from qrl import runtime

    runtime.configure_jax(args.xla_threads)
    results = sampling(args) if args.part == "sampling" else generation(args)
    if args.json:
        from bench.machine import write_json

        write_json(args.json, results, threads=args.xla_threads, cells=headline_cells(results))


if __name__ == "__main__":
    main()
