"""BCQ acting: the best of `acting_samples` perturbed VAE samples per state under the first critic."""

import jax
import jax.numpy as jnp

from agents.bcq import learning
from agents.bcq.config import Config
from qrl.networks.continuous import scale_actions
from qrl.offline import PolicyFn


def make_policy(config: Config, bounds) -> PolicyFn:
    """`policy(policy_params, observations [N, D]) -> actions [N, A]` in environment units: for
    each state, `acting_samples` candidates `perturb(s, decode(s, z))`, `z ~ N(0, 1)` clipped to
    `+-latent_clip`, and the one with the largest `Q_1`.

    The latents `[acting_samples, L]` come from a fixed key (`config.acting_seed`) and are the
    same for every state, so a state's action depends on the params and that state alone — not
    on the batch it arrives in — and the policy is a function of a symbolic batch (what the ONNX
    export needs). The best candidate is picked with a one-hot sum (exact: one term is the
    candidate, the others are zeros) rather than a gather, for the same reason."""
    forward = learning.Forward(config, bounds)
    latents = learning.sample_latents(jax.random.PRNGKey(config.acting_seed),
                                      (config.acting_samples, forward.latent_size), config.latent_clip)

    def policy(params, observations):
        count = observations.shape[0]
        per_state = jnp.broadcast_to(latents, (count, *latents.shape))
        repeated, actions = forward.candidates({"decoder": params["decoder"]}, params["actor"], observations, per_state)
        q1 = forward.sampled_q(params["critic"], repeated, actions, first_only=True)[0]
        best = jax.nn.one_hot(jnp.argmax(q1.reshape(count, config.acting_samples), axis=-1), config.acting_samples)
        chosen = jnp.sum(best[:, :, None] * actions.reshape(count, config.acting_samples, -1), axis=1)
        return scale_actions(chosen, *bounds)

    return policy
