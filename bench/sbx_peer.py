"""sbx-rl PPO or SAC on a gymnasium task at given hyperparameters: the peer run of
bench/train_throughput.py.

Runs in `.venv-bench` (sbx needs its own stable-baselines3 and torch) and imports nothing from
this repository. Hyperparameters arrive as one JSON object (sbx constructor keyword arguments,
plus `n_envs` and `net_arch`; keys listed in `linear` become schedules decaying linearly to 0
as rl-baselines3-zoo's `lin_<value>`). Prints one JSON line: steps/s, train seconds, the
deterministic evaluation and the seconds until the mean of the last 10 training episodes first
reached the threshold.

    .venv-bench/bin/python bench/sbx_peer.py --algo ppo --env CartPole-v1 --steps 100000 \\
        --hyperparameters '{"n_envs": 8, "n_steps": 32}'
"""

import argparse
import json
import time

import gymnasium as gym
import numpy as np
from sbx import PPO, SAC
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.monitor import Monitor

ALGORITHMS = {"ppo": PPO, "sac": SAC}
EVAL_SEED_OFFSET = 1_000_000
RETURN_WINDOW = 10


class ReturnThreshold(BaseCallback):
    """Training seconds when the last 10 episodes' mean return first reaches `threshold`."""

    def __init__(self, threshold: float, check_every: int):
        super().__init__()
        self.threshold, self.check_every = threshold, check_every
        self.start, self.seconds, self.next_check = 0.0, None, check_every

    def _on_training_start(self) -> None:
        self.start = time.perf_counter()

    def _on_step(self) -> bool:
        if self.seconds is None and self.num_timesteps >= self.next_check:
            self.next_check += self.check_every
            returns = [info["r"] for info in self.model.ep_info_buffer][-RETURN_WINDOW:]
            if returns and np.mean(returns) >= self.threshold:
                self.seconds = time.perf_counter() - self.start
        return True


def linear(value: float):
    return lambda progress_remaining: progress_remaining * value


def run(algo: str, env_id: str, steps: int, seed: int, hyperparameters: dict, eval_episodes: int,
        threshold: float, check_every: int) -> dict:
    hyperparameters = dict(hyperparameters)
    n_envs = hyperparameters.pop("n_envs", 1)
    net_arch = hyperparameters.pop("net_arch", [256, 256])
    for key in hyperparameters.pop("linear", []):
        hyperparameters[key] = linear(hyperparameters[key])
    env = make_vec_env(env_id, n_envs=n_envs, seed=seed)
    model = ALGORITHMS[algo]("MlpPolicy", env, policy_kwargs=dict(net_arch=net_arch), seed=seed, verbose=0,
                             **hyperparameters)
    callback = ReturnThreshold(threshold, check_every)
    start = time.perf_counter()
    model.learn(total_timesteps=steps, callback=callback)
    train_seconds = time.perf_counter() - start
    eval_env = Monitor(gym.make(env_id))
    eval_env.reset(seed=seed + EVAL_SEED_OFFSET)
    returns, _ = evaluate_policy(model, eval_env, n_eval_episodes=eval_episodes, deterministic=True,
                                 return_episode_rewards=True)
    return {
        "agent": "sbx",
        "env_steps": int(model.num_timesteps),
        "train_seconds": train_seconds,
        "steps_per_second": model.num_timesteps / train_seconds,
        "eval_mean": float(np.mean(returns)),
        "eval_std": float(np.std(returns)),
        "seconds_to_threshold": callback.seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algo", choices=sorted(ALGORITHMS), required=True)
    parser.add_argument("--env", required=True, help="gymnasium id, e.g. CartPole-v1")
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--hyperparameters", default="{}", help="JSON object of sbx keyword arguments")
    parser.add_argument("--eval-episodes", type=int, default=10)
    parser.add_argument("--threshold", type=float, required=True)
    parser.add_argument("--check-every", type=int, default=1_000)
    args = parser.parse_args()
    print(json.dumps(run(args.algo, args.env, args.steps, args.seed, json.loads(args.hyperparameters),
                         args.eval_episodes, args.threshold, args.check_every)))


if __name__ == "__main__":
    main()
