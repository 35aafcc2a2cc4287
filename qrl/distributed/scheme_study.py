"""Which int8 scheme keeps ActorQ actors' own return closest to fp32: a paired evaluation.

The same fp32 policy params are evaluated as fp32 and, for each int8 actor scheme, through the
path an actor takes — `weights.encode` (at the comm precision, with ranges calibrated as the
learner calibrates them) -> `decode` -> `WeightSpec.check` -> `load` -> the policy network at
`actor_network_precision("int8", message.int8_scheme)` — on the same evaluation episodes
(episode i seeded `seed + i` for every candidate), so each scheme's difference to fp32 is paired.
Action agreement is measured on the states the fp32 policy visits.
"""

from typing import Callable, Sequence

import jax
import numpy as np

from qrl import envs, evaluation
from qrl.distributed import weights
from qrl.distributed.agent import DistributedAgent, exploration_schedule
from qrl.quant import FP32, calibrate

CALIBRATION_OBSERVATIONS = 1024  # as many as `Learner.publish` calibrates on.


def exploring_observations(agent: DistributedAgent, params: dict, env_id: str, num_actors: int,
                           steps_per_actor: int, seed: int) -> np.ndarray:
    """Observations `[num_actors * steps_per_actor, ...]` of the fp32 policy under each actor's
    exploration (`exploration_schedule` over the agent's range): what the replay holds and the
    learner calibrates on."""
    policy = jax.jit(agent.policy(FP32))
    noises = exploration_schedule(num_actors, *agent.exploration_range)
    observations = []
    for actor_id, noise in enumerate(noises):
        vector_env = envs.make_vector(env_id, 1, seed + 1000 * actor_id)
        explore = agent.make_explorer(float(noise), np.random.default_rng(seed + actor_id))
        try:
            observation = vector_env.reset()
            for _ in range(steps_per_actor):
                observations.append(observation)
                actions = explore(np.asarray(policy(params, observation)))
                observation = vector_env.step(actions).observation
        finally:
            vector_env.close()
    return np.concatenate(observations)


def calibration_ranges(agent: DistributedAgent, params: dict, observations: np.ndarray, seed: int) -> dict:
    """`calibrate`'s tree over `CALIBRATION_OBSERVATIONS` observations drawn from `observations`."""
    rng = np.random.default_rng(seed)
    chosen = rng.choice(len(observations), min(CALIBRATION_OBSERVATIONS, len(observations)), replace=False)
    return calibrate(agent.policy_network(FP32).apply, params, observations[np.sort(chosen)])


def _recording(policy: Callable, params: dict, states: list) -> Callable[[np.ndarray], np.ndarray]:
    def act(observations: np.ndarray) -> np.ndarray:
        states.append(np.asarray(observations))
        return np.asarray(policy(params, observations))

    return act


def paired_scheme_returns(agent: DistributedAgent, spec: weights.WeightSpec, params: dict, ranges: dict,
                          env_id: str, schemes: Sequence[str], episodes: int, seed: int,
                          comm_precision: str = "int8") -> dict:
    """`{"fp32": {...}, scheme: {...}}` for one set of params: per candidate the mean return
    over `episodes` episodes (the same episodes for every candidate), the per-episode returns,
    and for schemes `diff_mean` (scheme - fp32, paired by episode) and `agreement` (discrete:
    fraction of fp32-visited states where the greedy actions match; continuous:
    `mean_action_distance`, Euclidean)."""
    fp32_policy = jax.jit(agent.policy(FP32))
    visited: list = []
    fp32 = evaluation.evaluate(_recording(fp32_policy, params, visited), env_id, episodes, seed)
    states = np.concatenate(visited)
    fp32_actions = np.asarray(fp32_policy(params, states))
    results = {"fp32": {"return_mean": float(fp32.mean), "returns": [float(r) for r in fp32.returns]}}
    for scheme in schemes:
        blob = weights.encode(params, comm_precision, ranges, int8_scheme=scheme)
        message = spec.check(weights.decode(blob, spec.max_message_bytes))
        loaded = jax.device_put(weights.load(message, "int8"))
        policy = jax.jit(agent.policy(weights.actor_network_precision("int8", message.int8_scheme)))
        result = evaluation.evaluate(lambda observations: np.asarray(policy(loaded, observations)),
                                     env_id, episodes, seed)
        actions = np.asarray(policy(loaded, states))
        if np.issubdtype(fp32_actions.dtype, np.integer):
            agreement = float(np.mean(actions == fp32_actions))
        else:
            difference = (actions - fp32_actions).reshape(len(states), -1)
            agreement = float(np.mean(np.linalg.norm(difference, axis=-1)))
        returns = [float(r) for r in result.returns]
        results[scheme] = {
            "return_mean": float(result.mean), "returns": returns,
            "diff_mean": float(np.mean(np.subtract(returns, results["fp32"]["returns"]))),
            "agreement": agreement, "blob_bytes": len(blob),
        }
    return results


def summarize(per_seed: Sequence[dict], schemes: Sequence[str]) -> dict:
    """Over seeds (each a `paired_scheme_returns` result): per candidate the mean and standard
    deviation (ddof 1) of the seed means, and for schemes of the paired difference to fp32 and
    of the agreement."""

    def stats(values):
        values = np.asarray(values, np.float64)
        return {"mean": float(values.mean()), "std": float(values.std(ddof=1)) if len(values) > 1 else 0.0}

    summary = {"fp32": {"return": stats([seed["fp32"]["return_mean"] for seed in per_seed])}}
    for scheme in schemes:
        summary[scheme] = {key: stats([seed[scheme][field] for seed in per_seed])
                           for key, field in (("return", "return_mean"), ("diff", "diff_mean"), ("agreement", "agreement"))}
    return summary


def closest_to_fp32(summary: dict, schemes: Sequence[str]) -> str:
    """The scheme whose mean paired loss to fp32 (`-diff`) is smallest (first listed on ties)."""
    return min(schemes, key=lambda scheme: (-summary[scheme]["diff"]["mean"], list(schemes).index(scheme)))


def markdown_table(summary: dict, schemes: Sequence[str], agreement_name: str) -> str:
    """One row per candidate: return mean ± std over seeds, paired difference to fp32, agreement."""
    fp32 = summary["fp32"]["return"]
    lines = [f"| actor | return (mean ± std over seeds) | paired diff vs fp32 | {agreement_name} |",
             "|---|---|---|---|",
             f"| fp32 | {fp32['mean']:.1f} ± {fp32['std']:.1f} | — | — |"]
    for scheme in schemes:
        row = summary[scheme]
        lines.append(f"| `{scheme}` | {row['return']['mean']:.1f} ± {row['return']['std']:.1f} | "
                     f"{row['diff']['mean']:+.1f} ± {row['diff']['std']:.1f} | "
                     f"{row['agreement']['mean']:.3f} ± {row['agreement']['std']:.3f} |")
    return "\n".join(lines)
