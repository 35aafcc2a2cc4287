"""Questions agents ask of an action spec: discrete or continuous, and how many actions."""

from dm_env import specs


def is_discrete(action_spec: specs.Array) -> bool:
    """True for a `DiscreteArray` (one integer action), False for continuous `BoundedArray`s."""
    return isinstance(action_spec, specs.DiscreteArray)


def num_actions(action_spec: specs.Array) -> int:
    """Number of discrete actions, or the action dimension of a continuous spec.

    A continuous spec of shape `[A]` gives `A`; higher ranks give their element count.
    """
    if isinstance(action_spec, specs.DiscreteArray):
        return int(action_spec.num_values)
    size = 1
    for dim in action_spec.shape:
        size *= int(dim)
    return size
