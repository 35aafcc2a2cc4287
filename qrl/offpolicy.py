"""The continuous-action off-policy training loops (DDPG, TD3, SAC, D4PG), over any agent's
init / act / update functions.

An agent hands the loops an `OffPolicyAgent`: pure functions built for one config and one pair
of environment specs. Two paths run them:

- `train_host` (gymnasium, dm_control; device ids stepped from the host through
  `qrl.envs.DeviceBatchVector`, as dataset generation does): N host environments, a numpy replay
  (`qrl.replay.UniformReplay`, `NStepAccumulator`), one small jitted action call per
  environment step (the exploration noise is drawn on the host and passed in, so the call
  holds no key), and `gradient_steps` updates fused into one jitted `lax.scan` every
  `train_freq` environment steps (SB3's schedule); uniformly random actions for the first
  `learning_starts` steps.
- `make_train` (brax, gymnax): the whole run as one pure `train(key)` (vmappable over seeds)
  with a device replay (`qrl.replay.DeviceReplay`) written by `lax.dynamic_update_slice`, an
  on-device n-step window, and the same update functions.

`train` picks the path from the environment id; `AgentFunctions` turns an agent's learning and
acting functions into what its package exposes; DQN's host loop shares `TransitionRecorder`.
Agents' configs provide the fields the loops read: `batch_size`, `buffer_size`,
`learning_starts`, `train_freq`, `gradient_steps`, `n_step`, `gamma`, `qat_bits`,
`quant_delay`, and `to_dict()`.
"""

import dataclasses
import os
import time
from typing import Any, Callable, Optional

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax

from qrl import envs
from qrl.checkpointing import Checkpointer
from qrl.envs.functional import FunctionalEnv, episode_returns, is_device_id, make_functional
from qrl.errors import QrlInputError
from qrl.logging import MetricsLogger
from qrl.networks.continuous import bounds as action_bounds, compute_params
from qrl import config as qrl_config
from qrl.quant import (
    FP32, Precision, check_quant_delay, init_ranges, make_exporter, parse_precision, qat_precision, serving_precision,
)
from qrl.quant.qat import range_roles
from qrl.quant.sweep import PolicySpec
from qrl.replay import DeviceReplay, NStepAccumulator, Transition, UniformReplay, nstep_window_init, nstep_window_push
from qrl.run_monitor import RECENT_EPISODES, HostStart, TrainingMonitor

ActFn = Callable[[Any, jax.Array, jax.Array], jax.Array]
PolicyFn = Callable[[Any, jax.Array], jax.Array]
UpdateFn = Callable[[Any, Transition], tuple[Any, dict]]


@dataclasses.dataclass(frozen=True)
class OffPolicyAgent:
    """An agent's pure functions for one config and pair of specs.

    `actor_precision` arguments: None for the agent's own training precision (its config's
    matmul dtype), or the QAT precision once quantization-aware training starts.

    Attributes:
      name: the agent's name (results, progress bar).
      init: `key -> train state`.
      act: `actor_precision -> act(policy_params, observations [N, D], noise [N, A]) -> actions
        [N, A]` in environment units, exploring with the standard-normal `noise` (Gaussian
        noise added for deterministic actors, the reparameterized sample for SAC).
      policy: `actor_precision -> policy(policy_params, observations [N, D]) -> actions [N, A]`,
        the deterministic policy that evaluation runs.
      update: `actor_precision -> update(state, batches [K, B, ...]) -> (state, metrics)`, K
        updates under one `lax.scan`, metrics averaged over them. Not jitted (the loops jit).
      policy_params: `state -> the actor's params`.
      update_count: `state -> int32 count of updates taken`.
      quant_ranges: `state -> the QAT actor's input ranges` (`{}` without QAT).
      explore: on-device exploration draws, `(key, num_envs, env_steps) -> noise` for `act`
        (`env_steps`: int32 steps taken so far, for a schedule such as DQN's epsilon); None:
        standard-normal noise `[N, A]`.
      random_act: on-device warm-up actions, `(key, num_envs) -> actions [N, ...]`; None:
        uniform in the action bounds (continuous actions).
    """

    name: str
    init: Callable[[jax.Array], Any]
    act: Callable[[Optional[Precision]], ActFn]
    policy: Callable[[Optional[Precision]], PolicyFn]
    update: Callable[[Optional[Precision]], UpdateFn]
    policy_params: Callable[[Any], Any]
    update_count: Callable[[Any], jax.Array]
    quant_ranges: Callable[[Any], Any] = lambda state: state.quant_ranges
    explore: Optional[Callable[[jax.Array, int, jax.Array], Any]] = None
    random_act: Optional[Callable[[jax.Array, int], jax.Array]] = None


BuildFn = Callable[[Any, Any, Any], OffPolicyAgent]  # (config, observation_spec, action_spec)


@flax.struct.dataclass
class DeterministicTrainState:
    """What DDPG and D4PG learning thread from one update to the next (params float32): one
    deterministic actor, one critic, their targets and optimizer states."""

    actor_params: dict
    critic_params: dict
    target_actor_params: dict
    target_critic_params: dict
    actor_opt_state: optax.OptState
    critic_opt_state: optax.OptState
    updates: jax.Array  # int32 count of gradient updates taken.
    quant_ranges: dict = flax.struct.field(default_factory=dict)  # QAT: the actor's input ranges.


# ----- helpers shared by the agents' learning code --------------------------------------------


def adam(
    learning_rate: float, flat: bool = False, max_grad_norm: float = 0.0, l2: float = 0.0
) -> optax.GradientTransformation:
    """Adam, optionally after global-norm clipping (`max_grad_norm` > 0) and an L2 penalty's
    gradient (`l2` > 0, DDPG's critic weight decay). With `flat` the same arithmetic runs on all
    parameters raveled into one vector (faster with one XLA thread, see `qrl.runtime`)."""
    parts = []
    if max_grad_norm > 0:
        parts.append(optax.clip_by_global_norm(max_grad_norm))
    if l2 > 0:
        parts.append(optax.add_decayed_weights(l2))
    parts.append(optax.adam(learning_rate))
    optimizer = optax.chain(*parts) if len(parts) > 1 else parts[0]
    return optax.flatten(optimizer) if flat else optimizer


def apply_gradients(optimizer: optax.GradientTransformation, params, grads, opt_state):
    """One optimizer step: `(params, opt_state)` after `grads`."""
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state


def polyak(online, target, tau: float):
    """`tau * online + (1 - tau) * target` leaf by leaf (tau = 1 copies)."""
    if tau == 1.0:
        return online
    return optax.incremental_update(online, target, tau)


def fuse(one_update: Callable[[Any, Transition], tuple[Any, dict]]) -> UpdateFn:
    """`update(state, batches [K, B, ...])`: `one_update` scanned over the K batches, metrics
    averaged over the K updates."""

    def update(state, batches: Transition):
        state, metrics = jax.lax.scan(one_update, state, batches)
        return state, jax.tree.map(jnp.mean, metrics)

    return update


def training_precision(config) -> Precision:
    """The precision critics (and actors outside QAT) compute at: the config's `matmul_dtype`,
    fp32 or bf16 matmuls."""
    return FP32 if config.matmul_dtype == "fp32" else parse_precision(config.matmul_dtype)


def qat_actor_precision(config, quantize: bool = True) -> Precision:
    """The QAT actor's precision: `qat<N>` on the config's backend (`quantize=False`: the
    quantization delay's float forward pass, ranges tracked)."""
    return qat_precision(config.qat_bits, config.qat_backend, fake_quant=quantize)


def init_quant_ranges(config, make_actor, bounds, key: jax.Array, observations: jax.Array) -> dict:
    """The QAT actor's input ranges before any batch (`{}` without QAT)."""
    if not config.qat_bits:
        return {}
    return init_ranges(make_actor(config, bounds, qat_actor_precision(config)), key, observations)


def deterministic_policy(make_actor, config, bounds, precision: Optional[Precision] = None) -> PolicyFn:
    """`policy(actor_params, observations [N, D]) -> actions [N, A]` of the network
    `make_actor(config, bounds, precision)` (precision None: `training_precision(config)`)."""
    precision = precision or training_precision(config)
    actor = make_actor(config, bounds, precision)
    return lambda params, observations: actor.apply({"params": compute_params(params, precision)}, observations)


def deterministic_act(make_actor, config, bounds, precision: Optional[Precision] = None) -> ActFn:
    """`act(actor_params, observations [N, D], noise [N, A]) -> actions [N, A]`: the
    `deterministic_policy`'s action plus `config.exploration_noise * noise` (in half action
    ranges), clipped to the bounds."""
    policy = deterministic_policy(make_actor, config, bounds, precision)
    return gaussian_exploration(policy, *bounds, config.exploration_noise)


def gaussian_exploration(policy: PolicyFn, low, high, sigma: float) -> ActFn:
    """`act(params, observations, noise)`: the deterministic action plus `sigma * noise` in units
    of the action range's half width, clipped to the bounds (TD3 / SB3's NormalActionNoise on
    actions rescaled to [-1, 1])."""
    low, high = jnp.asarray(low, jnp.float32), jnp.asarray(high, jnp.float32)
    half_range = 0.5 * (high - low)

    def act(params, observations, noise):
        actions = policy(params, observations)
        return jnp.clip(actions + sigma * half_range * noise, low, high)

    return act


def check_continuous(agent: str, env_id: str, action_spec) -> None:
    """The off-policy actor-critic agents need continuous (Box / BoundedArray) actions."""
    if envs.is_discrete(action_spec):
        raise QrlInputError(f"agent {agent} needs continuous actions; {env_id} has discrete actions")


def _bounds(action_spec) -> tuple[np.ndarray, np.ndarray]:
    shape = tuple(action_spec.shape)
    low = np.broadcast_to(np.asarray(action_spec.minimum, np.float32), shape).copy()
    high = np.broadcast_to(np.asarray(action_spec.maximum, np.float32), shape).copy()
    return low, high


def _qat_precisions(config) -> tuple[Optional[Precision], ...]:
    """The actor precisions a run's updates use: the agent's own; with `qat_bits` > 0, the
    quantization delay's (float, ranges tracked), then QAT's."""
    if not config.qat_bits:
        return (None,)
    return (qat_actor_precision(config, quantize=False), qat_actor_precision(config))


def _quantized_acting(agent: OffPolicyAgent, config, roles=None) -> Callable[[Any], Any]:
    """`state -> int<N> actor params`: the QAT actor exported with its trained ranges (what a
    run acts and evaluates with once quantized)."""
    export = make_exporter(config.qat_bits, roles)
    return lambda state: export(agent.policy_params(state), agent.quant_ranges(state))


# ----- the host loop -------------------------------------------------------------------------


class TransitionRecorder:
    """What a host loop keeps per environment: n-step accumulators writing into a replay, and
    the running return of each environment's episode."""

    def __init__(self, replay: UniformReplay, num_envs: int, n_step: int, gamma: float):
        self.replay = replay
        self.accumulators = [NStepAccumulator(n_step, gamma) for _ in range(num_envs)]
        self.episode_returns = np.zeros(num_envs)

    def record(self, observations, actions, timestep, monitor: TrainingMonitor) -> None:
        """Adds one vector step's completed transitions to the replay; reports each finished
        episode's return to `monitor`."""
        for index, accumulator in enumerate(self.accumulators):
            if timestep.step_type[index] == 0:  # FIRST: the env had not been reset; nothing to learn.
                continue
            episode_end = bool(timestep.step_type[index] == 2)
            for transition in accumulator.add(
                observations[index], actions[index], timestep.reward[index], timestep.discount[index],
                timestep.final_observation[index], episode_end,
            ):
                self.replay.add(transition)
            self.episode_returns[index] += timestep.reward[index]
            if episode_end:
                monitor.episode_finished(self.episode_returns[index])
                self.episode_returns[index] = 0.0


# Called after every vector step (and the updates it triggered) with
# `(env_steps, state, observations [N, D], actions [N, A], timestep)`.
StepObserver = Callable[[int, Any, np.ndarray, np.ndarray, Any], None]


def train_host(
    build: BuildFn,
    check_env: Callable[[str, Any], None],
    config,
    env_id: str,
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
    observer: Optional[StepObserver] = None,
    start: Optional[HostStart] = None,
) -> tuple[Any, dict]:
    """Trains on `num_envs` host environments of `env_id` for `steps` environment steps.

    Returns the final train state and the results dict of `qrl.run_monitor.TrainingMonitor`
    (plus `qat_bits`, `quant_delay`). See the module docstring for the schedule. `observer`
    sees every step (dataset generation logs them); `start` resumes from a saved state.
    """
    env_options = dict(env_options or {})
    vector_env = envs.make_host_vector(env_id, num_envs, seed, **env_options)
    observation_spec, action_spec = vector_env.observation_spec(), vector_env.action_spec()
    check_env(env_id, action_spec)
    if config.qat_bits:
        check_quant_delay(config.quant_delay, qrl_config.total_updates(config, steps))
    agent = build(config, observation_spec, action_spec)
    low, high = _bounds(action_spec)
    action_shape = (num_envs,) + tuple(action_spec.shape)

    state = agent.init(jax.random.PRNGKey(seed)) if start is None else start.state
    precisions = _qat_precisions(config)
    updates = {precision: jax.jit(agent.update(precision), donate_argnums=0) for precision in precisions}
    acting_precisions = (None, serving_precision(config.qat_bits)) if config.qat_bits else (None,)
    acts = {precision: jax.jit(agent.act(precision)) for precision in acting_precisions}
    policies = {precision: jax.jit(agent.policy(precision)) for precision in acting_precisions}
    export = _quantized_acting(agent, config) if config.qat_bits else None
    updates_taken = int(agent.update_count(state))
    trained_quantized = bool(config.qat_bits) and updates_taken > config.quant_delay  # a resumed QAT run.
    acting_precision, acting_params = None, agent.policy_params(state)

    def refresh_acting():
        """Acting and evaluation: the float actor, or once QAT updates ran its int<N> export."""
        nonlocal acting_precision, acting_params
        if trained_quantized:
            acting_precision, acting_params = acting_precisions[-1], export(state)
        else:
            acting_params = agent.policy_params(state)

    refresh_acting()

    def evaluation_policy(observations):
        return np.asarray(policies[acting_precision](acting_params, observations))

    replay = UniformReplay(config.buffer_size, seed=seed)
    if start is not None and start.replay is not None:
        replay.add_batch(start.replay)
    recorder = TransitionRecorder(replay, num_envs, config.n_step, config.gamma)
    rng = np.random.default_rng(seed)
    monitor = TrainingMonitor(
        agent.name, env_id, steps, seed, workdir, evaluation_policy,
        eval_episodes, eval_every, checkpoint_every, log_every, progress, env_options,
        start_steps=0 if start is None else start.env_steps, evaluations=() if start is None else start.evaluations,
    )

    env_steps = 0 if start is None else int(start.env_steps)
    next_train = max(config.learning_starts, config.train_freq)
    if start is not None and start.replay is None:
        # The replay refills from scratch: updates wait for `learning_starts` new steps again.
        next_train += env_steps
    while next_train <= env_steps:
        next_train += config.train_freq
    observations = vector_env.reset()
    while env_steps < steps:
        if env_steps < config.learning_starts:
            actions = rng.uniform(low, high, action_shape).astype(np.float32)
        else:
            noise = rng.standard_normal(action_shape, dtype=np.float32)
            actions = np.asarray(acts[acting_precision](acting_params, observations, noise))
        timestep = vector_env.step(actions)
        recorder.record(observations, actions, timestep, monitor)
        observations_before, observations = observations, timestep.observation
        env_steps += num_envs

        train_metrics = None
        if env_steps >= next_train and len(replay):
            while next_train <= env_steps:
                trained_quantized = bool(config.qat_bits) and updates_taken >= config.quant_delay
                batches = replay.sample(config.batch_size, config.gradient_steps)
                state, train_metrics = updates[precisions[-1] if trained_quantized else precisions[0]](state, batches)
                updates_taken += config.gradient_steps
                next_train += config.train_freq
            refresh_acting()
        if observer is not None:
            observer(env_steps, state, observations_before, actions, timestep)
        monitor.step(env_steps, state, train_metrics, config)

    vector_env.close()
    results = monitor.finish(
        env_steps, state, config, updates=int(agent.update_count(state)),
        extra={"qat_bits": config.qat_bits, "quant_delay": config.quant_delay},
    )
    return state, results


# ----- the on-device loop --------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class DeviceSchedule:
    """How `make_train` lays a run of `steps` environment steps out in iterations.

    One iteration steps all N envs `rollout` times (`rollout * N` environment steps), then
    takes `updates_per_iteration` fused updates, so updates per environment step match the
    host loop's `gradient_steps / train_freq`. Warm-up iterations act uniformly at random and
    do not update; QAT iterations (once `quant_delay` updates are taken, and after at least
    one float iteration, whose updates give the ranges the int<N> acting export needs) train
    the actor fake-quantized.
    """

    rollout: int
    updates_per_iteration: int
    warmup_iterations: int
    fp32_iterations: int
    qat_iterations: int

    @classmethod
    def for_run(cls, config, num_envs: int, steps: int) -> "DeviceSchedule":
        rollout = max(1, config.train_freq // num_envs)
        per_iteration = rollout * num_envs
        updates = max(1, round(per_iteration * config.gradient_steps / config.train_freq))
        total = -(-steps // per_iteration)
        warmup = min(total, -(-config.learning_starts // per_iteration))
        qat_start = total
        if config.qat_bits:
            qat_start = min(total, warmup + max(1, -(-config.quant_delay // updates)))
        return cls(rollout, updates, warmup, qat_start - warmup, total - qat_start)


def make_train(
    agent: OffPolicyAgent,
    config,
    env: FunctionalEnv,
    steps: int,
    eval_env: Optional[FunctionalEnv] = None,
) -> Callable[[jax.Array], tuple[Any, dict]]:
    """`train(key) -> (state, summary)`: a whole run on device, pure (jit it; vmap it over keys).

    `env` is N functional environments (`qrl.envs.make_functional`); `eval_env`, when given,
    runs the final deterministic policy for one episode in each of its environments. `summary`
    holds device arrays: `env_steps`, `updates`, `episodes`, `recent_returns [10]` (the latest
    finished training episodes, NaN-padded), `metrics` (the last iteration's update metrics), and
    `eval_returns [E]` and `eval_lengths [E]` when there is an `eval_env`.
    """
    num_envs = env.num_envs
    schedule = DeviceSchedule.for_run(config, num_envs, steps)
    action_spec = env.action_spec()
    random_act, explore = agent.random_act, agent.explore
    action_shape = (num_envs,) + tuple(action_spec.shape)
    if random_act is None:
        low, high = (jnp.asarray(bound) for bound in _bounds(action_spec))
        random_act = lambda key, n: jax.random.uniform(key, action_shape, jnp.float32, low, high)  # noqa: E731
    if explore is None:
        explore = lambda key, n, env_steps: jax.random.normal(key, action_shape, jnp.float32)  # noqa: E731
    action_example = jax.eval_shape(lambda key: random_act(key, num_envs), jax.random.PRNGKey(0))
    replay = DeviceReplay(config.buffer_size, num_envs)
    precisions = _qat_precisions(config)
    float_acting = (agent.act(None), agent.policy_params)
    if config.qat_bits:  # layer places are constants of the network: read once from a fresh state.
        roles = range_roles(agent.quant_ranges(jax.jit(agent.init)(jax.random.PRNGKey(0))))
        quantized_acting = (agent.act(serving_precision(config.qat_bits)), _quantized_acting(agent, config, roles))

    def env_step(carry, act, acting_params, env_steps):
        state, env_state, observations, replay_state, window, stats, key = carry
        key, noise_key, step_key = jax.random.split(key, 3)
        if act is None:
            actions = random_act(noise_key, num_envs)
        else:
            actions = act(acting_params, observations, explore(noise_key, num_envs, env_steps))
        env_state, timestep = env.step(env_state, actions, step_key)
        done = timestep.step_type == 2
        window, transition, valid = nstep_window_push(
            window, observations, actions, timestep.reward, timestep.discount, done,
            timestep.final_observation, config.gamma,
        )
        replay_state = replay.add(replay_state, transition, valid)
        stats = _record_episodes(stats, timestep.reward, done)
        return (state, env_state, timestep.observation, replay_state, window, stats, key)

    def iteration(carry, index, acting, update):
        """Iteration `index` of the run: one rollout with `acting = (act, state -> acting params)`
        (None: `random_act`), then updates."""
        act, acting_params = (None, None) if acting is None else (acting[0], acting[1](carry[0]))
        first_step = index * schedule.rollout * num_envs
        carry = jax.lax.fori_loop(
            0, schedule.rollout, lambda r, c: env_step(c, act, acting_params, first_step + r * num_envs), carry
        )
        if update is None:
            return carry, {}
        state, env_state, observations, replay_state, window, stats, key = carry
        key, sample_key = jax.random.split(key)
        batches = replay.sample(replay_state, sample_key, config.batch_size, schedule.updates_per_iteration)
        state, metrics = update(state, batches)
        return (state, env_state, observations, replay_state, window, stats, key), metrics

    def run_phase(carry, first, iterations, acting, update, metrics):
        """Iterations `first`, ..., `first + iterations - 1` under one scan; returns the last
        iteration's metrics."""
        if iterations == 0:
            return carry, metrics
        indices = jnp.arange(first, first + iterations, dtype=jnp.int32)
        carry, phase_metrics = jax.lax.scan(lambda c, index: iteration(c, index, acting, update), carry, indices)
        if update is None:
            return carry, metrics
        return carry, jax.tree.map(lambda m: m[-1], phase_metrics)

    def train(key):
        init_key, reset_key, loop_key, eval_key = jax.random.split(key, 4)
        state = agent.init(init_key)
        env_state, observations = env.reset(reset_key)
        actions = jnp.zeros(action_example.shape, action_example.dtype)
        example = Transition(
            observation=observations[0],
            action=actions[0],
            reward=jnp.zeros((), jnp.float32),
            discount=jnp.zeros((), jnp.float32),
            next_observation=observations[0],
        )
        window = nstep_window_init(config.n_step, observations, actions)
        carry = (state, env_state, observations, replay.init(example), window, _episode_stats_init(num_envs), loop_key)
        metrics = jax.eval_shape(agent.update(None), state, _batch_like(example, config.batch_size))[1]
        metrics = jax.tree.map(lambda m: jnp.full(m.shape, jnp.nan, m.dtype), metrics)
        warmup, fp32 = schedule.warmup_iterations, schedule.fp32_iterations
        carry, _ = run_phase(carry, 0, warmup, None, None, metrics)
        carry, metrics = run_phase(carry, warmup, fp32, float_acting, agent.update(precisions[0]), metrics)
        if schedule.qat_iterations:
            carry, metrics = run_phase(
                carry, warmup + fp32, schedule.qat_iterations, quantized_acting, agent.update(precisions[-1]), metrics
            )
        state, *_, stats, _ = carry
        iterations = schedule.warmup_iterations + schedule.fp32_iterations + schedule.qat_iterations
        summary = {
            "env_steps": jnp.asarray(iterations * schedule.rollout * num_envs, jnp.int32),
            "updates": agent.update_count(state),
            "episodes": stats["episodes"],
            "recent_returns": _recent_in_order(stats),
            "metrics": metrics,
        }
        if eval_env is not None:
            if schedule.qat_iterations:
                policy, params = agent.policy(serving_precision(config.qat_bits)), quantized_acting[1](state)
            else:
                policy, params = agent.policy(None), agent.policy_params(state)
            summary["eval_returns"], summary["eval_lengths"] = episode_returns(
                eval_env, lambda obs: policy(params, obs), eval_key
            )
        return state, summary

    return train


def _batch_like(example: Transition, batch_size: int) -> Transition:
    return jax.tree.map(
        lambda leaf: jax.ShapeDtypeStruct((1, batch_size) + jnp.shape(leaf), jnp.asarray(leaf).dtype), example
    )


def _episode_stats_init(num_envs: int) -> dict:
    return {
        "running": jnp.zeros((num_envs,), jnp.float32),
        "episodes": jnp.zeros((), jnp.int32),
        "recent": jnp.full((RECENT_EPISODES,), jnp.nan, jnp.float32),
    }


def _record_episodes(stats: dict, reward: jax.Array, done: jax.Array) -> dict:
    """Adds `reward [N]` to the running returns; finished episodes go into the recent ring."""
    running = stats["running"] + reward
    rank = jnp.cumsum(done.astype(jnp.int32)) - 1  # order of the finished episodes in this step
    slots = jnp.where(done, (stats["episodes"] + rank) % RECENT_EPISODES, RECENT_EPISODES)
    recent = stats["recent"].at[slots].set(running, mode="drop")
    return {
        "running": jnp.where(done, 0.0, running),
        "episodes": stats["episodes"] + jnp.sum(done.astype(jnp.int32)),
        "recent": recent,
    }


def _recent_in_order(stats: dict) -> jax.Array:
    """The recent ring `[10]` oldest first (NaN where fewer episodes finished)."""
    return jnp.roll(stats["recent"], -(stats["episodes"] % RECENT_EPISODES))


def train_on_device(
    build: BuildFn,
    check_env: Callable[[str, Any], None],
    config,
    env_id: str,
    steps: int,
    seed: int = 0,
    workdir: Optional[str] = None,
    num_envs: int = 1,
    eval_episodes: int = 10,
    progress: bool = True,
    env_options: Optional[dict] = None,
) -> tuple[Any, dict]:
    """Runs `make_train` for a device id (`brax:`, `gymnax:`) and returns `(state, results)`
    with the host loop's result keys. `steps_per_second` excludes compilation (reported as
    `compile_seconds`). With a `workdir`, writes the final metrics row and a checkpoint."""
    del progress  # one compiled call: there is nothing to report until it returns.
    env_options = dict(env_options or {})
    env = make_functional(env_id, num_envs, **env_options)
    check_env(env_id, env.action_spec())
    if config.qat_bits:
        check_quant_delay(config.quant_delay, qrl_config.total_updates(config, steps))
    eval_env = make_functional(env_id, eval_episodes, **env_options)
    agent = build(config, env.observation_spec(), env.action_spec())
    train_fn = jax.jit(make_train(agent, config, env, steps, eval_env))
    key = jax.random.PRNGKey(seed)
    start = time.perf_counter()
    compiled = train_fn.lower(key).compile()
    compile_seconds = time.perf_counter() - start
    start = time.perf_counter()
    state, summary = jax.block_until_ready(compiled(key))
    train_seconds = time.perf_counter() - start
    summary = jax.tree.map(np.asarray, summary)
    eval_returns = [float(value) for value in summary["eval_returns"]]
    env_steps = int(summary["env_steps"])
    final_eval = {  # EvalResult.to_dict()'s keys; episodes start from a key split off PRNGKey(seed).
        "env_id": env_id,
        "seed": seed,
        "episodes": len(eval_returns),
        "mean": float(np.mean(eval_returns)),
        "std": float(np.std(eval_returns)),
        "returns": eval_returns,
        "lengths": [int(value) for value in summary["eval_lengths"]],
    }
    recent = [float(value) for value in summary["recent_returns"] if np.isfinite(value)]
    results = {
        "agent": agent.name,
        "env": env_id,
        "seed": seed,
        "env_steps": env_steps,
        "updates": int(summary["updates"]),
        "episodes": int(summary["episodes"]),
        "train_seconds": train_seconds,
        "compile_seconds": compile_seconds,
        "steps_per_second": env_steps / max(train_seconds, 1e-9),
        "final_eval": final_eval,
        "evaluations": [],
        "last_train_returns": recent,
        "qat_bits": config.qat_bits,
        "quant_delay": config.quant_delay,
        "on_device": True,
    }
    if workdir:
        metrics = {key: float(value) for key, value in summary["metrics"].items()}
        with MetricsLogger(workdir) as logger:
            row = {"episodes": results["episodes"], "steps_per_second": results["steps_per_second"], **metrics}
            if recent:
                row["episode_return"] = float(np.mean(recent))
            logger.write(env_steps, row)
            logger.write(env_steps, {"eval_return": final_eval["mean"], "eval_return_std": final_eval["std"]})
        checkpointer = Checkpointer(os.path.join(workdir, "checkpoints"))
        checkpointer.save(env_steps, state, extra={"env_steps": env_steps, "config": config.to_dict()})
        checkpointer.close()
    return state, results


def train(
    build: BuildFn,
    check_env: Callable[[str, Any], None],
    config,
    env_id: str,
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
) -> tuple[Any, dict]:
    """The host loop for host ids (gym, dmc), the on-device loop for brax / gymnax ids.

    On device, `eval_every` and `checkpoint_every` do not apply (the run is one compiled call)
    and a run cannot resume (`start` is for host runs).
    """
    if steps < 1:
        raise QrlInputError(f"steps must be >= 1, got {steps}")
    if is_device_id(env_id):
        if start is not None:
            raise QrlInputError(f"{env_id} trains on device in one compiled call, which cannot resume")
        return train_on_device(
            build, check_env, config, env_id, steps, seed, workdir, num_envs, eval_episodes, progress, env_options
        )
    return train_host(
        build, check_env, config, env_id, steps, seed, workdir, num_envs, eval_episodes, eval_every,
        checkpoint_every, log_every, progress, env_options, start=start,
    )


# ----- what an agent package exposes ---------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class AgentFunctions:
    """An off-policy agent's package functions (`build`, `check_env`, `train`, `init_state`,
    `policy_params`, `policy_spec`; see `agents/__init__.py`) over its learning and acting code.

    Attributes:
      name: the agent's name ("ddpg").
      init: `(key, config, observation_size, bounds) -> train state` with `actor_params` and
        `updates` fields.
      make_act: `(config, bounds, precision) -> act` (see `OffPolicyAgent.act`).
      make_policy: `(config, bounds, precision) -> policy` (see `OffPolicyAgent.policy`).
      make_update: `(config, bounds, precision) -> update` (see `OffPolicyAgent.update`).
      make_policy_network: `(config, bounds, precision) -> module` mapping observations to the
        deterministic policy's actions (what post-training quantization sweeps).
    """

    name: str
    init: Callable[..., Any]
    make_act: Callable[..., ActFn]
    make_policy: Callable[..., PolicyFn]
    make_update: Callable[..., UpdateFn]
    make_policy_network: Callable[..., Any]

    def check_env(self, env_id: str, action_spec) -> None:
        """The agent needs continuous actions."""
        check_continuous(self.name, env_id, action_spec)

    def build(self, config, observation_spec, action_spec) -> OffPolicyAgent:
        """The agent's pure functions for these specs (see `OffPolicyAgent`)."""
        bounds = action_bounds(action_spec)
        observation_size = int(observation_spec.shape[-1])
        return OffPolicyAgent(
            name=self.name,
            init=lambda key: self.init(key, config, observation_size, bounds),
            act=lambda precision: self.make_act(config, bounds, precision),
            policy=lambda precision: self.make_policy(config, bounds, precision),
            update=lambda precision: self.make_update(config, bounds, precision),
            policy_params=self.policy_params,
            update_count=lambda state: state.updates,
        )

    def train(
        self,
        env_id: str,
        config,
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
    ) -> tuple[Any, dict]:
        """Trains the agent for `steps` environment steps; returns the final state and a results dict.

        Host ids (gym, dmc) run `train_host`, device ids (brax, gymnax) `make_train` under one
        jit. See `qrl.offpolicy.train` for the arguments; `start` resumes a host run.
        """
        return train(
            self.build, self.check_env, config, env_id, steps, seed, workdir, num_envs, eval_episodes, eval_every,
            checkpoint_every, log_every, progress, env_options, start,
        )

    def init_state(self, config, observation_spec, action_spec, seed: int = 0):
        """A train state shaped like one trained on these specs (to restore checkpoints into)."""
        return self.init(
            jax.random.PRNGKey(seed), config, int(observation_spec.shape[-1]), action_bounds(action_spec)
        )

    @staticmethod
    def policy_params(state) -> dict:
        """The actor's params: what the deterministic policy runs on."""
        return state.actor_params

    def policy_spec(self, config, observation_spec, action_spec) -> PolicySpec:
        """The deterministic policy network; divergence is the mean action distance."""
        bounds = action_bounds(action_spec)
        return PolicySpec(
            build_network=lambda precision: self.make_policy_network(config, bounds, precision),
            outputs_to_actions=lambda actions: actions,
            divergence="deterministic",
        )
