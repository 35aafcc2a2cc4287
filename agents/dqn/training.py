"""DQN's host training loop for gymnasium, Atari and dm_control environments.

Per environment step the loop makes one small jitted call (greedy actions for all N envs; none
while every env explores), steps the environments and writes transitions into a numpy replay.
Every `train_freq` environment steps it runs `gradient_steps` updates in one jitted call on
`[K, B, ...]` batches sampled at once — the same schedule as SB3's `train_freq` /
`gradient_steps`, at a fraction of the per-update dispatch cost.
"""

from typing import Callable, Optional

import jax
import numpy as np

from agents.dqn import acting, learning
from agents.dqn.config import Config
from qrl import envs
from qrl.errors import QrlInputError
from qrl.offpolicy import TransitionRecorder
from qrl.quant import check_quant_delay, make_exporter, serving_precision
from qrl.replay import UniformReplay
from qrl.run_monitor import HostStart, TrainingMonitor


def check_env(env_id: str, action_spec) -> None:
    """DQN needs discrete actions."""
    if not envs.is_discrete(action_spec):
        raise QrlInputError(f"agent dqn needs discrete actions; {env_id} has continuous actions")


def make_greedy_policy_fn(network, params_ref: Callable[[], dict]) -> Callable[[np.ndarray], np.ndarray]:
    """A numpy-in/numpy-out greedy policy reading the current params through `params_ref`."""
    greedy = jax.jit(acting.make_greedy_policy(network))
    return lambda observations: np.asarray(greedy(params_ref(), observations))


def train(
    env_id: str,
    config: Config,
    steps: int,
    seed: int = 0,
    workdir: Optional[str] = None,
    num_envs: int = 1,
    eval_episodes: int = 10,
    eval_every: int = 0,
    checkpoint_every: int = 0,
    log_every: int = 1_000,
    progress: bool = True,
    env_options: Optional[dict] = None,
    start: Optional[HostStart] = None,
) -> tuple[learning.TrainState, dict]:
    """Trains DQN for `steps` environment steps; returns the final state and a results dict.

    With a `workdir`, writes `metrics.csv`, TensorBoard events under `tb/` and orbax checkpoints
    under `checkpoints/` (every `checkpoint_every` steps when > 0, and at the end). Every
    `eval_every` steps (when > 0) and at the end, the greedy policy is evaluated over
    `eval_episodes` episodes seeded from `seed + 1_000_000`. With `config.qat_bits`, the
    Q-network trains float for `config.quant_delay` updates (its activation ranges tracked),
    then fake-quantized (`qrl.quant.qat`; the switch waits for the end of a training phase of
    `gradient_steps` updates), and from then on acts and is evaluated as its static `int<N>`
    export with the trained ranges.

    `start` resumes a run from a saved state at `start.env_steps`: the environments restart and
    the replay refills from scratch (updates wait for `learning_starts` new steps again).
    """
    if steps < 1:
        raise QrlInputError(f"steps must be >= 1, got {steps}")
    env_options = env_options or {}
    vector_env = envs.make_vector(env_id, num_envs, seed, **env_options)
    observation_spec, action_spec = vector_env.observation_spec(), vector_env.action_spec()
    check_env(env_id, action_spec)
    observation_shape = tuple(observation_spec.shape)
    num_actions = envs.num_actions(action_spec)

    if start is None:
        state = learning.init(jax.random.PRNGKey(seed), config, observation_shape, observation_spec.dtype, num_actions)
    else:
        state = start.state
    num_updates = learning.total_updates(config, steps)
    fp32_network = learning.make_network(config, observation_shape, num_actions)
    update = learning.make_update(fp32_network, config, num_updates)
    policy = make_greedy_policy_fn(fp32_network, lambda: acting_params)
    acting_params = state.params
    updates_taken = int(state.updates)
    if config.qat_bits:
        # Updates: float during the delay (ranges tracked), then fake-quantized. Acting (and
        # evaluation) once quantized: the int<N> export after every training phase — the
        # deployed numerics, cheaper per step than fake-quantizing the kernels on every call.
        check_quant_delay(config.quant_delay, num_updates)
        update = learning.make_update(
            learning.qat_network(config, observation_shape, num_actions, quantize=False), config, num_updates
        )
        qat_update = learning.make_update(learning.qat_network(config, observation_shape, num_actions), config, num_updates)
        export = make_exporter(config.qat_bits)
        qat_policy = make_greedy_policy_fn(
            learning.make_network(config, observation_shape, num_actions, serving_precision(config.qat_bits)),
            lambda: acting_params,
        )

    def quantizing() -> bool:
        return bool(config.qat_bits) and updates_taken >= config.quant_delay

    trained_quantized = bool(config.qat_bits) and updates_taken > config.quant_delay  # a resumed QAT run.

    def refresh_acting():
        nonlocal policy, acting_params
        if trained_quantized:
            policy, acting_params = qat_policy, export(state.params, state.quant_ranges)
        else:
            acting_params = state.params

    refresh_acting()
    env_steps = 0 if start is None else int(start.env_steps)
    epsilon_at = acting.epsilon_schedule(config, steps)

    replay = UniformReplay(config.buffer_size, seed=seed)
    if start is not None and start.replay is not None:
        replay.add_batch(start.replay)
    recorder = TransitionRecorder(replay, num_envs, config.n_step, config.gamma)
    rng = np.random.default_rng(seed)
    monitor = TrainingMonitor(
        "dqn", env_id, steps, seed, workdir, lambda observations: policy(observations),
        eval_episodes, eval_every, checkpoint_every, log_every, progress, env_options,
        start_steps=env_steps, evaluations=() if start is None else start.evaluations,
    )

    next_train = max(config.learning_starts, config.train_freq)
    if start is not None and start.replay is None:
        # The replay refills from scratch: updates wait for `learning_starts` new steps again.
        next_train += env_steps
    while next_train <= env_steps:
        next_train += config.train_freq
    observations = vector_env.reset()
    while env_steps < steps:
        epsilon = epsilon_at(env_steps)
        explore = rng.random(num_envs) < epsilon
        if explore.all():
            actions = rng.integers(0, num_actions, num_envs)
        else:
            actions = policy(observations)
            if explore.any():
                actions = np.where(explore, rng.integers(0, num_actions, num_envs), actions)
        timestep = vector_env.step(actions)
        recorder.record(observations, actions, timestep, monitor)
        observations = timestep.observation
        env_steps += num_envs

        train_metrics = None
        if env_steps >= next_train and len(replay) >= config.batch_size:
            while next_train <= env_steps:
                trained_quantized = quantizing()
                phase_update = qat_update if trained_quantized else update
                state, train_metrics = phase_update(state, replay.sample(config.batch_size, config.gradient_steps))
                updates_taken += config.gradient_steps
                next_train += config.train_freq
            refresh_acting()
        monitor.step(env_steps, state, train_metrics, config, extra_metrics={"epsilon": epsilon})

    vector_env.close()
    results = monitor.finish(
        env_steps, state, config, updates=int(state.updates),
        extra={"qat_bits": config.qat_bits, "quant_delay": config.quant_delay},
    )
    return state, results
