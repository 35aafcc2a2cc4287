"""DQN learning: the train state, its initialization and K fused updates per jitted call."""

from typing import Callable, Sequence

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from agents.dqn.config import Config
from agents.dqn.networks import QNetwork
from qrl import config as qrl_config, losses
from qrl.errors import QrlInputError
from qrl.networks import NEAR_ZERO_INIT, torso_for_observation
from qrl.quant import FP32, Precision, apply_frozen, apply_tracking, init_ranges, qat_precision
from qrl.replay import Transition


@flax.struct.dataclass
class TrainState:
    """Everything DQN learning threads from one update to the next."""

    params: dict
    target_params: dict
    opt_state: optax.OptState
    updates: jax.Array  # int32 count of gradient updates taken.
    quant_ranges: dict = flax.struct.field(default_factory=dict)  # QAT: the Q-network's input ranges.


def make_network(config: Config, observation_shape: Sequence[int], num_actions: int, precision: Precision = FP32) -> QNetwork:
    """The Q-network for these observations at `precision` (CNN for `[H, W, C]` frames; the
    `quarl` architecture: QuaRL's ActorQ Q-network, a tanh MLP torso with a linear last layer
    and a near-zero head, see `qrl.networks.quarl_mlp`)."""
    torso = torso_for_observation(observation_shape)
    if config.architecture == "quarl":
        if torso != "mlp":
            raise QrlInputError(f"DQN architecture=quarl is QuaRL's MLP for vector observations, not a {torso} torso")
        return QNetwork(num_actions=num_actions, torso="quarl_mlp", hidden_sizes=tuple(config.hidden_sizes),
                        precision=precision, head_init=NEAR_ZERO_INIT)
    return QNetwork(
        num_actions=num_actions,
        torso=torso,
        hidden_sizes=tuple(config.hidden_sizes),
        precision=precision,
        dueling=config.dueling,
        separate_value_stream=config.separate_value_stream,
        layer_norm=config.layer_norm,
    )


def total_updates(config: Config, env_steps: int) -> int:
    """Gradient updates a run of `env_steps` environment steps takes."""
    return qrl_config.total_updates(config, env_steps)


def make_optimizer(config: Config, num_updates: int = 1) -> optax.GradientTransformation:
    """Adam with global-norm gradient clipping; a `linear` learning-rate schedule decays to 0
    over `num_updates` (the state's structure does not depend on `num_updates`). With
    `flat_optimizer` the same arithmetic runs on all parameters raveled into one vector."""
    learning_rate = config.learning_rate
    if config.learning_rate_schedule == "linear":
        learning_rate = optax.linear_schedule(config.learning_rate, 0.0, num_updates)
    optimizer = optax.chain(
        optax.clip_by_global_norm(config.max_grad_norm),
        optax.adam(learning_rate, eps=config.adam_eps),
    )
    return optax.flatten(optimizer) if config.flat_optimizer else optimizer


def qat_network(config: Config, observation_shape: Sequence[int], num_actions: int, quantize: bool = True) -> QNetwork:
    """The Q-network quantization-aware training updates: `qat<N>` on the config's backend
    (`quantize=False`: the quantization delay's float forward pass, ranges tracked)."""
    precision = qat_precision(config.qat_bits, config.qat_backend, fake_quant=quantize)
    return make_network(config, observation_shape, num_actions, precision)


def init(key: jax.Array, config: Config, observation_shape: Sequence[int], observation_dtype, num_actions: int) -> TrainState:
    """A fresh train state; the target network starts as a copy of the online network. With
    `qat_bits`, `quant_ranges` holds the QAT network's (not yet tracked) input ranges."""
    network = make_network(config, observation_shape, num_actions)
    dummy = jnp.zeros((1, *observation_shape), observation_dtype)

    @jax.jit  # one compiled call instead of dozens of op-by-op dispatches (≈2× faster start).
    def fresh_state(key):
        params = network.init(key, dummy)["params"]
        quant_ranges = {}
        if config.qat_bits:
            quant_ranges = init_ranges(qat_network(config, observation_shape, num_actions), key, dummy)
        return TrainState(
            params=params,
            target_params=jax.tree.map(jnp.copy, params),
            opt_state=make_optimizer(config).init(params),
            updates=jnp.zeros((), jnp.int32),
            quant_ranges=quant_ranges,
        )

    return fresh_state(key)


def make_loss(network: nn.Module, config: Config) -> Callable[..., tuple[jax.Array, dict]]:
    """`loss(params, target_params, batch [B, ...], weights [B] = None, quant_ranges = {}) ->
    (loss, metrics)`: the mean Huber TD loss, each transition's term scaled by its importance
    weight when `weights` is given (prioritized replay); `metrics["priorities"] [B]` holds the
    |TD errors|. With QAT `quant_ranges`, the online pass on `observation` is the training-mode
    one (ranges tracked, `metrics["quant_ranges"]` the updated ranges); the passes on
    `next_observation` read the updated ranges frozen."""

    def loss(params, target_params, batch: Transition, weights=None, quant_ranges=None):
        quant_ranges = quant_ranges or {}
        q_tm1, new_ranges = apply_tracking(network, params, quant_ranges, batch.observation)
        q_t_target = apply_frozen(network, target_params, new_ranges, batch.next_observation)
        actions = batch.action.astype(jnp.int32)
        if config.double_q:
            q_t_online = apply_frozen(network, params, new_ranges, batch.next_observation)
            td_errors = losses.batched_double_q_learning_td(
                q_tm1, actions, batch.reward, batch.discount, q_t_target, q_t_online
            )
        else:
            td_errors = losses.batched_q_learning_td(q_tm1, actions, batch.reward, batch.discount, q_t_target)
        per_transition = losses.huber(td_errors, config.huber_delta)
        if weights is not None:
            per_transition = weights * per_transition
        value = jnp.mean(per_transition)
        metrics = {"loss": value, "q_mean": jnp.mean(q_tm1), "priorities": jnp.abs(td_errors)}
        if quant_ranges:
            metrics["quant_ranges"] = new_ranges
        return value, metrics

    return loss


def make_weighted_one_update(network: nn.Module, config: Config, num_updates: int = 1):
    """`one_update(state, batch [B, ...], weights [B]) -> (state, metrics, priorities [B])`: one
    gradient step on the importance-weighted loss; the target network is copied (tau=1) or
    Polyak-averaged every `target_update_period` updates."""
    optimizer = make_optimizer(config, num_updates)
    grad_fn = jax.grad(make_loss(network, config), has_aux=True)

    def one_update(state: TrainState, batch: Transition, weights):
        grads, metrics = grad_fn(state.params, state.target_params, batch, weights, state.quant_ranges)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        count = state.updates + 1
        target_params = optax.periodic_update(
            optax.incremental_update(params, state.target_params, config.tau),
            state.target_params,
            count,
            config.target_update_period,
        )
        priorities = metrics.pop("priorities")
        quant_ranges = metrics.pop("quant_ranges", state.quant_ranges)
        return TrainState(params, target_params, opt_state, count, quant_ranges), metrics, priorities

    return one_update


def make_update(
    network: nn.Module, config: Config, num_updates: int = 1
) -> Callable[[TrainState, Transition], tuple[TrainState, dict]]:
    """`update(state, batches [K, B, ...]) -> (state, metrics averaged over the K updates)`.

    The K gradient steps run under one `lax.scan` inside one jitted call (the state buffer is
    donated). `num_updates` (the run's total) sets the length of a linear learning-rate schedule.
    """
    one_update = make_weighted_one_update(network, config, num_updates)

    def update(state: TrainState, batches: Transition):
        def step(state, batch):
            state, metrics, _ = one_update(state, batch, None)
            return state, metrics

        state, metrics = jax.lax.scan(step, state, batches)
        return state, jax.tree.map(jnp.mean, metrics)

    return jax.jit(update, donate_argnums=0)
