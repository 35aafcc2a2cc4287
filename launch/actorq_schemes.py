"""Which int8 scheme ActorQ actors should run: the actors' own return per scheme, paired with fp32.

    python -m launch.actorq_schemes --workdir=results/actorq_schemes --train_dir=runs/actorq_schemes

For each task (`agent@env@learner_steps`) and seed: an ActorQ run with fp32 actors trains the
learner (in-process launcher, 2 actors, `<train_dir>/<agent>-<env>/seed<k>/`; a run whose
checkpoint exists is reused), then its final policy params are evaluated as fp32 and through
each int8 actor scheme's encode -> decode -> check -> load path on the same episodes
(`qrl.distributed.scheme_study`), with ranges calibrated on observations of the fp32 policy under
the actors' exploration. `<workdir>/results.json` gains each cell as it finishes (a rerun skips
finished cells); `<workdir>/report.md` holds the tables and the scheme closest to fp32.
"""

import os
import types

import jax
import numpy as np
import orbax.checkpoint as ocp
from absl import flags

from agents.actorq import AgentFactory, check_agent, run_actorq
from launch import common
from qrl import envs, io
from qrl.checkpointing import Checkpointer
from qrl.distributed import scheme_study, weights
from qrl.distributed.run import CHECKPOINT_DIR, ActorQConfig
from qrl.errors import QrlInputError

RESULTS_FILE, REPORT_FILE = "results.json", "report.md"
EVAL_SEED_OFFSET = 10_000  # evaluation episodes differ from training's environments.

FLAGS = flags.FLAGS
flags.DEFINE_string("workdir", None, "Where results.json and report.md go (required).")
flags.DEFINE_string("train_dir", None, "Where the fp32 ActorQ training runs go (default: <workdir>/runs).")
flags.DEFINE_list("tasks", ["dqn@gym:CartPole-v1@20000", "d4pg@dmc:cartpole-balance@8000"],
                  "agent@env@learner_steps per task.")
flags.DEFINE_list("seeds", ["0", "1", "2"], "Training seeds (one fp32 learner each).")
flags.DEFINE_list("schemes", list(weights.ACTOR_INT8_SCHEMES), "int8 actor schemes to compare.")
flags.DEFINE_integer("episodes", 20, "Evaluation episodes per candidate (the same episodes for every candidate).")
flags.DEFINE_integer("num_actors", 2, "Actors of the training runs (and exploration levels of calibration data).")
flags.DEFINE_integer("calibration_steps", 512, "Exploring fp32 steps per actor whose observations calibrate ranges.")
flags.DEFINE_string("comm_precision", "int8", "Precision the evaluated blobs travel at (the actors' own by default).")


def parse_task(text: str) -> tuple[str, str, int]:
    """`"dqn@gym:CartPole-v1@20000"` -> `("dqn", "gym:CartPole-v1", 20000)`."""
    parts = text.strip().split("@")
    if len(parts) != 3 or not parts[2].isdigit() or int(parts[2]) < 1:
        raise QrlInputError(f"--tasks entries are agent@env@learner_steps, got {text!r}")
    return check_agent(parts[0]), parts[1], int(parts[2])


def train(agent_name: str, env_id: str, steps: int, seed: int, directory: str) -> tuple:
    """`(agent, observation spec, final fp32 policy params)` of an fp32-actor ActorQ run of
    `steps` learner steps (reused when `directory` holds its checkpoint)."""
    factory = AgentFactory(agent_name, env_id, {})
    env = envs.make(env_id, 0)
    agent = factory(env.observation_spec(), env.action_spec())
    checkpoints = os.path.join(directory, CHECKPOINT_DIR)
    if not (os.path.isdir(checkpoints) and Checkpointer(checkpoints).latest_step()):
        config = ActorQConfig(agent=agent_name, env=env_id, seed=seed, num_actors=FLAGS.num_actors,
                              actor_precision="fp32", max_learner_steps=steps, eval_every_seconds=3600.0,
                              eval_episodes=1, checkpoint_every=0)
        run_actorq(config, directory, overwrite=True, printer=lambda line: None)
    step = Checkpointer(checkpoints).latest_step()
    # Only the policy's leaves are needed: read the state untemplated (its optimizer state's layout
    # is the learner's business) and pick the policy params by field name.
    state = ocp.StandardCheckpointer().restore(os.path.join(checkpoints, str(step), "state"))
    params = agent.policy_params(types.SimpleNamespace(**state))
    return agent, env.observation_spec(), jax.tree.map(np.asarray, params)


def measure_cell(agent_name: str, env_id: str, steps: int, seed: int, train_dir: str, schemes: list[str]) -> dict:
    agent, observation_spec, params = train(agent_name, env_id, steps, seed,
                                            os.path.join(train_dir, f"{agent_name}-{env_id.replace(':', '_')}", f"seed{seed}"))
    observations = scheme_study.exploring_observations(agent, params, env_id, FLAGS.num_actors,
                                                       FLAGS.calibration_steps, seed)
    ranges = scheme_study.calibration_ranges(agent, params, observations, seed)
    spec = weights.policy_weight_spec(agent, observation_spec)
    return scheme_study.paired_scheme_returns(agent, spec, params, ranges, env_id, schemes, FLAGS.episodes,
                                              EVAL_SEED_OFFSET + seed, FLAGS.comm_precision)


def write_report(results: dict, tasks: list, seeds: list[int], schemes: list[str], workdir: str) -> None:
    """Summaries per task (once every seed is in) and report.md; results.json written atomically."""
    lines = ["# int8 actor schemes: actors' own return, paired with fp32", ""]
    relative = {scheme: [] for scheme in schemes}
    results["summary"] = {}
    for agent_name, env_id, steps in tasks:
        task = f"{agent_name}@{env_id}@{steps}"
        cells = [results["cells"].get(f"{task}/seed{seed}") for seed in seeds]
        if any(cell is None for cell in cells):
            continue
        summary = scheme_study.summarize(cells, schemes)
        summary["closest_to_fp32"] = scheme_study.closest_to_fp32(summary, schemes)
        results["summary"][task] = summary
        agreement = "greedy-action agreement" if agent_name == "dqn" else "action distance (L2)"
        lines += [f"## {agent_name} on {env_id}, {steps} learner steps, seeds {','.join(map(str, seeds))}, "
                  f"{FLAGS.episodes} paired episodes each", "",
                  scheme_study.markdown_table(summary, schemes, agreement), "",
                  f"Closest to fp32: `{summary['closest_to_fp32']}`.", ""]
        scale = max(abs(summary["fp32"]["return"]["mean"]), 1e-9)
        for scheme in schemes:
            relative[scheme].append(summary[scheme]["diff"]["mean"] / scale)
    if results["summary"] and all(len(values) == len(results["summary"]) for values in relative.values()):
        mean_relative = {scheme: float(np.mean(values)) for scheme, values in relative.items()}
        results["mean_relative_diff"] = mean_relative
        best = max(schemes, key=lambda scheme: (mean_relative[scheme], -schemes.index(scheme)))
        results["closest_to_fp32"] = best
        lines += ["Mean paired difference relative to fp32's return, over tasks: "
                  + ", ".join(f"`{scheme}` {value:+.3f}" for scheme, value in mean_relative.items())
                  + f". Closest: `{best}`.", ""]
    io.atomic_write_json(os.path.join(workdir, RESULTS_FILE), results)
    io.atomic_write_text(os.path.join(workdir, REPORT_FILE), "\n".join(lines))


def run() -> None:
    workdir = common.require_workdir(FLAGS.workdir)
    tasks = [parse_task(text) for text in FLAGS.tasks]
    seeds = [int(seed) for seed in FLAGS.seeds]
    schemes = [weights.check_int8_scheme(scheme) for scheme in FLAGS.schemes]
    weights.check_precision(FLAGS.comm_precision, weights.COMM_PRECISIONS, "comm precision")
    common.check_flag_ranges({"episodes": common.AT_LEAST_1, "num_actors": common.AT_LEAST_1,
                              "calibration_steps": common.AT_LEAST_1})
    train_dir = FLAGS.train_dir or os.path.join(workdir, "runs")
    os.makedirs(workdir, exist_ok=True)
    path = os.path.join(workdir, RESULTS_FILE)
    results = io.read_json(path) if os.path.exists(path) else {}
    settings = {"tasks": FLAGS.tasks, "schemes": schemes, "episodes": FLAGS.episodes, "num_actors": FLAGS.num_actors,
                "calibration_steps": FLAGS.calibration_steps, "comm_precision": FLAGS.comm_precision}
    if results.get("settings", settings) != settings:
        raise QrlInputError(f"{path} holds results of other settings; use another --workdir")
    results.update(settings=settings, cells=results.get("cells", {}))
    for agent_name, env_id, steps in tasks:
        for seed in seeds:
            key = f"{agent_name}@{env_id}@{steps}/seed{seed}"
            if key not in results["cells"]:
                results["cells"][key] = measure_cell(agent_name, env_id, steps, seed, train_dir, schemes)
                cell = results["cells"][key]
                print(f"{key}: fp32 {cell['fp32']['return_mean']:.1f}; "
                      + ", ".join(f"{scheme} {cell[scheme]['return_mean']:.1f}" for scheme in schemes), flush=True)
            write_report(results, tasks, seeds, schemes, workdir)
    print(open(os.path.join(workdir, REPORT_FILE)).read())


if __name__ == "__main__":
    common.run_entry_point(run)
