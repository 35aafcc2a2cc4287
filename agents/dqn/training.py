"""DQN's training loops: on the host for gymnasium, Atari and dm_control environments, on device
for gymnax and brax ids.

Host: per environment step the loop makes one small jitted call (greedy actions for all N envs;
none while every env explores), steps the environments and writes transitions into a numpy
replay. Every `train_freq` environment steps it runs `gradient_steps` updates in one jitted call
on `[K, B, ...]` batches sampled at once — the same schedule as SB3's `train_freq` /
`gradient_steps`, at a fraction of the per-update dispatch cost.

Device (`gymnax:`, `brax:` ids): the whole run is one pure `train(key)` from
`qrl.offpolicy.make_train` (vmappable over seeds; `make_device_train`), with DQN's epsilon-greedy
acting (`device_agent`) and the host loop's update function. One difference from the host loop:
the first `learning_starts` steps act uniformly at random (as SB3 and rejax do) where the host
loop already acts epsilon-greedily.
"""

import functools
from typing import Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np

from agents.dqn import acting, learning
from agents.dqn.config import Config
from qrl import envs, offpolicy
from qrl.envs.functional import FunctionalEnv, is_device_id
from qrl.errors import QrlInputError
from qrl.offpolicy import OffPolicyAgent, TransitionRecorder
from qrl.quant import check_quant_delay, make_exporter, serving_precision
from qrl.replay import UniformReplay
from qrl.run_monitor import HostStart, TrainingMonitor


def check_env(env_id: str, action_spec) -> None:
    """DQN needs discrete actions."""
    if not envs.is_discrete(action_spec):
        raise QrlInputError(f"agent dqn needs discrete actions; {env_id} has continuous actions")


def device_agent(config: Config, observation_spec, action_spec, steps: int) -> OffPolicyAgent:
    """DQN's pure functions for the on-device loop, for a run of `steps` environment steps:
    epsilon-greedy acting on the host loop's linear schedule (`acting.epsilon_schedule`), the
    greedy policy, and the host loop's K fused updates (`learning.make_update`, its learning-rate
    schedule over the run's updates)."""
    shape, num_actions = tuple(observation_spec.shape), envs.num_actions(action_spec)
    network = learning.make_network(config, shape, num_actions)
    update = learning.make_update(network, config, learning.total_updates(config, steps))
    greedy = acting.make_greedy_policy(network)
    epsilon_at = acting.epsilon_schedule(config, steps, minimum=jnp.minimum)

    def random_act(key: jax.Array, num_envs: int) -> jax.Array:
        return jax.random.randint(key, (num_envs,), 0, num_actions, jnp.int32)

    def explore(key: jax.Array, num_envs: int, env_steps: jax.Array) -> dict:
        """Which envs explore at `env_steps` (epsilon as on the host), and their random actions."""
        explore_key, action_key = jax.random.split(key)
        return {"explore": jax.random.uniform(explore_key, (num_envs,)) < epsilon_at(env_steps),
                "actions": random_act(action_key, num_envs)}

    def act(params: dict, observations: jax.Array, noise: dict) -> jax.Array:
        return jnp.where(noise["explore"], noise["actions"], greedy(params, observations))

    return OffPolicyAgent(
        name="dqn",
        init=lambda key: learning.init(key, config, shape, observation_spec.dtype, num_actions),
        act=lambda precision: act,
        policy=lambda precision: greedy,
        update=lambda precision: update,
        policy_params=lambda state: state.params,
        update_count=lambda state: state.updates,
        explore=explore,
        random_act=random_act,
    )


def check_config(env_id: str, config: Config) -> None:
    """What DQN cannot do with `config` on `env_id`: on device (gymnax, brax ids), quantization-
    aware training. Raises `QrlInputError`; entry points call it before writing anything."""
    if is_device_id(env_id) and config.qat_bits:
        raise QrlInputError(f"DQN on {env_id} trains on device, at float precision only: qat_bits needs a host env id "
                            "(gym:, atari:, dmc:)")


def make_device_train(
    config: Config, env: FunctionalEnv, steps: int, eval_env: Optional[FunctionalEnv] = None
) -> Callable[[jax.Array], tuple[learning.TrainState, dict]]:
    """`train(key) -> (state, summary)`: a whole DQN run of `steps` environment steps in `env`
    (N functional environments) on device; pure — jit it, vmap it over keys (seeds). See
    `qrl.offpolicy.make_train` for the summary."""
    check_env("device env", env.action_spec())
    agent = device_agent(config, env.observation_spec(), env.action_spec(), steps)
    return offpolicy.make_train(agent, config, env, steps, eval_env)


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

    `gymnax:` and `brax:` ids train on device in one compiled call (`make_device_train`): no
    `eval_every`, checkpoints only at the end, no resume, no QAT.
    """
    if steps < 1:
        raise QrlInputError(f"steps must be >= 1, got {steps}")
    if is_device_id(env_id):
        if start is not None:
            raise QrlInputError(f"{env_id} trains on device in one compiled call, which cannot resume")
        check_config(env_id, config)
        build = functools.partial(device_agent, steps=steps)
        return offpolicy.train_on_device(build, check_env, config, env_id, steps, seed, workdir, num_envs,
                                         eval_episodes, progress, env_options)
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
