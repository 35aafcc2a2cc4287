"""Normalized scores: `100 * (R - random) / (expert - random)` (Fu et al., 2020, D4RL)."""

from typing import Optional

import numpy as np

from qrl.errors import QrlInputError

# D4RL's reference returns (d4rl/infos.py REF_MIN_SCORE / REF_MAX_SCORE), shared by every
# dataset level of a locomotion environment.
D4RL_REFERENCE_RETURNS = {
    "halfcheetah": (-280.178953, 12135.0),
    "hopper": (-20.272305, 3234.3),
    "walker2d": (1.629008, 4592.3),
}


def d4rl_reference(env_name: str) -> Optional[tuple[float, float]]:
    """(random, expert) returns for a D4RL locomotion name or id (`halfcheetah-medium-v2`,
    `gym:HalfCheetah-v5`), or None when it is not one of D4RL's."""
    text = env_name.lower().split(":")[-1].replace("_", "").replace("-", "")
    for name, reference in D4RL_REFERENCE_RETURNS.items():
        if text.startswith(name):
            return reference
    return None


def normalized_score(returns, reference: tuple[float, float]) -> np.ndarray:
    """`100 * (returns - random) / (expert - random)` for `reference = (random, expert)`."""
    random_return, expert_return = (float(value) for value in reference)
    if not expert_return > random_return:
        raise QrlInputError(f"reference returns must have expert > random, got {reference}")
    return 100.0 * (np.asarray(returns, np.float64) - random_return) / (expert_return - random_return)
