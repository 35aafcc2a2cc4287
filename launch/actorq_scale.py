"""ActorQ's scale model from the command line: calibrate on short profile runs, validate against
measured runs, and project the int8/fp32 speedup to more actors, machines or a GPU learner.

    # profile runs (Ray launcher: a process per node), one per actor precision, same settings
    python -m launch.actorq --launcher=ray --actor_precision=fp32 ... --max_seconds=90 --workdir=runs/prof_fp32
    python -m launch.actorq --launcher=ray --actor_precision=int8 ... --max_seconds=90 --workdir=runs/prof_int8
    python -m launch.actorq_scale --profile=runs/prof_fp32 --profile=runs/prof_int8 --cores=2 \\
        --validate=runs/val_fp32_a1,runs/val_int8_a2 --actors=1,2,4,8,16,32,64 --out=runs/actorq_scale

With `--contention=RUN_fp32,RUN_int8` (runs with 2+ actors on this machine, same settings) the
model also grows each actor's per-step cost with the actors sharing its machine (c per precision,
see `qrl.distributed.scale`), validation uses it, and the projection is drawn with and without it.

Writes `<out>/scale.json` (the profiles, the validation rows with predicted vs measured actor and
learner steps/s and their relative errors, the projection) and `<out>/projection.png` (projected
learner-steps/s speedup of each quantized precision over fp32 against the number of actors, one
core per actor plus two for the learner's machine; with `--gpu_update_seconds`, also with the
learner's update at that time). See `qrl.distributed.scale` for the model.
"""

import dataclasses
import os

from absl import flags

from agents.actorq import AgentFactory
from launch import common, studies
from qrl import io
from qrl.distributed import scale
from qrl.distributed.agent import replay_settings
from qrl.errors import QrlInputError

FLAGS = flags.FLAGS
flags.DEFINE_list("profile", [], "ActorQ run directories to calibrate on, one per actor precision (fp32 required).")
flags.DEFINE_list("contention", [], "ActorQ runs with 2+ actors on one machine, same settings, one per precision: "
                  "calibrate how an actor's per-step cost grows with the actors sharing its machine.")
flags.DEFINE_list("validate", [], "ActorQ run directories to predict and compare (same settings as the profiles).")
flags.DEFINE_string("actors", "1,2,4,8,16,32,64", "Numbers of actors to project to.")
flags.DEFINE_float("cores", 2.0, "Cores per machine of the validation runs (this machine's).")
flags.DEFINE_float("gpu_update_seconds", None, "A GPU learner's seconds per update, to project a GPU learner too.")
flags.DEFINE_string("out", None, "Directory for scale.json and projection.png (required).")

VALIDATION_TOLERANCE = 0.15


def _results(path: str) -> dict:
    file = os.path.join(path, "results.json")
    if not os.path.isfile(file):
        raise QrlInputError(f"{path} holds no ActorQ results.json")
    results = io.read_json(file)
    if not isinstance(results, dict) or not isinstance(results.get("config"), dict):
        raise QrlInputError(f"{file} is not an ActorQ run's results (no config)")
    return results


def _read(path: str, use):
    """`use(results)` of the run at `path`; a results.json that lacks what the model reads (not an
    ActorQ run, or written by another version) is bad input, not a traceback."""
    results = _results(path)
    try:
        return use(results)
    except QrlInputError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise QrlInputError(f"{path}/results.json is not an ActorQ run's results "
                            f"({type(error).__name__}: {error})") from error


def _profile(results: dict) -> scale.Profile:
    config = results["config"]
    agent_config = AgentFactory(config["agent"], config["env"], dict(config.get("overrides", {}))).config()
    ratio = config.get("samples_per_insert") or replay_settings(agent_config).samples_per_insert
    return scale.profile_from_results(results, int(agent_config.batch_size), ratio)


def _calibrate(profiles: dict, results: dict) -> scale.Profile:
    """The profile of `results`' precision with its contention fitted to that run."""
    precision = str(results["actor_precision"])
    if precision not in profiles:
        raise QrlInputError(f"--contention: no profile for {precision} actors to calibrate")
    return scale.contention_from_results(profiles[precision], results)


def _validation_row(profiles: dict, results: dict, cores: float) -> dict:
    precision = results["actor_precision"]
    if precision not in profiles:
        raise QrlInputError(f"no profile for {precision} actors to validate {results['config']['agent']} against")
    predicted = scale.predict(profiles[precision], int(results["num_actors"]), cores=cores)
    measured = results["throughput"]
    row = {"actor_precision": precision, "num_actors": int(results["num_actors"]), "bound": predicted["bound"],
           "actor_contention": profiles[precision].actor_contention}
    for key in ("actor_steps_per_second", "learner_steps_per_second"):
        row[f"{key}_predicted"], row[f"{key}_measured"] = predicted[key], float(measured[key])
        row[f"{key}_error"] = predicted[key] / float(measured[key]) - 1.0 if measured[key] else None
    learner = results["breakdown"]["learner"]
    row["learner_sample_wait_fraction"] = learner["sample_wait"] / learner["total"] if learner["total"] else None
    return row


def _plot(projection: dict, path: str) -> None:
    from matplotlib.figure import Figure

    figure = Figure(figsize=(6, 4))
    axes = figure.add_subplot()
    for label, rows in projection.items():
        axes.plot([row["num_actors"] for row in rows], [row["learner_speedup"] for row in rows], marker="o", label=label)
    axes.axhline(1.5, color="gray", linestyle="--", linewidth=1, label="1.5×")
    axes.set_xscale("log", base=2)
    axes.set_xlabel("actors (one core each)")
    axes.set_ylabel("projected speedup (learner steps/s)")
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def run() -> None:
    out = common.require_workdir(FLAGS.out, "--out")
    counts = studies.parse_ints(FLAGS.actors, "--actors", minimum=1)
    common.check_flag_ranges({"cores": common.POSITIVE, "gpu_update_seconds": common.POSITIVE})
    if not FLAGS.profile:
        raise QrlInputError("--profile: give the fp32 profile run and one per quantized precision")
    profiles = {}
    for path in FLAGS.profile:
        profile = _read(path, _profile)
        profiles[profile.actor_precision] = profile
    if "fp32" not in profiles or len(profiles) < 2:
        raise QrlInputError("--profile needs an fp32 run and at least one quantized run")
    uncontended = dict(profiles)
    for path in FLAGS.contention:
        calibrated = _read(path, lambda results: _calibrate(uncontended, results))
        profiles[calibrated.actor_precision] = calibrated
    validation = [_read(path, lambda results: _validation_row(profiles, results, FLAGS.cores)) for path in FLAGS.validate]
    learners = {"CPU learner": None}
    if FLAGS.gpu_update_seconds:
        learners[f"GPU learner ({1000 * FLAGS.gpu_update_seconds:g} ms/update)"] = FLAGS.gpu_update_seconds
    projection = {}
    variants = {"": profiles}
    if FLAGS.contention:
        variants = {", contention": profiles, ", no contention": uncontended}
    for suffix, variant in variants.items():
        for precision, profile in variant.items():
            if precision == "fp32":
                continue
            for label, update_seconds in learners.items():
                projection[f"{precision}, {label}{suffix}"] = [
                    scale.speedup(variant["fp32"], profile, count, cores=count + 2.0,
                                  learner_update_seconds=update_seconds) for count in counts]
    os.makedirs(out, exist_ok=True)
    crossings = {label: next((row["num_actors"] for row in rows if row["learner_speedup"] >= 1.5), None)
                 for label, rows in projection.items()}
    io.atomic_write_json(os.path.join(out, "scale.json"), {
        "profiles": {name: dataclasses.asdict(profile) for name, profile in profiles.items()},
        "contention_runs": list(FLAGS.contention),
        "validation": validation, "validation_tolerance": VALIDATION_TOLERANCE,
        "projection": projection, "first_actor_count_at_1.5x": crossings,
    })
    _plot(projection, os.path.join(out, "projection.png"))
    for name, profile in profiles.items():
        if profile.actor_contention:
            print(f"{name}: contention c = {profile.actor_contention:.3f} (t_a x (1 + c log2 n) for n actors per machine)")
    for row in validation:
        print(f"{row['actor_precision']} x{row['num_actors']} ({row['bound']}-bound): actor steps/s predicted "
              f"{row['actor_steps_per_second_predicted']:.0f} vs {row['actor_steps_per_second_measured']:.0f} "
              f"({100 * row['actor_steps_per_second_error']:+.1f}%), learner steps/s predicted "
              f"{row['learner_steps_per_second_predicted']:.1f} vs {row['learner_steps_per_second_measured']:.1f} "
              f"({100 * row['learner_steps_per_second_error']:+.1f}%)")
    for label, count in crossings.items():
        print(f"{label}: speedup reaches 1.5x at {count} actors" if count else f"{label}: below 1.5x up to "
              f"{counts[-1]} actors")
    print(f"-> {out}/scale.json, {out}/projection.png")


if __name__ == "__main__":
    common.run_entry_point(run)
