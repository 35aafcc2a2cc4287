"""A calibrated scale model of ActorQ: from one short run's measured costs, the actor env-steps/s,
learner steps/s and int8/fp32 speedup of N actors on M machines, the learner on CPU or GPU.

The costs (`Profile`, read from a run's `results.json`): an actor's CPU seconds per step (env
step, inference, pulls amortized over the update period, inserts), the learner's CPU seconds per
update (its waits for data cost none), the replay/broadcaster/counter CPU per actor step and the
evaluator's CPU per second. CPU seconds, not wall time, so that the profile run's own sharing of
cores does not inflate them; the run's wall-time breakdown says which phase they go to. Each process is a single-threaded worker (ActorQ gives each
node one XLA thread), so a machine's cores are shared between its processes by max-min fairness
(the OS scheduler's processor sharing): every process gets an equal share of a core, capped at
what it can use, and what it cannot use goes to the others. The learner can use what its data
allows: in QuaRL's regime (`min_size` with `max_times_sampled` M) an update needs B / M freshly
inserted items, so it runs at most (actor steps/s) · M / B updates per second; under the
samples-per-insert limiter it runs at (actor steps/s) · ratio / B, and if it cannot, the limiter
slows the actors to its pace instead. Machine 0 holds the learner, the replay, broadcaster,
counter and evaluator and its share of the actors; the others hold only actors. The model is
solved by bisection on the learner's demand (and, under the limiter, the actors'). Progress per
learner update is taken as equal for both precisions, so the projected time-to-target speedup
is the ratio of learner steps/s.

Contention: an actor's CPU per step is not constant when actors share a machine. Batch-1
inference streams the whole policy from memory every step (34 MB at 2048³ fp32, a quarter of it
in int8), and actors on the same machine evict each other's weights from the shared cache and
split its memory bandwidth. Measured on 2 cores, the cost grows about linearly in log2 of the
actors per machine, so a machine with n actors costs each t_a · (1 + c · log2 n) per step, with
c calibrated per precision from one more run with several actors on one machine
(`contention_from_results`; c = 0 without one).
"""

import dataclasses
import math
from typing import Mapping, Optional, Sequence

from qrl.errors import QrlInputError

SERVICE_NODES = ("replay", "broadcaster", "counter")
ITERATIONS = 200


@dataclasses.dataclass(frozen=True)
class Profile:
    """One precision's measured costs (`profile_from_results`)."""

    actor_precision: str
    actor_step_seconds: float  # t_a: an actor's CPU seconds per environment step.
    learner_update_seconds: float  # t_u: the learner's CPU seconds per update.
    service_cpu_per_step: float  # replay + broadcaster + counter CPU seconds per actor step.
    evaluator_cores: float  # the evaluator's CPU seconds per second.
    batch_size: int
    rate_limiter: str  # "min_size" or "samples_per_insert".
    items_per_update: float  # fresh items one update needs: B / max_times_sampled, or B / samples_per_insert.
    actor_contention: float = 0.0  # c: relative growth of t_a per doubling of the actors on a machine.

    def actor_step_seconds_with(self, actors_on_machine: int) -> float:
        """An actor's CPU seconds per step when `actors_on_machine` actors share its machine."""
        return self.actor_step_seconds * (1.0 + self.actor_contention * math.log2(max(1, actors_on_machine)))


def profile_from_results(results: Mapping, batch_size: int, samples_per_insert: Optional[float] = None) -> Profile:
    """A `Profile` from one ActorQ run's `results.json` (a Ray run: its nodes' CPU seconds are per
    process). `batch_size` is the agent's; `samples_per_insert` the ratio the run used when its
    limiter was `samples_per_insert`."""
    config, counts = results["config"], results["counts"]
    actor_steps, learner_steps = int(counts["actor_steps"]), int(counts["learner_steps"])
    if actor_steps <= 0 or learner_steps <= 0:
        raise QrlInputError("a profile run needs actor steps and learner steps; run it longer")
    by_node = results.get("cpu_seconds", {}).get("by_node", {})
    if results.get("launcher") != "ray" or not by_node:
        raise QrlInputError("a profile run must use --launcher=ray (a process per node, CPU seconds per node)")
    wall = float(results["wall_seconds"])
    rate_limiter = config.get("rate_limiter", "samples_per_insert")
    if rate_limiter == "min_size":
        if not config.get("max_times_sampled"):
            raise QrlInputError("a min_size profile run needs --max_times_sampled (else the learner is unbounded)")
        items = batch_size / float(config["max_times_sampled"])
    else:
        if not samples_per_insert:
            raise QrlInputError("a samples_per_insert profile needs the run's ratio")
        items = batch_size / float(samples_per_insert)
    if float(by_node.get("learner", 0.0)) <= 0:
        raise QrlInputError("a profile run needs the CPU seconds of its actor and learner processes")
    return Profile(
        actor_precision=str(results["actor_precision"]),
        actor_step_seconds=_actor_step_seconds(results),
        learner_update_seconds=float(by_node["learner"]) / learner_steps,
        service_cpu_per_step=sum(float(by_node.get(node, 0.0)) for node in SERVICE_NODES) / actor_steps,
        evaluator_cores=float(by_node.get("evaluator", 0.0)) / wall,
        batch_size=int(batch_size), rate_limiter=rate_limiter, items_per_update=items,
    )


def _actor_step_seconds(results: Mapping) -> float:
    by_node = results.get("cpu_seconds", {}).get("by_node", {})
    steps = int(results["counts"]["actor_steps"])
    actor_cpu = sum(float(seconds) for node, seconds in by_node.items() if node.startswith("actor_"))
    if steps <= 0 or actor_cpu <= 0:
        raise QrlInputError("a run needs actor steps and its actors' CPU seconds (--launcher=ray)")
    return actor_cpu / steps


def contention_from_results(profile: Profile, results: Mapping) -> Profile:
    """`profile` with its contention c fitted to one run of the same settings with n >= 2 actors on
    one machine: c = (t_a(n) / t_a(1) - 1) / log2 n, floored at 0 (sharing a machine does not make a
    step cheaper; a lower measurement is noise)."""
    num_actors = int(results["num_actors"])
    if num_actors < 2:
        raise QrlInputError("a contention run needs two or more actors on one machine")
    if str(results["actor_precision"]) != profile.actor_precision:
        raise QrlInputError(f"a contention run of {results['actor_precision']} actors cannot calibrate the "
                            f"{profile.actor_precision} profile")
    growth = _actor_step_seconds(results) / profile.actor_step_seconds - 1.0
    return dataclasses.replace(profile, actor_contention=max(0.0, growth / math.log2(num_actors)))


def _fair_shares(capacity: float, demands: Sequence[float]) -> list[float]:
    """Max-min fair split of `capacity` cores among processes wanting `demands` cores (each <= 1
    for a single-threaded process): the water-filling allocation."""
    shares = [0.0] * len(demands)
    remaining, open_ = float(capacity), [i for i, demand in enumerate(demands) if demand > 0]
    while open_ and remaining > 1e-12:
        level = remaining / len(open_)
        satisfied = [i for i in open_ if demands[i] - shares[i] <= level]
        if not satisfied:
            for i in open_:
                shares[i] += level
            break
        for i in satisfied:
            remaining -= demands[i] - shares[i]
            shares[i] = demands[i]
        open_ = [i for i in open_ if i not in satisfied]
    return shares


def actors_per_machine(num_actors: int, machines: int) -> list[int]:
    """Actors spread round-robin: machine 0 (with the learner) first."""
    return [num_actors // machines + (1 if index < num_actors % machines else 0) for index in range(machines)]


def _steady(profile: Profile, per_machine: Sequence[int], cores: float, learner_demand: float,
            actor_demand: float) -> tuple[float, float, list[float]]:
    """(actor steps/s, learner's core share, actor shares per machine) when the learner asks for
    `learner_demand` cores and each actor for `actor_demand`; the services' demand follows the
    actors' steps (solved by a short fixed-point loop)."""
    service, actor_steps, shares, machine_shares = 0.0, 0.0, [0.0], [0.0] * len(per_machine)
    for _ in range(ITERATIONS):
        demands = [learner_demand, min(float(len(SERVICE_NODES)), service), min(1.0, profile.evaluator_cores)]
        shares = _fair_shares(cores, demands + [actor_demand] * per_machine[0])
        machine_shares = [shares[3] if per_machine[0] else 0.0] + [
            min(actor_demand, cores / n) if n else 0.0 for n in per_machine[1:]]
        actor_steps = sum(n * share / profile.actor_step_seconds_with(n)
                          for n, share in zip(per_machine, machine_shares) if n)
        wanted = actor_steps * profile.service_cpu_per_step
        if abs(wanted - service) < 1e-9:
            break
        service = 0.5 * service + 0.5 * wanted
    return actor_steps, shares[0], machine_shares


def _bisect(increasing_until_zero, low: float = 0.0, high: float = 1.0) -> float:
    """The point in [low, high] where `increasing_until_zero` (>= 0 below it, < 0 above) changes sign."""
    if increasing_until_zero(high) >= 0:
        return high
    for _ in range(60):
        middle = 0.5 * (low + high)
        if increasing_until_zero(middle) >= 0:
            low = middle
        else:
            high = middle
    return low


def predict(profile: Profile, num_actors: int, machines: int = 1, cores: float = 2.0,
            learner_update_seconds: Optional[float] = None, learner_host_cores: Optional[float] = None) -> dict:
    """Predicted steady state: actor steps/s, learner steps/s, which side binds, the shares.

    `learner_update_seconds` replaces the profile's (e.g. a GPU learner's measured update);
    `learner_host_cores` is the CPU a learner keeps busy per second of updating (1 for a CPU
    learner; a GPU learner's host side, default 1 as well: it waits on the device in a busy loop).
    """
    if num_actors < 1 or machines < 1 or cores <= 0:
        raise QrlInputError("predict needs num_actors >= 1, machines >= 1 and cores > 0")
    t_u = learner_update_seconds or profile.learner_update_seconds
    update_cores = t_u * (1.0 if learner_host_cores is None else float(learner_host_cores))  # core-s per update
    per_machine = actors_per_machine(num_actors, machines)

    def settle(actor_demand: float) -> tuple[float, float, list[float], float]:
        """The learner asks for what the data allows, at most a core: solve that demand."""
        def surplus(demand: float) -> float:
            actor_steps, _, _ = _steady(profile, per_machine, cores, demand, actor_demand)
            return min(1.0, actor_steps / profile.items_per_update * update_cores) - demand

        demand = _bisect(surplus)
        actor_steps, share, machine_shares = _steady(profile, per_machine, cores, demand, actor_demand)
        return actor_steps, share, machine_shares, demand

    actor_demand = 1.0
    if profile.rate_limiter == "samples_per_insert":  # the limiter holds the actors to the learner's pace
        def headroom(demand: float) -> float:
            actor_steps, share, _, _ = settle(demand)
            return share / update_cores - actor_steps / profile.items_per_update

        actor_demand = max(1e-6, _bisect(headroom, 1e-6, 1.0))
    actor_steps, learner_share, machine_shares, _ = settle(actor_demand)
    allowed = actor_steps / profile.items_per_update
    learner_steps = min(learner_share / update_cores, allowed)
    bound = "learner" if learner_steps < 0.98 * allowed or actor_demand < 0.98 else "actors"
    return {"actor_steps_per_second": actor_steps, "learner_steps_per_second": learner_steps, "bound": bound,
            "learner_share": learner_share, "actor_shares": machine_shares, "actors_per_machine": per_machine}


def speedup(fp32: Profile, quantized: Profile, num_actors: int, **options) -> dict:
    """Projected speedup of `quantized` over `fp32` actors: learner steps/s ratio (time to target
    at equal learner steps) and actor steps/s ratio, with both predictions."""
    base, other = predict(fp32, num_actors, **options), predict(quantized, num_actors, **options)
    return {"num_actors": num_actors, "fp32": base, quantized.actor_precision: other,
            "learner_speedup": other["learner_steps_per_second"] / base["learner_steps_per_second"],
            "actor_speedup": other["actor_steps_per_second"] / base["actor_steps_per_second"]}
