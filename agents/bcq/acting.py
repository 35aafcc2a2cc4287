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
    `+-latent_clip`, and the one with the largest `Q_1`. The latents come from a fixed key
    (`config.acting_seed`), so a call is a deterministic function of params and observations."""
    forward = learning.Forward(config, bounds)
    key = jax.random.PRNGKey(config.acting_seed)

    def policy(params, observations):
        count = observations.shape[0]
        latents = learning.sample_latents(key, (count, config.acting_samples, forward.latent_size),
                                          config.latent_clip)
        repeated, actions = forward.candidates({"decoder": params["decoder"]}, params["actor"], observations, latents)
        q1 = forward.sampled_q(params["critic"], repeated, actions, first_only=True)[0]
        best = jnp.argmax(q1.reshape(count, config.acting_samples), axis=-1)
        chosen = jnp.take_along_axis(actions.reshape(count, config.acting_samples, -1), best[:, None, None], axis=1)
        return scale_actions(chosen[:, 0], *bounds)

    return policy
