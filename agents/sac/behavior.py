"""SAC policies as data-collection behaviour (`qrl.datasets.collect`): D4RL sampled its datasets'
actions from SAC's stochastic policy; its `random` level is a randomly initialized policy."""

from agents.sac import acting, init_state, policy_params
from qrl.networks.continuous import bounds


def random_policy_params(config, observation_spec, action_spec, seed: int):
    """A randomly initialized SAC actor's params (`learning.init` keyed by `seed`)."""
    return policy_params(init_state(config, observation_spec, action_spec, seed))


def make_sampling_act(config, action_spec):
    """SAC's stochastic `act(params, observations [N, D], noise [N, A]) -> actions [N, A]` for
    `action_spec`'s bounds: the tanh-Gaussian sample `collect_steps` drives with its noise."""
    return acting.make_act(config, bounds(action_spec))
