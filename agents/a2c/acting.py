"""A2C acts as PPO does: sampled actions while training, greedy ones for evaluation.

See `agents/ppo/acting.py` (categorical over logits, or a Gaussian clipped to the bounds).
"""

from agents.ppo.acting import make_greedy_policy, make_greedy_policy_fn, make_policy

__all__ = ["make_greedy_policy", "make_greedy_policy_fn", "make_policy"]
