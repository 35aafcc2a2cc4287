"""What on-policy actor-critic agents (A2C, PPO) share: the action head, rollouts, advantages,
the train state, and the two training paths over one agent update.

An agent describes itself with an `OnPolicyAgent`: its actor-critic networks at a precision,
the initial train state, and a pure `update(state, rollout) -> (state, metrics)` that learns
from one `[T, N]` rollout (several epochs of minibatches for PPO, one step for A2C). Then:

- `train_host` runs gymnasium / dm_control / Atari ids: N host environments
  (`qrl.envs.make_vector`), one small jitted act call per step writing into numpy `[T, N]`
  buffers, and one jitted, state-donating update per rollout.
- `make_train(agent, config, env_id, steps) -> train(key)` is the on-device path for brax and
  gymnax ids (PureJaxRL's design): one `jit` over a `lax.scan` of rollout + update iterations,
  pure and vmappable over seeds. `train_device` runs the same iteration in host-driven chunks
  for logging, evaluation and checkpoints.

Quantization-aware training (`config.qat_bits > 0`, `qrl.quant.qat`): the actor's updates run
float for the first `config.quant_delay` updates (gradient steps) while its moving-average input
ranges (`TrainState.quant_ranges`) are tracked, then fake-quantized (`qat<N>` on
`config.qat_backend`). The switch happens at a rollout boundary: an iteration's updates are all
quantized once `state.updates >= quant_delay`. Once a quantized update has been taken
(`updates > quant_delay`), acting and evaluation run the actor exported to static `int<N>` with
its trained ranges — the deployed numerics. The host loop switches functions; the device loop
`lax.switch`es on the update counter. Critics stay fp32.

Config fields the loops read: `num_envs`, `num_steps` (T), `qat_bits`, `quant_delay`, `qat_backend`.
"""

import dataclasses
import math
from typing import Any, Callable, Optional

import chex
import dm_env
import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from dm_env import specs

from qrl import distributions, envs, losses
from qrl.envs.functional import FunctionalEnv, episode_returns, make_functional
from qrl.errors import QrlInputError
from qrl.evaluation import EvalResult
from qrl import config as qrl_config
from qrl.quant import (
    FP32, Precision, apply_tracking, check_quant_delay, init_ranges, make_exporter, qat_precision, serving_precision,
)
from qrl.quant.qat import range_roles
from qrl.quant.sweep import PolicySpec
from qrl.run_monitor import EVAL_SEED_OFFSET, RECENT_EPISODES, HostStart, TrainingMonitor

_LAST = int(dm_env.StepType.LAST)
DEVICE_CHUNK_STEPS = 32_768  # environment steps per host round trip of the on-device loop, unless
# evaluations or checkpoints are due more often.


# --- Actions ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class PolicyHead:
    """How an actor's outputs become actions for one action spec.

    Discrete specs: the actor outputs logits `[B, A]`; actions are int32 `[B]`, sampled from
    the categorical, greedy = argmax. Continuous `[A]` specs: the actor outputs the mean
    `[B, A]` of a diagonal Gaussian with a state-independent `log_std [A]`; raw samples are
    what the log-probabilities are of, and the environment gets them clipped to the spec's
    bounds (SB3's convention); greedy = the clipped mean.
    """

    discrete: bool
    action_size: int
    minimum: Optional[tuple[float, ...]] = None
    maximum: Optional[tuple[float, ...]] = None

    @classmethod
    def from_spec(cls, action_spec: specs.Array) -> "PolicyHead":
        if envs.is_discrete(action_spec):
            return cls(True, envs.num_actions(action_spec))
        shape = tuple(action_spec.shape)
        minimum = np.broadcast_to(np.asarray(action_spec.minimum, np.float32), shape)
        maximum = np.broadcast_to(np.asarray(action_spec.maximum, np.float32), shape)
        return cls(False, shape[0], tuple(float(v) for v in minimum), tuple(float(v) for v in maximum))

    @property
    def action_shape(self) -> tuple[int, ...]:
        """The shape of one (raw) action: `()` for discrete, `(A,)` for continuous."""
        return () if self.discrete else (self.action_size,)

    @property
    def action_dtype(self):
        return np.int32 if self.discrete else np.float32

    def sample(self, key: jax.Array, outputs: jax.Array, log_std: Optional[jax.Array]) -> tuple[jax.Array, jax.Array]:
        """Raw actions `[B, ...]` and their log-probabilities `[B]`."""
        if self.discrete:
            actions = distributions.categorical_sample(key, outputs)
            return actions, distributions.categorical_log_prob(outputs, actions)
        actions = distributions.gaussian_sample(key, outputs, log_std)
        return actions, distributions.gaussian_log_prob(outputs, log_std, actions)

    def log_prob_and_entropy(
        self, outputs: jax.Array, log_std: Optional[jax.Array], actions: jax.Array
    ) -> tuple[jax.Array, jax.Array]:
        """log π(actions) `[B]` and the policy's entropy `[B]`."""
        if self.discrete:
            return distributions.categorical_log_prob(outputs, actions), distributions.categorical_entropy(outputs)
        log_prob = distributions.gaussian_log_prob(outputs, log_std, actions)
        return log_prob, jnp.broadcast_to(distributions.gaussian_entropy(log_std), log_prob.shape)

    def to_env(self, actions: jax.Array) -> jax.Array:
        """Raw actions -> environment actions (continuous ones clipped to the bounds)."""
        if self.discrete:
            return actions
        return jnp.clip(actions, jnp.asarray(self.minimum), jnp.asarray(self.maximum))

    def to_env_numpy(self, actions: np.ndarray) -> np.ndarray:
        """`to_env` in numpy, for host loops."""
        if self.discrete:
            return actions
        return np.clip(actions, self.minimum, self.maximum)

    def greedy(self, outputs: jax.Array) -> jax.Array:
        """The deterministic environment action: argmax of logits, or the clipped mean."""
        if self.discrete:
            return jnp.argmax(outputs, axis=-1).astype(jnp.int32)
        return self.to_env(outputs)


def check_action_spec(agent_name: str, env_id: str, action_spec: specs.Array) -> None:
    """On-policy agents take discrete actions or one continuous vector `[A]`."""
    if envs.is_discrete(action_spec):
        return
    if not isinstance(action_spec, specs.BoundedArray) or len(action_spec.shape) != 1:
        raise QrlInputError(
            f"agent {agent_name} needs discrete actions or a bounded action vector; "
            f"{env_id} has actions of shape {tuple(action_spec.shape)}"
        )


@dataclasses.dataclass(frozen=True)
class ActorCritic:
    """Separate actor (`obs [B, ...] -> logits or means [B, A]`) and critic (`obs -> values
    [B]`) networks and the action head. Params: `{"actor", "critic"}` plus `"log_std" [A]`
    for continuous actions. Acting reads only `acting_params(params)` (no critic)."""

    actor: nn.Module
    critic: nn.Module
    head: PolicyHead
    log_std_init: float = 0.0

    def init(self, key: jax.Array, observation: jax.Array) -> dict:
        """Fresh params for observations shaped like `observation [1, ...]`."""
        actor_key, critic_key = jax.random.split(key)
        params = {
            "actor": self.actor.init(actor_key, observation)["params"],
            "critic": self.critic.init(critic_key, observation)["params"],
        }
        if not self.head.discrete:
            params["log_std"] = jnp.full((self.head.action_size,), self.log_std_init, jnp.float32)
        return params

    def sample(self, params: dict, observations: jax.Array, key: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Raw actions `[B, ...]` and log-probabilities `[B]`; `params` may be `acting_params`."""
        outputs = self.actor.apply({"params": params["actor"]}, observations)
        return self.head.sample(key, outputs, params.get("log_std"))

    def log_prob_and_entropy(self, params: dict, observations: jax.Array, actions: jax.Array):
        """log π(actions | observations) `[B]` and entropies `[B]` under `params`."""
        outputs = self.actor.apply({"params": params["actor"]}, observations)
        return self.head.log_prob_and_entropy(outputs, params.get("log_std"), actions)

    def log_prob_entropy_and_ranges(
        self, params: dict, quant_ranges: dict, observations: jax.Array, actions: jax.Array
    ) -> tuple[jax.Array, jax.Array, dict]:
        """The training-mode `log_prob_and_entropy`: also returns the actor's QAT input ranges
        moved towards this batch's (`{}` unchanged without QAT)."""
        outputs, quant_ranges = apply_tracking(self.actor, params["actor"], quant_ranges, observations)
        log_prob, entropy = self.head.log_prob_and_entropy(outputs, params.get("log_std"), actions)
        return log_prob, entropy, quant_ranges

    def value(self, params: dict, observations: jax.Array) -> jax.Array:
        """V(observations) `[...]` for observations `[..., obs]` (any leading axes)."""
        return self.critic.apply({"params": params["critic"]}, observations)

    def greedy(self, params: dict, observations: jax.Array) -> jax.Array:
        """Deterministic environment actions `[B, ...]`."""
        return self.head.greedy(self.actor.apply({"params": params["actor"]}, observations))


def acting_params(params: dict) -> dict:
    """The part of the params acting needs (actor and log_std): fewer leaves per act call."""
    return {name: value for name, value in params.items() if name != "critic"}


def quantized_acting_params(export: Callable[[Any, Any], Any], params: dict, quant_ranges: dict) -> dict:
    """`acting_params` with the actor exported to static `int<N>` with its trained ranges
    (`export` from `qrl.quant.make_exporter`): what a QAT run acts and evaluates with."""
    return dict(acting_params(params), actor=export(params["actor"], quant_ranges))


# --- Rollouts, advantages, train state ---------------------------------------------------------


@flax.struct.dataclass
class Rollout:
    """T steps of N environments. Every field has leading axes `[T, N]`.

    observation: what the agent acted on. action: the raw sampled action (int32 `[T, N]` or
    float32 `[T, N, A]`, before clipping). log_prob: its log-probability under the acting
    policy. reward, discount (the environment's: 0 on termination, else 1), done (1.0 where
    the episode ended in this step, terminated or truncated). final_observation: the
    observation the step reached before auto-reset (the next state to bootstrap from).
    """

    observation: Any
    action: Any
    log_prob: Any
    reward: Any
    discount: Any
    done: Any
    final_observation: Any


def advantages_and_returns(
    actor_critic: ActorCritic, params: dict, rollout: Rollout, gamma: float, gae_lambda: float
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """GAE advantages, value targets and the critic's values, each `[T, N]`.

    Values of the final observations bootstrap every step, so time-limit truncations keep
    their bootstrap while terminations (discount 0) do not.
    """
    values = actor_critic.value(params, flatten_time(rollout.observation)).reshape(rollout.reward.shape)
    next_values = actor_critic.value(params, flatten_time(rollout.final_observation)).reshape(rollout.reward.shape)
    chex.assert_equal_shape([values, next_values, rollout.reward])
    advantages = losses.generalized_advantage_estimation(
        rollout.reward, gamma * rollout.discount, rollout.done, values, next_values, gae_lambda
    )
    return advantages, advantages + values, values


def flatten_time(tree: Any) -> Any:
    """Merges the leading `[T, N]` axes of every leaf into one `[T * N]` axis."""
    return jax.tree.map(lambda x: x.reshape((x.shape[0] * x.shape[1],) + x.shape[2:]), tree)


@flax.struct.dataclass
class TrainState:
    """What on-policy learning threads from one update to the next."""

    params: dict  # {"actor", "critic"} (+ "log_std" for continuous actions)
    opt_state: optax.OptState
    key: jax.Array  # minibatch shuffling
    updates: jax.Array  # int32 gradient steps taken
    iterations: jax.Array  # int32 rollouts learned from
    quant_ranges: dict = flax.struct.field(default_factory=dict)  # QAT: the actor's input ranges.


def linear_decay(initial: float, num_iterations: int, updates_per_iteration: int = 1) -> Callable[[jax.Array], jax.Array]:
    """`count -> initial * (1 - iteration / num_iterations)`, constant within an iteration of
    `updates_per_iteration` gradient steps (PureJaxRL's annealing; SB3 decays with progress
    measured once per rollout the same way)."""

    def schedule(count):
        iteration = count // updates_per_iteration
        return initial * jnp.maximum(1.0 - iteration / max(num_iterations, 1), 0.0)

    return schedule


def init_state(
    key: jax.Array,
    actor_critic: ActorCritic,
    optimizer: optax.GradientTransformation,
    observation_spec: specs.Array,
    qat_actor: Optional[nn.Module] = None,
) -> TrainState:
    """A fresh train state (one jitted call); with a `qat_actor` (see `make_qat_actor`), its
    unseen input ranges."""
    dummy = jnp.zeros((1, *observation_spec.shape), observation_spec.dtype)

    @jax.jit
    def fresh(key):
        params_key, state_key = jax.random.split(key)
        params = actor_critic.init(params_key, dummy)
        zero = jnp.zeros((), jnp.int32)
        quant_ranges = {} if qat_actor is None else init_ranges(qat_actor, params_key, dummy)
        return TrainState(params, optimizer.init(params), state_key, zero, zero, quant_ranges)

    return fresh(key)


# --- The agent interface ------------------------------------------------------------------------

UpdateFn = Callable[[TrainState, Rollout], tuple[TrainState, dict]]


@dataclasses.dataclass(frozen=True)
class OnPolicyAgent:
    """What an on-policy agent gives the shared training loops.

    Attributes:
      name: "ppo", "a2c" (for logs and results).
      make_actor_critic: `(config, observation_spec, action_spec, precision) -> ActorCritic`.
      init: `(key, config, observation_spec, action_spec) -> TrainState`.
      make_update: `(config, observation_spec, action_spec, num_iterations, policy_precision)
        -> update(state, rollout) -> (state, metrics)`, pure (the loops jit it).
      validate: `config -> None`, raising `QrlInputError` for values that cannot train (run
        again after the loops replace `num_envs`).
    """

    name: str
    make_actor_critic: Callable[..., ActorCritic]
    init: Callable[..., TrainState]
    make_update: Callable[..., UpdateFn]
    validate: Callable[[Any], None] = lambda config: None

    # The agent package's functions (see `agents/__init__.py`), over the loops below.

    def check_env(self, env_id: str, action_spec: specs.Array) -> None:
        """The agent takes discrete actions or a bounded continuous action vector."""
        check_action_spec(self.name, env_id, action_spec)

    def train(
        self,
        env_id: str,
        config: Any,
        steps: int,
        seed: int = 0,
        workdir: Optional[str] = None,
        num_envs: Optional[int] = None,
        eval_episodes: int = 10,
        eval_every: int = 0,
        checkpoint_every: int = 0,
        log_every: int = 1_000,
        progress: bool = True,
        env_options: Optional[dict] = None,
        start: Optional[HostStart] = None,
    ) -> tuple[TrainState, dict]:
        """Trains the agent for `steps` environment steps; returns the final state and a results dict.

        `num_envs` (when given) replaces `config.num_envs`. With a `workdir`, writes
        `metrics.csv`, TensorBoard events and orbax checkpoints (every `checkpoint_every` steps
        when > 0, and at the end). The greedy policy is evaluated every `eval_every` steps (when
        > 0) and at the end over `eval_episodes` episodes seeded from `seed + 1_000_000`. `start`
        resumes a host run (see `train`).
        """
        return train(
            self, self.check_env, env_id, config, steps, seed=seed, workdir=workdir, num_envs=num_envs,
            eval_episodes=eval_episodes, eval_every=eval_every, checkpoint_every=checkpoint_every,
            log_every=log_every, progress=progress, env_options=env_options, start=start,
        )

    def make_train(
        self, config: Any, env_id: str, steps: int, env_options: Optional[dict] = None
    ) -> Callable[[jax.Array], tuple[TrainState, dict]]:
        """`train(key) -> (state, per-iteration metrics)` for a brax or gymnax id: one jit over a
        `lax.scan` of rollout + update iterations; `jax.jit(jax.vmap(train))(keys)` trains seeds
        side by side."""
        return make_train(self, config, env_id, steps, env_options)

    def init_state(self, config: Any, observation_spec: specs.Array, action_spec: specs.Array, seed: int = 0):
        """A train state shaped like one trained on these specs (to restore checkpoints into)."""
        return self.init(jax.random.PRNGKey(seed), config, observation_spec, action_spec)

    @staticmethod
    def policy_params(state: TrainState) -> dict:
        """The actor's params: what the deployed policy runs on."""
        return state.params["actor"]

    def policy_spec(self, config: Any, observation_spec: specs.Array, action_spec: specs.Array) -> PolicySpec:
        """Logits -> argmax (divergence on softmax(logits)), or Gaussian mean -> clipped action."""
        def build_network(precision: Precision) -> nn.Module:
            return self.make_actor_critic(config, observation_spec, action_spec, precision).actor

        return PolicySpec(
            build_network=build_network,
            outputs_to_actions=PolicyHead.from_spec(action_spec).greedy,
            divergence="categorical" if envs.is_discrete(action_spec) else "deterministic",
        )


def iterations_for(config: Any, steps: int) -> int:
    """Rollouts of `num_steps x num_envs` environment steps that cover `steps` (rounded up)."""
    return max(1, math.ceil(steps / (config.num_steps * config.num_envs)))


def update_precisions(config: Any) -> tuple[Precision, ...]:
    """The actor precisions a run's updates use: fp32; with `qat_bits` > 0, the quantization
    delay's (float forward, ranges tracked), then `qat<N>` on the config's backend."""
    if not config.qat_bits:
        return (FP32,)
    return tuple(qat_precision(config.qat_bits, config.qat_backend, fake_quant=quantize) for quantize in (False, True))


def acting_precisions(config: Any) -> tuple[Precision, ...]:
    """The actor precisions a run acts with: fp32, and with QAT the static `int<N>` export."""
    return (FP32, serving_precision(config.qat_bits)) if config.qat_bits else (FP32,)


def make_qat_actor(make_actor_critic: Callable[..., ActorCritic], config: Any, observation_spec: specs.Array,
              action_spec: specs.Array) -> Optional[nn.Module]:
    """The QAT actor whose ranges a train state carries (None without QAT)."""
    if not config.qat_bits:
        return None
    return make_actor_critic(config, observation_spec, action_spec, update_precisions(config)[-1]).actor


def _quantized_updates(config: Any, updates: int) -> bool:
    """Whether an iteration starting at `updates` gradient steps updates fake-quantized."""
    return bool(config.qat_bits) and updates >= config.quant_delay


def _quantized_acting(config: Any, updates: int) -> bool:
    """Whether a run at `updates` gradient steps acts with the int<N> export (a quantized update
    has been taken)."""
    return bool(config.qat_bits) and updates > config.quant_delay


def _check_run(agent: OnPolicyAgent, config: Any, steps: int, num_envs: Optional[int]) -> Any:
    if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 1:
        raise QrlInputError(f"steps must be a positive integer, got {steps!r}")
    if num_envs is not None:
        if isinstance(num_envs, bool) or not isinstance(num_envs, (int, np.integer)) or num_envs < 1:
            raise QrlInputError(f"num_envs must be a positive integer, got {num_envs!r}")
        config = config.replace(num_envs=int(num_envs))
    agent.validate(config)
    if config.qat_bits:
        check_quant_delay(config.quant_delay, qrl_config.total_updates(config, steps))
    return config


def _results_extra(config: Any) -> dict:
    return {"qat_bits": config.qat_bits, "quant_delay": config.quant_delay, "num_envs": config.num_envs}


def train(
    agent: OnPolicyAgent,
    check_env: Callable[[str, specs.Array], None],
    env_id: str,
    config: Any,
    steps: int,
    seed: int = 0,
    workdir: Optional[str] = None,
    num_envs: Optional[int] = None,
    eval_episodes: int = 10,
    eval_every: int = 0,
    checkpoint_every: int = 0,
    log_every: int = 1_000,
    progress: bool = True,
    env_options: Optional[dict] = None,
    start: Optional[HostStart] = None,
) -> tuple[TrainState, dict]:
    """Trains `agent` for `steps` environment steps on the host or on device, by `env_id`.

    `num_envs` (when given) replaces `config.num_envs`. Returns the final state and the
    results dict (`final_eval` is the greedy policy over `eval_episodes` episodes seeded
    from `seed + 1_000_000`). `start` resumes a host run from a saved state: its environments
    restart, and the iterations left are those after `start.env_steps`. On-device runs do not
    resume (their environment state lives in the compiled loop and is not checkpointed).
    """
    config = _check_run(agent, config, steps, num_envs)
    kwargs = dict(
        seed=seed, workdir=workdir, eval_episodes=eval_episodes, eval_every=eval_every,
        checkpoint_every=checkpoint_every, log_every=log_every, progress=progress, env_options=env_options or {},
    )
    if envs.is_device_id(env_id):
        if start is not None:
            raise QrlInputError(f"{env_id} trains on device, which cannot resume from a checkpoint")
        return train_device(agent, check_env, env_id, config, steps, **kwargs)
    return train_host(agent, check_env, env_id, config, steps, start=start, **kwargs)


# --- Host path --------------------------------------------------------------------------------


def make_act(actor_critic: ActorCritic) -> Callable:
    """`act(acting_params, observations [N, ...], key) -> (key, raw actions [N, ...], log_probs [N])`,
    jitted: the one device call per host environment step."""

    def act(params, observations, key):
        key, sample_key = jax.random.split(key)
        actions, log_prob = actor_critic.sample(params, observations, sample_key)
        return key, actions, log_prob

    return jax.jit(act)


class RolloutBuffer:
    """Preallocated numpy `[T, N, ...]` arrays that a host loop fills one step (row) at a time."""

    def __init__(self, num_steps: int, num_envs: int, observation_spec: specs.Array, head: PolicyHead):
        shape = (num_steps, num_envs)
        observation_shape = shape + tuple(observation_spec.shape)
        self.observation = np.zeros(observation_shape, observation_spec.dtype)
        self.final_observation = np.zeros(observation_shape, observation_spec.dtype)
        self.action = np.zeros(shape + head.action_shape, head.action_dtype)
        self.log_prob = np.zeros(shape, np.float32)
        self.reward = np.zeros(shape, np.float32)
        self.discount = np.zeros(shape, np.float32)
        self.done = np.zeros(shape, np.float32)

    def rollout(self) -> Rollout:
        return Rollout(
            self.observation, self.action, self.log_prob, self.reward, self.discount, self.done, self.final_observation
        )


def train_host(
    agent: OnPolicyAgent,
    check_env: Callable[[str, specs.Array], None],
    env_id: str,
    config: Any,
    steps: int,
    seed: int,
    workdir: Optional[str],
    eval_episodes: int,
    eval_every: int,
    checkpoint_every: int,
    log_every: int,
    progress: bool,
    env_options: dict,
    start: Optional[HostStart] = None,
) -> tuple[TrainState, dict]:
    """The host loop over `config.num_envs` host environments (see the module docstring)."""
    vector_env = envs.make_vector(env_id, config.num_envs, seed, **env_options)
    observation_spec, action_spec = vector_env.observation_spec(), vector_env.action_spec()
    check_env(env_id, action_spec)
    iterations = iterations_for(config, steps)
    steps_per_iteration = config.num_steps * config.num_envs
    if start is None:
        state, env_steps = agent.init(jax.random.PRNGKey(seed), config, observation_spec, action_spec), 0
    else:
        state, env_steps = start.state, int(start.env_steps)
    acts, greedy = {}, {}
    for precision in acting_precisions(config):
        actor_critic = agent.make_actor_critic(config, observation_spec, action_spec, precision)
        acts[precision], greedy[precision] = make_act(actor_critic), jax.jit(actor_critic.greedy)
    update_fns = [
        jax.jit(agent.make_update(config, observation_spec, action_spec, iterations, precision), donate_argnums=0)
        for precision in update_precisions(config)
    ]
    update_float, update_quantized = update_fns[0], update_fns[-1]  # the same function without QAT.
    head = actor_critic.head
    export = make_exporter(config.qat_bits) if config.qat_bits else None

    def acting_now():
        """The acting precision and params for the current state: float, or once a quantized
        update has been taken, the int<N> export with the trained ranges."""
        if _quantized_acting(config, int(state.updates)):
            return acting_precisions(config)[-1], quantized_acting_params(export, state.params, state.quant_ranges)
        return FP32, acting_params(state.params)

    precision, params = acting_now()
    monitor = TrainingMonitor(
        agent.name, env_id, steps, seed, workdir,
        lambda observations: np.asarray(greedy[precision](params, observations)),
        eval_episodes, eval_every, checkpoint_every, log_every, progress, env_options,
        start_steps=env_steps, evaluations=() if start is None else start.evaluations,
    )
    buffer = RolloutBuffer(config.num_steps, config.num_envs, observation_spec, head)
    act_key = jax.random.fold_in(jax.random.PRNGKey(seed), 1)
    if start is not None:  # a resumed run does not replay the first run's action noise
        act_key = jax.random.fold_in(act_key, env_steps)
    episode_returns_now = np.zeros(config.num_envs, np.float64)
    observations = vector_env.reset()
    for _ in range(iterations - env_steps // steps_per_iteration):
        act = acts[precision]
        for t in range(config.num_steps):
            act_key, actions, log_prob = act(params, observations, act_key)
            actions = np.asarray(actions)
            timestep = vector_env.step(head.to_env_numpy(actions))
            buffer.observation[t] = observations
            buffer.action[t] = actions
            buffer.log_prob[t] = log_prob
            buffer.reward[t] = timestep.reward
            buffer.discount[t] = timestep.discount
            buffer.final_observation[t] = timestep.final_observation
            last = timestep.step_type == _LAST
            buffer.done[t] = last
            episode_returns_now += timestep.reward
            if last.any():
                for index in np.flatnonzero(last):
                    monitor.episode_finished(episode_returns_now[index])
                episode_returns_now[last] = 0.0
            observations = timestep.observation
        env_steps += steps_per_iteration
        update = update_quantized if _quantized_updates(config, int(state.updates)) else update_float
        state, metrics = update(state, buffer.rollout())
        precision, params = acting_now()
        monitor.step(env_steps, state, metrics, config)
    vector_env.close()
    results = monitor.finish(env_steps, state, config, updates=int(state.updates), extra=_results_extra(config))
    return state, results


# --- Device path ------------------------------------------------------------------------------


@flax.struct.dataclass
class Runner:
    """The carry of the on-device loop."""

    state: TrainState
    env_state: Any
    observation: jax.Array  # [N, ...]
    key: jax.Array
    env_steps: jax.Array  # int32
    episode_return: jax.Array  # [N] return of each env's running episode
    recent_returns: jax.Array  # [RECENT_EPISODES] ring of the latest finished episodes' returns
    episodes: jax.Array  # int32 finished episodes


def _make_iteration(agent: OnPolicyAgent, config: Any, env: FunctionalEnv, iterations: int) -> Callable:
    """`iteration(runner) -> (runner, metrics)`: one `[T, N]` rollout on device and one update.

    Metrics: the update's, plus `episodes` finished in the rollout and `returns_sum` of them.
    With QAT, both precisions' iterations are compiled and `lax.cond` picks by step count.
    """
    observation_spec, action_spec = env.observation_spec(), env.action_spec()
    ring = RECENT_EPISODES

    if config.qat_bits:  # layer places are constants of the network: read once from a fresh state.
        roles = range_roles(agent.init(jax.random.PRNGKey(0), config, observation_spec, action_spec).quant_ranges)
        export = make_exporter(config.qat_bits, roles)

    def build(acting_precision, update_precision):
        actor_critic = agent.make_actor_critic(config, observation_spec, action_spec, acting_precision)
        update = agent.make_update(config, observation_spec, action_spec, iterations, update_precision)
        head = actor_critic.head
        quantized = acting_precision != FP32

        def env_step(carry, _):
            runner, params, returns_sum = carry
            observation = runner.observation
            key, act_key, step_key = jax.random.split(runner.key, 3)
            actions, log_prob = actor_critic.sample(params, observation, act_key)
            env_state, timestep = env.step(runner.env_state, head.to_env(actions), step_key)
            done = timestep.step_type == _LAST
            episode_return = runner.episode_return + timestep.reward
            order = jnp.cumsum(done) - 1
            slots = jnp.where(done, (runner.episodes + order) % ring, ring)
            runner = runner.replace(
                env_state=env_state,
                observation=timestep.observation,
                key=key,
                episode_return=jnp.where(done, 0.0, episode_return),
                recent_returns=runner.recent_returns.at[slots].set(episode_return, mode="drop"),
                episodes=runner.episodes + jnp.sum(done, dtype=jnp.int32),
            )
            returns_sum = returns_sum + jnp.sum(jnp.where(done, episode_return, 0.0))
            transition = Rollout(
                observation, actions, log_prob, timestep.reward, timestep.discount, done.astype(jnp.float32),
                timestep.final_observation,
            )
            return (runner, params, returns_sum), transition

        def iteration(runner):
            episodes_before = runner.episodes
            state = runner.state
            if quantized:
                params = quantized_acting_params(export, state.params, state.quant_ranges)
            else:
                params = acting_params(state.params)
            carry = (runner, params, jnp.zeros((), jnp.float32))
            (runner, _, returns_sum), rollout = jax.lax.scan(env_step, carry, None, config.num_steps)
            state, metrics = update(runner.state, rollout)
            runner = runner.replace(state=state, env_steps=runner.env_steps + config.num_steps * config.num_envs)
            metrics = dict(metrics, episodes=runner.episodes - episodes_before, returns_sum=returns_sum)
            return runner, metrics

        return iteration

    float_update, quantized_update = update_precisions(config)[0], update_precisions(config)[-1]
    if not config.qat_bits:
        return build(FP32, float_update)
    serving = acting_precisions(config)[-1]
    branches = [build(FP32, float_update), build(FP32, quantized_update), build(serving, quantized_update)]

    def iteration(runner):
        """Float updates before the delay; the first quantized iteration still acts float (its
        ranges may be unseen); after it, int<N> acting."""
        updates = runner.state.updates
        phase = (updates >= config.quant_delay).astype(jnp.int32) + (updates > config.quant_delay).astype(jnp.int32)
        return jax.lax.switch(phase, branches, runner)

    return iteration


def _make_init(agent: OnPolicyAgent, config: Any, env: FunctionalEnv) -> Callable[[jax.Array], Runner]:
    def init(key):
        agent_key, env_key, runner_key = jax.random.split(key, 3)
        state = agent.init(agent_key, config, env.observation_spec(), env.action_spec())
        env_state, observation = env.reset(env_key)
        return Runner(
            state=state,
            env_state=env_state,
            observation=observation,
            key=runner_key,
            env_steps=jnp.zeros((), jnp.int32),
            episode_return=jnp.zeros((env.num_envs,), jnp.float32),
            recent_returns=jnp.zeros((RECENT_EPISODES,), jnp.float32),
            episodes=jnp.zeros((), jnp.int32),
        )

    return init


def make_train(
    agent: OnPolicyAgent, config: Any, env_id: str, steps: int, env_options: Optional[dict] = None
) -> Callable[[jax.Array], tuple[TrainState, dict]]:
    """`train(key) -> (state, metrics)`: the whole run as one pure function (jit it, vmap it
    over keys for seeds). `metrics` hold one value per iteration (`[iterations]`): the
    update's metrics, `episodes` finished in the iteration's rollout and their mean
    `episode_return` (NaN where none finished), and `env_steps` after the iteration.
    """
    config = _check_run(agent, config, steps, None)
    env = make_functional(env_id, config.num_envs, **(env_options or {}))
    iterations = iterations_for(config, steps)
    iteration = _make_iteration(agent, config, env, iterations)
    init = _make_init(agent, config, env)

    def train(key):
        def body(runner, _):
            runner, metrics = iteration(runner)
            returns_sum, episodes = metrics.pop("returns_sum"), metrics["episodes"]
            metrics["episode_return"] = jnp.where(episodes > 0, returns_sum / jnp.maximum(episodes, 1), jnp.nan)
            metrics["env_steps"] = runner.env_steps
            return runner, metrics

        runner, metrics = jax.lax.scan(body, init(key), None, iterations)
        return runner.state, metrics

    return train


class _DeviceMonitor(TrainingMonitor):
    """The host monitor with evaluation on device: greedy episodes of a functional env."""

    def __init__(self, evaluate_fn: Callable[[], EvalResult], *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._evaluate_fn = evaluate_fn

    def evaluate(self) -> EvalResult:
        return self._evaluate_fn()


def _recent_returns(runner: Runner) -> list[float]:
    """The latest finished episodes' returns, oldest first."""
    count = int(runner.episodes)
    ring = np.asarray(runner.recent_returns)
    return [float(ring[(count - back) % RECENT_EPISODES]) for back in range(min(count, RECENT_EPISODES), 0, -1)]


def train_device(
    agent: OnPolicyAgent,
    check_env: Callable[[str, specs.Array], None],
    env_id: str,
    config: Any,
    steps: int,
    seed: int,
    workdir: Optional[str],
    eval_episodes: int,
    eval_every: int,
    checkpoint_every: int,
    log_every: int,
    progress: bool,
    env_options: dict,
) -> tuple[TrainState, dict]:
    """The on-device loop, driven from the host in chunks of iterations for logging,
    evaluation (greedy, on device) and checkpoints; the chunk runs under one jit."""
    env = make_functional(env_id, config.num_envs, **env_options)
    check_env(env_id, env.action_spec())
    iterations = iterations_for(config, steps)
    iteration = _make_iteration(agent, config, env, iterations)
    steps_per_iteration = config.num_steps * config.num_envs
    due = [every for every in (eval_every, checkpoint_every) if every > 0]
    chunk_steps = min([max(log_every, DEVICE_CHUNK_STEPS)] + due)
    chunk = max(1, min(iterations, chunk_steps // steps_per_iteration))

    def run_chunk(runner, count):
        def body(_, carry):
            runner, sums = carry
            runner, metrics = iteration(runner)
            metrics = {name: value.astype(jnp.float32) for name, value in metrics.items()}
            return runner, jax.tree.map(jnp.add, sums, metrics)

        zeros = jax.tree.map(lambda s: jnp.zeros((), jnp.float32), jax.eval_shape(iteration, runner)[1])
        return jax.lax.fori_loop(0, count, body, (runner, zeros))

    runner = jax.jit(_make_init(agent, config, env))(jax.random.PRNGKey(seed))
    run = jax.jit(run_chunk, donate_argnums=0).lower(runner, jnp.int32(chunk)).compile()

    eval_env = make_functional(env_id, eval_episodes, **env_options)
    evaluators = {
        precision: make_device_evaluator(
            agent.make_actor_critic(config, env.observation_spec(), env.action_spec(), precision), eval_env
        )
        for precision in acting_precisions(config)
    }
    export = make_exporter(config.qat_bits) if config.qat_bits else None

    def evaluate() -> EvalResult:
        state = runner.state
        if _quantized_acting(config, int(state.updates)):
            precision = acting_precisions(config)[-1]
            params = quantized_acting_params(export, state.params, state.quant_ranges)
        else:
            precision, params = FP32, acting_params(state.params)
        return evaluators[precision](params, seed + EVAL_SEED_OFFSET)

    monitor = _DeviceMonitor(
        evaluate, agent.name, env_id, steps, seed, workdir, None,
        eval_episodes, eval_every, checkpoint_every, log_every, progress, env_options,
    )
    done_iterations = 0
    while done_iterations < iterations:
        count = min(chunk, iterations - done_iterations)
        runner, sums = run(runner, jnp.int32(count))
        done_iterations += count
        sums = {name: float(value) for name, value in jax.device_get(sums).items()}
        returns_sum, episodes = sums.pop("returns_sum"), sums.pop("episodes")
        recent = _recent_returns(runner)
        if recent:
            monitor.episode_finished(recent[-1])  # the progress bar shows the latest return
        extra = {"episodes": int(runner.episodes)}
        if recent:
            extra["episode_return"] = float(np.mean(recent))
        if episodes:
            extra["chunk_episode_return"] = returns_sum / episodes
        monitor.step(
            done_iterations * steps_per_iteration, runner.state,
            {name: value / count for name, value in sums.items()}, config, extra_metrics=extra,
        )
    env_steps = done_iterations * steps_per_iteration
    results = monitor.finish(
        env_steps, runner.state, config, updates=int(runner.state.updates),
        extra={**_results_extra(config), "episodes": int(runner.episodes), "last_train_returns": _recent_returns(runner)},
    )
    return runner.state, results


def make_device_evaluator(actor_critic: ActorCritic, env: FunctionalEnv) -> Callable[[dict, int], EvalResult]:
    """`evaluate(params, seed) -> EvalResult`: the greedy policy's first episode in each of the
    `env.num_envs` functional environments, run under one jit (reset keys from `seed`)."""
    returns_and_lengths = jax.jit(
        lambda params, key: episode_returns(env, lambda observation: actor_critic.greedy(params, observation), key)
    )

    def evaluate(params: dict, seed: int) -> EvalResult:
        returns, lengths = jax.device_get(returns_and_lengths(params, jax.random.PRNGKey(seed)))
        returns = np.asarray(returns, np.float64)
        return EvalResult(
            env_id=env.env_id, seed=seed, mean=float(returns.mean()), std=float(returns.std()),
            returns=tuple(float(value) for value in returns), lengths=tuple(int(value) for value in lengths),
        )

    return evaluate
