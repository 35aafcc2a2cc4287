"""Single-shot pruning of an offline agent: `pruning.prune_networks` and `launch.prune_offline`."""

import json
import os
import subprocess
import sys
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agents import bc
from pruning import PruneSettings, kept_count, kept_fraction, prunable_count, prune_networks
from qrl import offline
from qrl.errors import QrlInputError
from qrl.networks.continuous import bounds as action_bounds
from tests.offline_data import write_swingup_dataset
from tests.test_bc import ENV_ID, swing_up

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL_BC = {"hidden_sizes": "32-32", "batch_size": 64}


def bc_networks(config):
    observation_spec, action_spec = offline.env_specs(ENV_ID)
    state = bc.build(config, observation_spec, action_spec).init(jax.random.PRNGKey(0))
    return bc.learning.networks_at_init(state), action_bounds(action_spec)


def scoring_data(count=2, size=32):
    rng = np.random.default_rng(0)
    angles = rng.uniform(-np.pi, np.pi, size=count * size)
    observations = np.stack([np.cos(angles), np.sin(angles), rng.normal(size=angles.size)], axis=1).astype(np.float32)
    actions = np.asarray(swing_up(observations), np.float32)
    return [jax.tree.map(jnp.asarray, dict(observation=observations[i * size:(i + 1) * size],
                                           action=actions[i * size:(i + 1) * size]))
            for i in range(count)]


class Batch(NamedTuple):
    """The fields BC's scoring loss reads, as in `qrl.replay.Transition`."""

    observation: jax.Array
    action: jax.Array


@pytest.mark.parametrize("pruner", ["snip", "grasp", "magnitude", "random", "synflow"])
def test_every_pruner_keeps_exact_counts_on_bc(pruner):
    config = bc.config_for(SMALL_BC)
    networks, bounds = bc_networks(config)
    batches = [Batch(**batch) for batch in scoring_data()]
    masks = prune_networks(pruner, networks, bc.learning.scoring_losses(config, bounds), batches,
                           PruneSettings(sparsity=0.9, synflow_iterations=10), key=jax.random.PRNGKey(1),
                           synflow_inputs=bc.learning.synflow_inputs(config, bounds, 3))
    mask = masks["actor"]
    assert kept_count(mask) == round(0.1 * prunable_count(mask))
    leaves = jax.tree_util.tree_flatten_with_path(mask, is_leaf=lambda node: node is None)[0]
    assert all((leaf is None) == ("bias" in jax.tree_util.keystr(path)) for path, leaf in leaves)


def test_snip_and_grasp_select_differently_and_none_prunes_nothing():
    config = bc.config_for(SMALL_BC)
    networks, bounds = bc_networks(config)
    batches = [Batch(**batch) for batch in scoring_data()]
    losses = bc.learning.scoring_losses(config, bounds)
    snip = prune_networks("snip", networks, losses, batches, PruneSettings(sparsity=0.9))["actor"]
    grasp = prune_networks("grasp", networks, losses, batches, PruneSettings(sparsity=0.9))["actor"]
    assert any(not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(snip), jax.tree.leaves(grasp)))
    assert prune_networks("none", networks, losses, batches, PruneSettings())["actor"] is None
    excluded = prune_networks("snip", networks, losses, batches, PruneSettings(sparsity=0.9, exclude=("head",)))["actor"]
    assert excluded["head"]["kernel"] is None and kept_fraction(excluded) == pytest.approx(0.1, abs=0.01)


def test_prune_settings_reject_bad_input():
    config = bc.config_for(SMALL_BC)
    networks, bounds = bc_networks(config)
    losses = bc.learning.scoring_losses(config, bounds)
    for pruner, settings, message in [
        ("snip", PruneSettings(sparsity=1.0), "sparsity must be in"),
        ("snap", PruneSettings(), "unknown pruner 'snap'"),
        ("random", PruneSettings(scope="global"), "scope must be network or layer"),
        ("snip", PruneSettings(exclude=("dense_9",)), "matches no layer"),
        ("synflow", PruneSettings(), "missing: actor"),
    ]:
        with pytest.raises(QrlInputError, match=message):
            prune_networks(pruner, networks, losses, [], settings, key=jax.random.PRNGKey(0))


@pytest.fixture(scope="module")
def dataset_file(tmp_path_factory):
    """2,000 noisy swing-up steps on Pendulum in D4RL format, with reference returns."""
    return write_swingup_dataset(tmp_path_factory.mktemp("data") / "pendulum-swingup.hdf5", 2000)


def run_cli(*flags):
    return subprocess.run([sys.executable, "-m", "launch.prune_offline", *flags], cwd=REPO, capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": REPO}, timeout=600)


def test_cli_run_writes_results_masks_and_sparse_policy(dataset_file, tmp_path):
    workdir = tmp_path / "snip"
    common = [f"--dataset={dataset_file}", "--algo=bc", "--steps=200", "--eval_every=0", "--eval_episodes=2",
              "--set=hidden_sizes=64-64", "--set=batch_size=64"]
    result = run_cli(*common, "--pruner=snip", "--sparsity=0.9", f"--workdir={workdir}")
    assert result.returncode == 0, result.stderr
    results = json.loads((workdir / "results.json").read_text())
    assert results["config"]["env"] == ENV_ID and results["config"]["pruner"] == "snip"
    assert results["masks"]["actor"]["kept_fraction"] == pytest.approx(0.1, abs=0.005)
    assert set(results["masks"]["actor"]["layers"]) == {"torso/dense_0/kernel", "torso/dense_1/kernel", "head/kernel"}
    assert results["normalized_score"] is not None and np.isfinite(results["normalized_score"]["mean"])
    rows = {(row["format"], row["precision"]): row for row in results["policy_memory"]}
    assert rows[("csr", "int8")]["bytes"] < rows[("csr", "fp32")]["bytes"] < rows[("dense", "fp32")]["bytes"]
    for name in ("config.json", "masks.msgpack", "metrics.csv", "policy_csr_fp32.msgpack", "policy_csr_int8.msgpack"):
        assert (workdir / name).is_file(), name
    assert os.path.getsize(workdir / "policy_csr_int8.msgpack") < 0.2 * rows[("dense", "fp32")]["bytes"]

    # The same masks again, from the first run: identical kept weights.
    reused = run_cli(*common, f"--masks_from={workdir}", f"--workdir={tmp_path / 'reused'}")
    assert reused.returncode == 0, reused.stderr
    again = json.loads((tmp_path / "reused" / "results.json").read_text())
    assert again["masks"] == results["masks"]

    bad_inputs = [
        (["--pruner=snip", "--sparsity=1.0"], "sparsity must be in [0, 1)"),
        (["--pruner=snap"], "unknown pruner 'snap'"),
        (["--pruner=snip", "--env=gym:HalfCheetah-v5"], "dataset observations have 3 dims, gym:HalfCheetah-v5 has 17"),
        (["--set=hidden_sizes=32-32", f"--masks_from={workdir}"], "does not match"),
        (["--algo=cql"], "unknown offline algorithm 'cql'"),
        (["--pruner=snip", "--separate=actor/decoder"], "separate path 'actor/decoder' names no sub-network of actor"),
        (["--pruner=random", "--separate=actor/head"], "separate thresholds apply to snip, grasp and magnitude"),
        (["--pruner=snip", f"--dataset={tmp_path / 'missing.hdf5'}"], "no such dataset"),
    ]
    for flags, message in bad_inputs:
        result = run_cli(*common, *flags, f"--workdir={tmp_path / 'bad'}")
        assert result.returncode == 2, (flags, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1 and message in result.stderr, result.stderr
    assert not (tmp_path / "bad").exists()


@pytest.mark.parametrize("algo, networks", [("td3_bc", {"actor", "critic"}), ("iql", {"actor", "critic", "value"})])
def test_every_network_of_multi_network_agents_is_pruned_and_trained(dataset_file, tmp_path, algo, networks):
    from launch.prune_runs import PruneRun, run_prune_offline

    run = PruneRun(dataset=dataset_file, algo=algo, pruner="snip", settings=PruneSettings(sparsity=0.9),
                   overrides={"hidden_sizes": "32-32", "batch_size": 32}, steps=40, eval_every=0, eval_episodes=1)
    results = run_prune_offline(run, str(tmp_path / algo), progress=False, printer=lambda line: None)
    assert set(results["masks"]) == networks
    for name in networks:
        assert results["masks"][name]["kept_fraction"] == pytest.approx(0.1, abs=0.01), name
    assert results["updates"] == 40 and np.isfinite(results["final_eval"]["mean"])
    assert results["policy_networks"] == ["actor"]


@pytest.mark.parametrize("algo, overrides", [
    ("td3_bc", {"hidden_sizes": "32-32", "batch_size": 32}),
    ("iql", {"hidden_sizes": "32-32", "batch_size": 32}),
    ("bcq", {"vae_hidden_sizes": "32-32", "actor_hidden_sizes": "16-16", "critic_hidden_sizes": "16-16",
             "batch_size": 32, "acting_samples": 4}),
])
def test_synflow_prunes_every_network_of_multi_network_agents(dataset_file, tmp_path, algo, overrides):
    from agents import get_offline_agent
    from launch.prune_runs import PruneRun, run_prune_offline

    run = PruneRun(dataset=dataset_file, algo=algo, pruner="synflow", settings=PruneSettings(sparsity=0.9),
                   overrides=overrides, steps=20, eval_every=0, eval_episodes=1)
    results = run_prune_offline(run, str(tmp_path / algo), progress=False, printer=lambda line: None)
    networks = get_offline_agent(algo).learning.NETWORKS
    assert set(results["masks"]) == set(networks)
    for name in networks:
        assert results["masks"][name]["kept_fraction"] == pytest.approx(0.1, abs=0.005), name
        assert min(results["masks"][name]["layers"].values()) > 0, name
    assert results["updates"] == 20 and np.isfinite(results["final_eval"]["mean"])

def test_bcq_prunes_every_network_and_accounts_the_networks_it_acts_with(dataset_file, tmp_path):
    from launch.prune_runs import PruneRun, run_prune_offline

    run = PruneRun(dataset=dataset_file, algo="bcq", pruner="snip", settings=PruneSettings(sparsity=0.9),
                   overrides={"vae_hidden_sizes": "32-32", "actor_hidden_sizes": "16-16",
                              "critic_hidden_sizes": "16-16", "batch_size": 32, "acting_samples": 4},
                   steps=20, eval_every=0, eval_episodes=1)
    results = run_prune_offline(run, str(tmp_path / "bcq"), progress=False, printer=lambda line: None)
    assert set(results["masks"]) == {"vae", "actor", "critic"}
    for name in ("vae", "actor", "critic"):
        assert results["masks"][name]["kept_fraction"] == pytest.approx(0.1, abs=0.01), name
    assert results["policy_networks"] == ["vae/decoder", "actor", "critic"]
    # Acting runs the decoder (obs 3 + latent 2 -> 32 -> 32 -> action 1), the actor (obs 3 + action 1
    # -> 16 -> 16 -> 1) and both stacked critics (obs 3 + action 1 -> 16 -> 16 -> 1): the encoder is not deployed.
    decoder = (5 * 32 + 32) + (32 * 32 + 32) + (32 * 1 + 1)
    actor = (4 * 16 + 16) + (16 * 16 + 16) + (16 * 1 + 1)
    critics = 2 * actor
    dense = results["policy_memory"][0]
    assert dense["format"] == "dense" and dense["bytes"] == 4 * (decoder + actor + critics)
    assert results["updates"] == 20 and np.isfinite(results["final_eval"]["mean"])


def test_bcq_vae_parts_thresholded_separately_keep_each_its_share(dataset_file, tmp_path):
    """One threshold over BCQ's VAE may empty a part (see agents/bcq/README.md); with
    `separate=("vae/encoder", "vae/decoder")` the encoder and the decoder each keep 10%."""
    from launch.prune_runs import PruneRun, read_masks, run_prune_offline

    settings = PruneSettings(sparsity=0.9, separate=("vae/encoder", "vae/decoder"))
    run = PruneRun(dataset=dataset_file, algo="bcq", pruner="snip", settings=settings,
                   overrides={"vae_hidden_sizes": "32-32", "actor_hidden_sizes": "16-16",
                              "critic_hidden_sizes": "16-16", "batch_size": 32, "acting_samples": 4},
                   steps=10, eval_every=0, eval_episodes=1)
    workdir = str(tmp_path / "bcq_separate")
    results = run_prune_offline(run, workdir, progress=False, printer=lambda line: None)
    vae = read_masks(workdir)["vae"]
    for part in ("encoder", "decoder"):
        kept, total = kept_count(vae[part]), sum(np.size(leaf) for leaf in jax.tree.leaves(vae[part]))
        assert kept == round(0.1 * total), part
    assert results["masks"]["vae"]["kept_fraction"] == pytest.approx(0.1, abs=0.01)
    assert json.loads(open(os.path.join(workdir, "config.json")).read())["settings"]["separate"] == [
        "vae/encoder", "vae/decoder"]


BCQ_SMALL = {"vae_hidden_sizes": "32-32", "actor_hidden_sizes": "16-16", "critic_hidden_sizes": "16-16",
             "batch_size": 32, "acting_samples": 4}


@pytest.mark.parametrize("vae, pruned", [(None, "separate"), ("joint", "joint"), ("dense", "dense")])
def test_bcq_vae_modes(dataset_file, tmp_path, vae, pruned):
    """By default the encoder and the decoder each keep the sparsity's share (their own
    thresholds); `joint` thresholds the VAE once; `dense` leaves it unpruned; each run records
    which it used."""
    from launch.prune_runs import PruneRun, read_masks, run_prune_offline

    run = PruneRun(dataset=dataset_file, algo="bcq", pruner="grasp", settings=PruneSettings(sparsity=0.9),
                   overrides=BCQ_SMALL, vae=vae, steps=2, eval_every=0, eval_episodes=1)
    workdir = str(tmp_path / f"bcq_{pruned}")
    results = run_prune_offline(run, workdir, progress=False, printer=lambda line: None)
    config = json.loads(open(os.path.join(workdir, "config.json")).read())
    assert config["vae_mode"] == pruned
    stored = read_masks(workdir)
    for name in ("actor", "critic"):
        assert results["masks"][name]["kept_fraction"] == pytest.approx(0.1, abs=0.01)
    if pruned == "dense":
        assert results["masks"]["vae"] is None and "vae" not in stored
        return
    shares = {}
    for part in ("encoder", "decoder"):
        kept, total = kept_count(stored["vae"][part]), sum(np.size(leaf) for leaf in jax.tree.leaves(stored["vae"][part]))
        shares[part] = kept / total
    assert config["pruned_with"]["separate"] == (["vae/encoder", "vae/decoder"] if pruned == "separate" else [])
    if pruned == "separate":
        assert shares == pytest.approx({"encoder": 0.1, "decoder": 0.1}, abs=0.002)


def test_scoring_batches_see_observations_as_the_agent_trains_on_them(dataset_file):
    """An agent training on normalized observations (BCQ with normalize_observations) is scored
    on normalized ones: the VAE's scores then weigh encoder and decoder as training will."""
    from launch.prune_runs import scoring_batches
    from qrl.datasets import d4rl, files, from_qlearning, normalize_observations

    dataset = from_qlearning(d4rl.qlearning_arrays(files.read_steps(dataset_file)))
    raw = scoring_batches(dataset, 2, 16, seed=3, normalize=False)
    normalized = scoring_batches(dataset, 2, 16, seed=3, normalize=True)
    for plain, seen in zip(raw, normalized):
        np.testing.assert_allclose(seen.observation, normalize_observations(dataset, plain.observation), rtol=1e-6)
        np.testing.assert_allclose(seen.next_observation, normalize_observations(dataset, plain.next_observation),
                                   rtol=1e-6)
        np.testing.assert_array_equal(seen.action, plain.action)
    assert not np.allclose(raw[0].observation, normalized[0].observation)


def test_bcq_scoring_uses_the_configs_normalization(dataset_file, monkeypatch):
    """`run_prune_offline` hands the scorer normalized batches exactly when BCQ trains on them."""
    from launch import prune_runs

    seen = {}

    def record(dataset, count, batch_size, seed, normalize):
        seen["normalize"] = normalize
        raise RuntimeError("stop after scoring batches")

    monkeypatch.setattr(prune_runs, "scoring_batches", record)
    for normalize in (False, True):
        run = prune_runs.PruneRun(dataset=dataset_file, algo="bcq", pruner="snip",
                                  overrides={**BCQ_SMALL, "normalize_observations": normalize}, steps=1)
        with pytest.raises(RuntimeError, match="stop after scoring"):
            prune_runs.run_prune_offline(run, "/nonexistent/never_written", progress=False)
        assert seen["normalize"] is normalize
