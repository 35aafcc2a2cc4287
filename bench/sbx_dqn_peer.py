"""sbx-rl DQN on gymnasium CartPole-v1 at fixed hyperparameters: the peer run.

`--setting zoo` trains at rl-baselines3-zoo's CartPole hyperparameters (train_freq 256, gradient
steps 128); `--setting nature` at the Nature-DQN update ratio (one update of batch 32 every 4
environment steps, lr 1e-4, buffer 50k, target copied every 1000 environment steps). The values
match `SETTINGS` in bench/dqn_throughput.py. Runs in `.venv-bench` (sbx needs its own
stable-baselines3 and torch) and imports nothing from this repository. Prints one JSON line with
steps/s, train seconds, the greedy evaluation and the seconds until the mean of the last 10
training episodes first reached the return threshold.

    .venv-bench/bin/python bench/sbx_dqn_peer.py --setting nature --steps 50000 --seed 0
"""

import argparse
import json
import time

import gymnasium as gym
import numpy as np
import optax
from sbx import DQN
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.monitor import Monitor

ENV_ID = "CartPole-v1"
EVAL_SEED_OFFSET = 1_000_000
RETURN_WINDOW = 10
MAX_GRAD_NORM = 10.0  # SB3 DQN's default; sbx leaves clipping out, qrl keeps it.

# rl-baselines3-zoo hyperparams/dqn.yml, CartPole-v1.
ZOO_HYPERPARAMETERS = dict(
    learning_rate=2.3e-3,
    batch_size=64,
    buffer_size=100_000,
    learning_starts=1_000,
    gamma=0.99,
    target_update_interval=10,
    train_freq=256,
    gradient_steps=128,
    exploration_fraction=0.16,
    exploration_final_eps=0.04,
)

# Nature DQN's update ratio (Mnih et al. 2015) with SB3's DQN defaults, scaled to CartPole.
NATURE_HYPERPARAMETERS = dict(
    learning_rate=1e-4,
    batch_size=32,
    buffer_size=50_000,
    learning_starts=1_000,
    gamma=0.99,
    target_update_interval=1_000,
    train_freq=4,
    gradient_steps=1,
    exploration_fraction=0.1,
    exploration_final_eps=0.05,
)

SETTINGS = {"zoo": ZOO_HYPERPARAMETERS, "nature": NATURE_HYPERPARAMETERS}


def clipped_adam(learning_rate: float) -> optax.GradientTransformation:
    """Adam after global-norm clipping, as SB3's torch DQN and qrl's DQN optimize."""
    return optax.chain(optax.clip_by_global_norm(MAX_GRAD_NORM), optax.adam(learning_rate))


class ReturnThreshold(BaseCallback):
    """Notes the training seconds when the last 10 episodes' mean return first reaches a threshold.

    Checked every `check_every` environment steps, like qrl's metrics rows.
    """

    def __init__(self, threshold: float, check_every: int):
        super().__init__()
        self.threshold = threshold
        self.check_every = check_every
        self.start = 0.0
        self.seconds: float | None = None

    def _on_training_start(self) -> None:
        self.start = time.perf_counter()

    def _on_step(self) -> bool:
        if self.seconds is None and self.num_timesteps % self.check_every == 0:
            returns = [info["r"] for info in self.model.ep_info_buffer][-RETURN_WINDOW:]
            if returns and np.mean(returns) >= self.threshold:
                self.seconds = time.perf_counter() - self.start
        return True


def run(setting: str, steps: int, seed: int, eval_episodes: int, threshold: float, check_every: int) -> dict:
    """Trains sbx DQN at `setting` for `steps` environment steps and evaluates it greedily."""
    model = DQN(
        "MlpPolicy",
        gym.make(ENV_ID),
        policy_kwargs=dict(net_arch=[256, 256], optimizer_class=clipped_adam),
        seed=seed,
        verbose=0,
        **SETTINGS[setting],
    )
    callback = ReturnThreshold(threshold, check_every)
    start = time.perf_counter()
    model.learn(total_timesteps=steps, callback=callback)
    train_seconds = time.perf_counter() - start
    eval_env = Monitor(gym.make(ENV_ID))
    eval_env.reset(seed=seed + EVAL_SEED_OFFSET)
    returns, _ = evaluate_policy(
        model, eval_env, n_eval_episodes=eval_episodes, deterministic=True, return_episode_rewards=True
    )
    return {
        "agent": "sbx",
        "env_steps": int(model.num_timesteps),
        "updates": int(model._n_updates),
        "train_seconds": train_seconds,
        "steps_per_second": model.num_timesteps / train_seconds,
        "eval_mean": float(np.mean(returns)),
        "eval_std": float(np.std(returns)),
        "seconds_to_threshold": callback.seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--setting", choices=sorted(SETTINGS), default="zoo")
    parser.add_argument("--steps", type=int, default=50_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eval-episodes", type=int, default=10)
    parser.add_argument("--threshold", type=float, default=195.0)
    parser.add_argument("--check-every", type=int, default=1_000)
    args = parser.parse_args()
    print(json.dumps(run(args.setting, args.steps, args.seed, args.eval_episodes, args.threshold, args.check_every)))


if __name__ == "__main__":
    main()
