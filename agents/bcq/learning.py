"""BCQ learning (Fujimoto, Meger, Precup, ICML 2019; reference code github.com/sfujim/BCQ, continuous):
a conditional VAE of the data's actions, a perturbation actor that nudges its samples by at most
`phi` (half action ranges), and twin critics with a soft clipped double-Q target over sampled
actions; K updates fused per jitted call, each network optionally under a fixed pruning mask.

One update, in the reference's order (`BCQ.train`):
1. VAE: `z = mean + std * eps` from the encoder at `(s, a)`, loss `mean (decode(s, z) - a)^2 + 0.5 * KL`,
   `KL = -0.5 * mean(1 + log std^2 - mean^2 - std^2)`, `log std` clamped to [-4, 15].
2. critics: for each next state, `target_samples` actions `perturb'(s', decode(s', z))` with
   `z ~ N(0, 1)` clipped to `+-latent_clip` (the updated VAE, the target actor), scored by the target
   critics as `lmbda * min_i Q'_i + (1 - lmbda) * max_i Q'_i`, the max over the samples taken;
   `y = r + gamma * d * that`; loss `sum_i mean (Q_i(s, a) - y)^2`.
3. actor: `-mean Q_1(s, perturb(s, decode(s, z)))` under the updated critics and VAE.
4. target actor and critics move by Polyak averaging (masked: they share their network's mask).

Actions inside the networks are rescaled to `[-1, 1]` ("unit" actions); the critics take
environment actions (`CriticEnsemble`), which `scale_actions` gives them.
"""

from typing import Any, Optional, Sequence

import chex
import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from agents.bcq.config import LOG_STD_MAX, LOG_STD_MIN, Config
from pruning import apply_mask, check_mask, masked, polyak_masked, synflow_layer_outputs, synflow_own_flow
from qrl import offline, offpolicy
from qrl.networks.continuous import CriticEnsemble, TrainingMLP, compute_params, dense, scale_actions, unscale_actions
from qrl.quant import FP32, Precision, parse_precision
from qrl.replay import Transition

NETWORKS = ("vae", "actor", "critic")  # what can be pruned, each scored with its own training loss
POLICY_NETWORKS = ("vae/decoder", "actor", "critic")  # what acting runs (`policy_params`): the deployed bytes.
NUM_CRITICS = 2
SCORING_SEED = 0  # the fixed key of the scoring losses' sampling (a scorer's loss takes no key).


@flax.struct.dataclass
class TrainState:
    """What BCQ learning threads from one update to the next (params float32)."""

    vae_params: dict  # {"encoder": ..., "decoder": ...}
    actor_params: dict  # the perturbation model.
    critic_params: dict  # stacked twin critics: every leaf `[2, ...]`.
    target_actor_params: dict
    target_critic_params: dict
    vae_opt_state: optax.OptState
    actor_opt_state: optax.OptState
    critic_opt_state: optax.OptState
    key: jax.Array  # draws the VAE's noise and the sampled latents.
    updates: jax.Array  # int32 count of gradient updates taken.
    masks: Any = None  # {network: mask or None} for NETWORKS; targets share their network's mask.


class Encoder(nn.Module):
    """`(observations [B, D], unit actions [B, A]) -> (mean [B, L], log_std [B, L])`, the
    log-std clamped to [-4, 15] after dividing both heads by `temperature`."""

    hidden_sizes: Sequence[int]
    latent_size: int
    precision: Precision = FP32

    @nn.compact
    def __call__(self, observations: jax.Array, unit_actions: jax.Array, temperature=1.0):
        inputs = jnp.concatenate([observations, unit_actions], axis=-1)
        features = TrainingMLP(tuple(self.hidden_sizes), self.precision, name="torso")(inputs)
        mean = dense(features, self.latent_size, self.precision, "mean", is_output=True) / temperature
        log_std = dense(features, self.latent_size, self.precision, "log_std", is_output=True) / temperature
        return mean, jnp.clip(log_std, LOG_STD_MIN, LOG_STD_MAX)


class Decoder(nn.Module):
    """`(observations [B, D], latents [B, L]) -> tanh(head / temperature)` unit actions `[B, A]`."""

    hidden_sizes: Sequence[int]
    action_size: int
    precision: Precision = FP32

    @nn.compact
    def __call__(self, observations: jax.Array, latents: jax.Array, temperature=1.0) -> jax.Array:
        inputs = jnp.concatenate([observations, latents.astype(observations.dtype)], axis=-1)
        features = TrainingMLP(tuple(self.hidden_sizes), self.precision, name="torso")(inputs)
        return jnp.tanh(dense(features, self.action_size, self.precision, "head", is_output=True) / temperature)


class Perturbation(nn.Module):
    """The perturbation actor: `(observations [B, D], unit actions [B, A]) ->
    clip(a + phi * tanh(head / temperature), -1, 1)` `[B, A]`."""

    hidden_sizes: Sequence[int]
    action_size: int
    phi: float
    precision: Precision = FP32

    @nn.compact
    def __call__(self, observations: jax.Array, unit_actions: jax.Array, temperature=1.0) -> jax.Array:
        inputs = jnp.concatenate([observations, unit_actions], axis=-1)
        features = TrainingMLP(tuple(self.hidden_sizes), self.precision, name="torso")(inputs)
        shift = self.phi * jnp.tanh(dense(features, self.action_size, self.precision, "head", is_output=True) / temperature)
        return jnp.clip(unit_actions + shift, -1.0, 1.0)


def latent_size(config: Config, action_size: int) -> int:
    """The VAE's latent size: `config.latent_size`, or 2 * action size when it is 0 (reference)."""
    return config.latent_size or 2 * action_size


def target_precision(config: Config) -> Precision:
    """The precision of the sampled target and acting passes (`target_matmul_dtype`)."""
    return FP32 if config.target_matmul_dtype == "fp32" else parse_precision(config.target_matmul_dtype)


# ----- losses -------------------------------------------------------------------------------------


def vae_loss(reconstruction: jax.Array, unit_actions: jax.Array, mean: jax.Array, log_std: jax.Array):
    """`(loss, (recon, kl))`: `recon + 0.5 * kl` with `recon = mean (reconstruction - a)^2` over
    `[B, A]` and `kl = -0.5 * mean(1 + 2 log_std - mean^2 - exp(2 log_std))` over `[B, L]`."""
    chex.assert_equal_shape((reconstruction, unit_actions))
    chex.assert_equal_shape((mean, log_std))
    recon = jnp.mean(jnp.square(reconstruction - unit_actions))
    kl = -0.5 * jnp.mean(1.0 + 2.0 * log_std - jnp.square(mean) - jnp.exp(2.0 * log_std))
    return recon + 0.5 * kl, (recon, kl)


def soft_clipped_max(q: jax.Array, lmbda: float) -> jax.Array:
    """`max_n (lmbda * min_i q[i, b, n] + (1 - lmbda) * max_i q[i, b, n])` `[B]` for the critics'
    values `q [C, B, N]` of N sampled actions per state."""
    chex.assert_rank(q, 3)
    soft = lmbda * jnp.min(q, axis=0) + (1.0 - lmbda) * jnp.max(q, axis=0)
    return jnp.max(soft, axis=-1)


def td_target(reward: jax.Array, discount: jax.Array, next_value: jax.Array, gamma: float) -> jax.Array:
    """`reward + gamma * discount * next_value` `[B]`, without gradient."""
    chex.assert_equal_shape((reward, discount, next_value))
    return jax.lax.stop_gradient(reward + gamma * discount * next_value)


def critic_loss(q: jax.Array, target: jax.Array) -> jax.Array:
    """`sum_i mean_b (q[i, b] - target[b])^2` for `q [C, B]`, `target [B]` (each critic's MSE)."""
    chex.assert_rank((q, target), (2, 1))
    chex.assert_equal(q.shape[1], target.shape[0])
    return jnp.sum(jnp.mean(jnp.square(q - target[None]), axis=-1))


def sample_latents(key: jax.Array, shape: Sequence[int], clip: float) -> jax.Array:
    """`N(0, 1)` latents of `shape`, clipped to `[-clip, clip]` (the reference's `decode(s)`)."""
    return jnp.clip(jax.random.normal(key, tuple(shape)), -clip, clip)


# ----- forward passes -----------------------------------------------------------------------------


class Forward:
    """The forward passes the update, the scoring losses and acting share, on unit actions.

    The sampled passes (`candidates`, `sampled_q`) run at `target_precision(config)`; the others
    (the losses' passes) at `training_precision(config)` when `training`, else at fp32 (scoring
    and initialization). Params stay float32 and are cast right before each apply.
    """

    def __init__(self, config: Config, bounds, training: bool = False):
        self.config, self.bounds = config, bounds
        action_size = len(bounds[0])
        self.latent_size = latent_size(config, action_size)
        self.precision = target_precision(config)
        self.training_precision = offpolicy.training_precision(config) if training else FP32
        low, high = bounds

        def modules(precision):
            return (Decoder(tuple(config.vae_hidden_sizes), action_size, precision),
                    Perturbation(tuple(config.actor_hidden_sizes), action_size, config.phi, precision),
                    CriticEnsemble(low, high, tuple(config.critic_hidden_sizes), precision, NUM_CRITICS),
                    CriticEnsemble(low, high, tuple(config.critic_hidden_sizes), precision, 1))

        self.encoder = Encoder(tuple(config.vae_hidden_sizes), self.latent_size, self.training_precision)
        self.decoder, self.actor, self.critics, self.first_critic = modules(self.training_precision)
        self.sampled = modules(self.precision)

    def _params(self, params):
        return {"params": compute_params(params, self.training_precision)}

    def encode(self, vae_params, observations, unit_actions, temperature=1.0):
        return self.encoder.apply(self._params(vae_params["encoder"]), observations, unit_actions, temperature)

    def decode(self, vae_params, observations, latents, temperature=1.0):
        return self.decoder.apply(self._params(vae_params["decoder"]), observations, latents, temperature)

    def perturb(self, actor_params, observations, unit_actions, temperature=1.0):
        return self.actor.apply(self._params(actor_params), observations, unit_actions, temperature)

    def q_values(self, critic_params, observations, unit_actions):
        """All critics' `[C, B]` at unit actions."""
        return self.critics.apply(self._params(critic_params), observations, scale_actions(unit_actions, *self.bounds))

    def first_q(self, critic_params, observations, unit_actions):
        """`Q_1(s, a)` `[B]` at unit actions."""
        first = jax.tree.map(lambda leaf: leaf[:1], critic_params)
        return self.first_critic.apply(self._params(first), observations, scale_actions(unit_actions, *self.bounds))[0]

    def vae_loss(self, vae_params, observations, unit_actions, noise, temperature=1.0):
        """`vae_loss` with `z = mean + exp(log_std) * noise [B, L]`; outputs divided by `temperature`."""
        mean, log_std = self.encode(vae_params, observations, unit_actions, temperature)
        reconstruction = self.decode(vae_params, observations, mean + jnp.exp(log_std) * noise, temperature)
        return vae_loss(reconstruction, unit_actions, mean, log_std)

    def actor_loss(self, actor_params, vae_params, critic_params, observations, latents, temperature=1.0):
        """`-mean Q_1(s, perturb(s, decode(s, latents [B, L])))`."""
        actions = self.perturb(actor_params, observations, self.decode(vae_params, observations, latents), temperature)
        return -jnp.mean(self.first_q(critic_params, observations, actions))

    def candidates(self, vae_params, actor_params, observations, latents):
        """`(observations [B*N, D], unit actions [B*N, A])`: N perturbed VAE samples per state,
        state-major (rows `b*N .. b*N + N - 1` are state b's), for `latents [B, N, L]`."""
        decoder, actor, _, _ = self.sampled
        batch, samples = latents.shape[:2]
        repeated = jnp.repeat(observations, samples, axis=0)
        flat_latents = latents.reshape(batch * samples, -1)
        decoded = decoder.apply({"params": compute_params(vae_params["decoder"], self.precision)}, repeated,
                                flat_latents)
        actions = actor.apply({"params": compute_params(actor_params, self.precision)}, repeated, decoded)
        return repeated, actions.astype(jnp.float32)

    def sampled_q(self, critic_params, observations, unit_actions, first_only=False):
        """All critics' `[C, M]` (`[1, M]` with `first_only`) at the sampled pass's precision."""
        _, _, critics, first_critic = self.sampled
        if first_only:
            critics, critic_params = first_critic, jax.tree.map(lambda leaf: leaf[:1], critic_params)
        params = compute_params(critic_params, self.precision)
        return critics.apply({"params": params}, observations, scale_actions(unit_actions, *self.bounds))

    def targets(self, vae_params, target_actor_params, target_critic_params, batch: Transition, latents):
        """TD targets `[B]` from `latents [B, N, L]` per next state (module docstring, step 2)."""
        observations, actions = self.candidates(vae_params, target_actor_params, batch.next_observation, latents)
        q = self.sampled_q(target_critic_params, observations, actions).astype(jnp.float32)
        next_value = soft_clipped_max(q.reshape(q.shape[0], *latents.shape[:2]), self.config.lmbda)
        return td_target(batch.reward, batch.discount, next_value, self.config.gamma)

    def target_latents(self, key, batch_size: int):
        return sample_latents(key, (batch_size, self.config.target_samples, self.latent_size), self.config.latent_clip)


# ----- pruning ------------------------------------------------------------------------------------


def networks_at_init(state: TrainState) -> dict:
    """`{network: params}` that `scoring_losses` take (the state's current online params)."""
    return {"vae": state.vae_params, "actor": state.actor_params, "critic": state.critic_params}


def scoring_losses(config: Config, bounds, state: TrainState) -> dict:
    """`{network: loss_fn(params, batch, temperature) -> scalar}` for the pruning scorers: each
    network's own training loss as a function of its params, the other networks fixed at `state`'s
    (the initial state's), the scored network's outputs divided by `temperature`, every sample
    drawn from a fixed key (`SCORING_SEED`) so each loss is a deterministic function of params and
    batch.

    vae: the VAE loss (encoder mean and log-std, decoder head divided); critic: the TD loss of
    `Q / temperature` with targets from `state`'s VAE, target actor and target critics; actor:
    the actor loss (perturbation head divided) under `state`'s VAE and first critic.
    """
    forward = Forward(config, bounds)
    noise_key, target_key, actor_key = jax.random.split(jax.random.PRNGKey(SCORING_SEED), 3)

    def vae_fn(vae_params, batch: Transition, temperature) -> jax.Array:
        unit_actions = unscale_actions(batch.action, *bounds)
        noise = jax.random.normal(noise_key, (unit_actions.shape[0], forward.latent_size))
        return forward.vae_loss(vae_params, batch.observation, unit_actions, noise, temperature)[0]

    def critic_fn(critic_params, batch: Transition, temperature) -> jax.Array:
        latents = forward.target_latents(target_key, batch.reward.shape[0])
        target = forward.targets(state.vae_params, state.target_actor_params, state.target_critic_params, batch,
                                 latents)
        q = forward.q_values(critic_params, batch.observation, unscale_actions(batch.action, *bounds))
        return critic_loss(q / temperature, target)

    def actor_fn(actor_params, batch: Transition, temperature) -> jax.Array:
        latents = sample_latents(actor_key, (batch.reward.shape[0], forward.latent_size), config.latent_clip)
        return forward.actor_loss(actor_params, state.vae_params, state.critic_params, batch.observation, latents,
                                  temperature)

    return {"vae": vae_fn, "actor": actor_fn, "critic": critic_fn}




def synflow_inputs(config: Config, bounds, observation_size: int) -> dict:
    """`{network: (apply_fn(params, inputs), input_shape)}` for SynFlow's data-free scoring.

    vae: inputs `[1, D + A + L]` split into observations, unit actions and latents; the encoder's
    mean and log-std heads `[1, L]` each on (observations, actions) and the decoder's head `[1, A]`
    on (observations, latents), encoder and decoder each over its own flow
    (`pruning.synflow_own_flow`); actor: `[1, D + A]` -> the perturbation head `[1, A]` before its tanh; critic: `[1, D + A]` -> each
    critic's Q over its own value `[C, 1]`. Heads are taken before their tanh or clip.
    """
    forward = Forward(config, bounds)
    action_end = observation_size + len(bounds[0])

    def vae_fn(vae_params, inputs):
        observations, actions, latents = (inputs[:, :observation_size], inputs[:, observation_size:action_end],
                                          inputs[:, action_end:])
        mean, log_std = synflow_layer_outputs(forward.encoder, vae_params["encoder"], ("mean", "log_std"),
                                              observations, actions)
        (head,) = synflow_layer_outputs(forward.decoder, vae_params["decoder"], ("head",), observations, latents)
        return synflow_own_flow(jnp.sum(mean) + jnp.sum(log_std)), synflow_own_flow(jnp.sum(head))

    def actor_fn(actor_params, inputs):
        observations, actions = inputs[:, :observation_size], inputs[:, observation_size:]
        return synflow_layer_outputs(forward.actor, actor_params, ("head",), observations, actions)[0]

    def critic_fn(critic_params, inputs):
        return synflow_own_flow(forward.q_values(critic_params, inputs[:, :observation_size], inputs[:, observation_size:]))

    return {"vae": (vae_fn, (1, action_end + forward.latent_size)), "actor": (actor_fn, (1, action_end)),
            "critic": (critic_fn, (1, action_end))}


# ----- state --------------------------------------------------------------------------------------


def network_masks(masks: Optional[dict]) -> dict:
    """`{network: mask or None}` over NETWORKS; another network name is an input error."""
    return offline.network_masks("bcq", masks, NETWORKS)


def make_optimizers(config: Config, masks: Optional[dict] = None) -> dict:
    """`{network: Adam}`, each restricted to its mask's kept weights when it has one."""
    masks = network_masks(masks)
    rates = {"vae": config.vae_learning_rate, "actor": config.actor_learning_rate,
             "critic": config.critic_learning_rate}
    adams = {name: offpolicy.adam(rate) for name, rate in rates.items()}
    return {name: adams[name] if masks[name] is None else masked(adams[name], masks[name]) for name in NETWORKS}


def _polyak(online, target, tau: float, mask: Any):
    return offpolicy.polyak(online, target, tau) if mask is None else polyak_masked(online, target, tau, mask)


def init(key: jax.Array, config: Config, observation_size: int, bounds, masks: Optional[dict] = None) -> TrainState:
    """A fresh train state; each network with a mask (checked against its params) starts masked;
    the targets start as copies of the (masked) actor and critics."""
    masks = network_masks(masks)
    forward = Forward(config, bounds)
    observations = jnp.zeros((1, observation_size), jnp.float32)
    actions = jnp.zeros((1, len(bounds[0])), jnp.float32)
    latents = jnp.zeros((1, forward.latent_size), jnp.float32)
    encoder_key, decoder_key, actor_key, critic_key, key = jax.random.split(key, 5)
    params = {
        "vae": {"encoder": forward.encoder.init(encoder_key, observations, actions)["params"],
                "decoder": forward.decoder.init(decoder_key, observations, latents)["params"]},
        "actor": forward.actor.init(actor_key, observations, actions)["params"],
        "critic": forward.critics.init(critic_key, observations, actions)["params"],
    }
    for name, mask in masks.items():
        if mask is not None:
            check_mask(params[name], mask, f"{name} mask")
            params[name] = apply_mask(params[name], mask)
    optimizers = make_optimizers(config, masks)
    return TrainState(
        vae_params=params["vae"],
        actor_params=params["actor"],
        critic_params=params["critic"],
        target_actor_params=jax.tree.map(jnp.copy, params["actor"]),
        target_critic_params=jax.tree.map(jnp.copy, params["critic"]),
        vae_opt_state=optimizers["vae"].init(params["vae"]),
        actor_opt_state=optimizers["actor"].init(params["actor"]),
        critic_opt_state=optimizers["critic"].init(params["critic"]),
        key=key,
        updates=jnp.zeros((), jnp.int32),
        masks=jax.tree.map(jnp.copy, masks),  # the loop donates the state: the caller's masks must survive it.
    )


# ----- the update ---------------------------------------------------------------------------------


def make_update(config: Config, bounds, masks: Optional[dict] = None):
    """`update(state, batches [K, B, ...]) -> (state, metrics)` (pure; the loop jits it).

    Metrics, averaged over the K updates, each loss before its step: `vae_loss`, `recon_loss`,
    `kl_loss`, `critic_loss`, `actor_loss`, `q_mean` (online critics at the data's actions),
    `target_mean`. The losses' passes run at `matmul_dtype`, the sampled target pass at
    `target_matmul_dtype`.
    """
    masks = network_masks(masks)
    forward = Forward(config, bounds, training=True)
    optimizers = make_optimizers(config, masks)

    def step(name, params, grads, opt_state):
        return offpolicy.apply_gradients(optimizers[name], params, grads, opt_state)

    def critic_loss_fn(critic_params, observations, unit_actions, target):
        q = forward.q_values(critic_params, observations, unit_actions)
        return critic_loss(q, target), jnp.mean(q)

    def one_update(state: TrainState, batch: Transition):
        key, noise_key, target_key, actor_key = jax.random.split(state.key, 4)
        batch_size = batch.reward.shape[0]
        unit_actions = unscale_actions(batch.action, *bounds)

        noise = jax.random.normal(noise_key, (batch_size, forward.latent_size))
        (vae_value, (recon, kl)), grads = jax.value_and_grad(forward.vae_loss, has_aux=True)(
            state.vae_params, batch.observation, unit_actions, noise
        )
        vae_params, vae_opt_state = step("vae", state.vae_params, grads, state.vae_opt_state)

        target = forward.targets(vae_params, state.target_actor_params, state.target_critic_params, batch,
                                 forward.target_latents(target_key, batch_size))
        (critic_value, q_mean), grads = jax.value_and_grad(critic_loss_fn, has_aux=True)(
            state.critic_params, batch.observation, unit_actions, target
        )
        critic_params, critic_opt_state = step("critic", state.critic_params, grads, state.critic_opt_state)

        latents = sample_latents(actor_key, (batch_size, forward.latent_size), config.latent_clip)
        actor_value, grads = jax.value_and_grad(forward.actor_loss)(
            state.actor_params, vae_params, critic_params, batch.observation, latents
        )
        actor_params, actor_opt_state = step("actor", state.actor_params, grads, state.actor_opt_state)

        new_state = state.replace(
            vae_params=vae_params,
            actor_params=actor_params,
            critic_params=critic_params,
            target_actor_params=_polyak(actor_params, state.target_actor_params, config.tau, masks["actor"]),
            target_critic_params=_polyak(critic_params, state.target_critic_params, config.tau, masks["critic"]),
            vae_opt_state=vae_opt_state,
            actor_opt_state=actor_opt_state,
            critic_opt_state=critic_opt_state,
            key=key,
            updates=state.updates + 1,
        )
        metrics = {"vae_loss": vae_value, "recon_loss": recon, "kl_loss": kl, "critic_loss": critic_value,
                   "actor_loss": actor_value, "q_mean": q_mean, "target_mean": jnp.mean(target)}
        return new_state, metrics

    return offpolicy.fuse(one_update)


def policy_params(state: TrainState) -> dict:
    """What the policy runs on: `{"decoder", "actor", "critic"}` (the VAE's decoder, the
    perturbation actor, the stacked critics, of which acting uses the first)."""
    return {"decoder": state.vae_params["decoder"], "actor": state.actor_params, "critic": state.critic_params}


def update_count(state: TrainState) -> jax.Array:
    return state.updates
