"""d3rlpy's offline agents (BC, TD3+BC, IQL, BCQ; PyTorch on the CPU): the peer of
bench/offline_throughput.py.

Runs in `.venv-bench` (d3rlpy needs its own torch) and imports nothing from this repository, so
that JAX and PyTorch never time each other in one process. It loads the transitions the benchmark
wrote (`.npz`: observations, actions, rewards, terminals, timeouts), builds d3rlpy's `MDPDataset`
and, per algorithm, the d3rlpy config that matches the qrl sizes it was given (`--specs`: JSON
`{algo: {batch_size, hidden sizes, learning rates, ...}}`). It then serves requests, one JSON line
each on stdin, so the benchmark can alternate rounds with its own side while both processes stay
warm:

    {"algo": "bc", "steps": 2000}  ->  {"algo": "bc", "steps": 2000, "wall": s, "cpu": s, ...}

A round runs d3rlpy's training step as `fit` runs it, without logging or evaluation: draw a batch
from the replay buffer (`sample_transition_batch`, d3rlpy's Python assembly of the batch), then
`algo.update(batch)`. Batch drawing and updates are timed apart as well. The first line printed
is `{"ready": true, "d3rlpy": version, "torch": version, "torch_threads": n}`.

    .venv-bench/bin/python bench/d3rlpy_peer.py --data=/tmp/data.npz --specs='{"bc": {...}}'
"""

import argparse
import json
import os
import sys
import time
from typing import Optional

import d3rlpy
import numpy as np
import torch
from d3rlpy.algos.utility import build_scalers_with_transition_picker
from d3rlpy.models.encoders import VectorEncoderFactory
from d3rlpy.optimizers import AdamFactory
from d3rlpy.optimizers.lr_schedulers import CosineAnnealingLRFactory
from d3rlpy.preprocessing import ReturnBasedRewardScaler, StandardObservationScaler

WARMUP_STEPS = 5


def encoder(hidden_sizes) -> VectorEncoderFactory:
    return VectorEncoderFactory(hidden_units=list(hidden_sizes))


def observation_scaler(spec: dict) -> Optional[StandardObservationScaler]:
    """d3rlpy's `(obs - mean) / std` where the qrl config normalizes observations."""
    return StandardObservationScaler() if spec["normalize_observations"] else None


def make_config(algo: str, spec: dict):
    """The d3rlpy config of `algo` at the sizes and rates of qrl's config (`spec`); d3rlpy's BCQ
    draws `n_action_samples` actions per next state in its target (and when acting)."""
    if algo == "bc":
        return d3rlpy.algos.BCConfig(
            batch_size=spec["batch_size"], learning_rate=spec["learning_rate"], policy_type="deterministic",
            encoder_factory=encoder(spec["hidden_sizes"]), observation_scaler=observation_scaler(spec),
        )
    if algo == "td3_bc":
        return d3rlpy.algos.TD3PlusBCConfig(
            batch_size=spec["batch_size"], actor_learning_rate=spec["actor_learning_rate"],
            critic_learning_rate=spec["critic_learning_rate"], actor_encoder_factory=encoder(spec["hidden_sizes"]),
            critic_encoder_factory=encoder(spec["hidden_sizes"]), alpha=spec["alpha"], tau=spec["tau"],
            gamma=spec["gamma"], target_smoothing_sigma=spec["target_policy_noise"],
            target_smoothing_clip=spec["target_noise_clip"], update_actor_interval=spec["policy_delay"],
            observation_scaler=observation_scaler(spec),
        )
    if algo == "iql":
        cosine = CosineAnnealingLRFactory(T_max=spec["actor_lr_decay_steps"])
        return d3rlpy.algos.IQLConfig(
            batch_size=spec["batch_size"], actor_learning_rate=spec["actor_learning_rate"],
            critic_learning_rate=spec["critic_learning_rate"],
            actor_optim_factory=AdamFactory(lr_scheduler_factory=cosine),
            actor_encoder_factory=encoder(spec["hidden_sizes"]), critic_encoder_factory=encoder(spec["hidden_sizes"]),
            value_encoder_factory=encoder(spec["hidden_sizes"]), expectile=spec["expectile"],
            weight_temp=spec["beta"], max_weight=spec["max_weight"], tau=spec["tau"], gamma=spec["gamma"],
            reward_scaler=ReturnBasedRewardScaler(multiplier=1000.0) if spec["normalize_rewards"] else None,
            observation_scaler=observation_scaler(spec),
        )
    if algo == "bcq":
        return d3rlpy.algos.BCQConfig(
            batch_size=spec["batch_size"], actor_learning_rate=spec["actor_learning_rate"],
            critic_learning_rate=spec["critic_learning_rate"], imitator_learning_rate=spec["vae_learning_rate"],
            actor_encoder_factory=encoder(spec["actor_hidden_sizes"]),
            critic_encoder_factory=encoder(spec["critic_hidden_sizes"]),
            imitator_encoder_factory=encoder(spec["vae_hidden_sizes"]), lam=spec["lmbda"],
            n_action_samples=spec["target_samples"], action_flexibility=spec["phi"], tau=spec["tau"],
            gamma=spec["gamma"], observation_scaler=observation_scaler(spec),
        )
    raise ValueError(f"unknown algorithm {algo!r}")


class Peer:
    """The dataset and, built on first use, one d3rlpy algorithm per requested name."""

    def __init__(self, data_path: str, specs: dict, seed: int):
        with np.load(data_path) as arrays:
            self.dataset = d3rlpy.dataset.MDPDataset(
                observations=arrays["observations"], actions=arrays["actions"], rewards=arrays["rewards"],
                terminals=arrays["terminals"], timeouts=arrays["timeouts"],
            )
        self.specs, self.seed, self.algos = specs, seed, {}

    def algo(self, name: str):
        if name not in self.algos:
            d3rlpy.seed(self.seed)
            algo = make_config(name, self.specs[name]).create(device="cpu:0")
            build_scalers_with_transition_picker(algo, self.dataset)
            algo.build_with_dataset(self.dataset)
            self.run(algo, WARMUP_STEPS)
            self.algos[name] = algo
        return self.algos[name]

    def run(self, algo, steps: int) -> dict:
        """`steps` training steps as `fit` takes them; wall and process CPU seconds."""
        batch_size = algo.config.batch_size
        sample_seconds = 0.0
        cpu_start, wall_start = time.process_time(), time.perf_counter()
        for _ in range(steps):
            sample_start = time.perf_counter()
            batch = self.dataset.sample_transition_batch(batch_size)
            sample_seconds += time.perf_counter() - sample_start
            algo.update(batch)
        wall = time.perf_counter() - wall_start
        return {"wall": wall, "cpu": time.process_time() - cpu_start, "sample_wall": sample_seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help=".npz of observations, actions, rewards, terminals, timeouts")
    parser.add_argument("--specs", required=True, help="JSON {algo: qrl sizes and rates}")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--torch_threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    args = parser.parse_args()
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # d3rlpy's log lines go to stderr, replies stay parseable
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    peer = Peer(args.data, json.loads(args.specs), args.seed)
    print(json.dumps({"ready": True, "d3rlpy": d3rlpy.__version__, "torch": torch.__version__,
                      "torch_threads": torch.get_num_threads()}), file=replies, flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        algo = peer.algo(request["algo"])
        result = peer.run(algo, int(request["steps"]))
        print(json.dumps({"algo": request["algo"], "steps": int(request["steps"]), **result}), file=replies, flush=True)


if __name__ == "__main__":
    main()
