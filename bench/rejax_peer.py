"""rejax's DQN or PPO on a gymnax task at given hyperparameters: the peer run of
bench/train_throughput.py's on-device cases.

Runs in `.venv-bench` (`make bench-deps` installs rejax) and imports nothing from this
repository. Hyperparameters arrive as one JSON object of `rejax.DQN.create` / `rejax.PPO.create`
keyword arguments. The whole run is rejax's own `algo.train` under one `jax.jit`, compiled first
and then timed (compilation excluded, as qrl's on-device runs report it), with one evaluation
at the end (`eval_freq` = the run's steps). Prints one JSON line: steps/s, train and compile
seconds, the evaluation's mean return over its episodes (rejax evaluates 128).

rejax 0.1.3 reads gymnax's steps as `(obs, state, reward, done, info)`; gymnax 1.x returns
`terminated` and `truncated` separately, so the env is wrapped to pass `done = terminated or
truncated`, what rejax's own gymnax version returned.

    .venv-bench/bin/python bench/rejax_peer.py --algo dqn --env CartPole-v1 --steps 100000 \\
        --hyperparameters '{"num_envs": 10, "batch_size": 100}'
"""

import argparse
import json
import time

import gymnax
import jax
import jax.numpy as jnp
import numpy as np
from rejax import DQN, PPO

ALGORITHMS = {"dqn": DQN, "ppo": PPO}


class DoneStep:
    """A gymnax env whose `step` returns `(obs, state, reward, done, info)`."""

    def __init__(self, env):
        self.env = env

    def __getattr__(self, name):
        if name == "env":  # before __init__ ran (copy, deepcopy): no recursion into self.env.
            raise AttributeError(name)
        return getattr(self.env, name)

    def step(self, key, state, action, params=None):
        obs, state, reward, terminated, truncated, info = self.env.step(key, state, action, params)
        return obs, state, reward, jnp.logical_or(terminated, truncated), info


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algo", choices=sorted(ALGORITHMS), required=True)
    parser.add_argument("--env", required=True, help="gymnax id, e.g. CartPole-v1")
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--hyperparameters", default="{}")
    parser.add_argument("--eval-episodes", type=int, default=10, help="unused: rejax evaluates 128 episodes")
    parser.add_argument("--threshold", type=float, default=None, help="unused: one evaluation at the end")
    args = parser.parse_args()

    env, env_params = gymnax.make(args.env)
    config = {**json.loads(args.hyperparameters), "env": DoneStep(env), "env_params": env_params,
              "total_timesteps": args.steps, "eval_freq": args.steps, "skip_initial_evaluation": True}
    algo = ALGORITHMS[args.algo].create(**config)
    key = jax.random.PRNGKey(args.seed)
    started = time.perf_counter()
    compiled = jax.jit(algo.train).lower(key).compile()
    compile_seconds = time.perf_counter() - started
    started = time.perf_counter()
    _, (lengths, returns) = jax.block_until_ready(compiled(key))
    train_seconds = time.perf_counter() - started
    final = np.asarray(returns)[-1]
    print(json.dumps({
        "env_steps": args.steps, "train_seconds": train_seconds, "compile_seconds": compile_seconds,
        "steps_per_second": args.steps / train_seconds, "eval_mean": float(final.mean()),
        "eval_std": float(final.std()), "seconds_to_threshold": None, "eval_episodes": int(final.size),
    }))


if __name__ == "__main__":
    main()
