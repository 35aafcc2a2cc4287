"""ActorQ presets (`--preset=quarl`): how a preset merges with what the user set, the linear
exploration spread, and QuaRL's networks (actor, LayerNorm critic, Q-network) computed by hand."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agents import d4pg, dqn
from agents.actorq import AgentFactory, actorq_preset, with_preset
from agents.d4pg import learning as d4pg_learning
from agents.dqn import learning as dqn_learning
from qrl.distributed.agent import exploration_schedule
from qrl.distributed.run import ActorQConfig, ActorQPreset, apply_preset
from qrl.errors import QrlInputError
from qrl.quant import parse_precision, quantize_params

BOUNDS = (np.array([-1.0, -1.0], np.float32), np.array([1.0, 1.0], np.float32))


def test_linear_exploration_spread_is_quarls_sigma_schedule():
    # QuaRL's get_actor_sigma: np.arange(0, max, max / N)[i] for actor i (N = 4, max = 1).
    assert exploration_schedule(4, 0.0, 0.75, "linear") == pytest.approx(list(np.arange(0, 1, 1 / 4)))
    assert exploration_schedule(1, 0.0, 0.75, "linear") == [0.0]
    # Ape-X's log spread is unchanged: 0.4^(1 + 7 i / (N - 1)).
    assert exploration_schedule(3, 0.4, 0.4**8) == pytest.approx([0.4, 0.4**4.5, 0.4**8])


def test_a_preset_fills_only_what_the_caller_left_unset():
    preset = ActorQPreset("p", run=dict(num_actors=4, max_times_sampled=16, rate_limiter="min_size"),
                          agent=dict(batch_size=256, n_step=5))
    config = ActorQConfig(agent="dqn", num_actors=2, overrides={"batch_size": 32})
    merged = apply_preset(config, preset, explicit=("num_actors",))
    assert merged.preset == "p" and merged.num_actors == 2  # given explicitly: kept
    assert merged.max_times_sampled == 16 and merged.rate_limiter == "min_size"  # left unset: the preset's
    assert dict(merged.overrides) == {"batch_size": 32, "n_step": 5}  # the caller's override wins
    assert apply_preset(config, preset).num_actors == 4  # nothing explicit: the preset's value
    with pytest.raises(ValueError, match="unknown ActorQ fields: num_learners"):
        apply_preset(config, ActorQPreset("bad", run=dict(num_learners=2), agent={}))


@pytest.mark.parametrize("agent, sizes_field", [("d4pg", "actor_hidden_sizes"), ("dqn", "hidden_sizes")])
def test_quarl_presets_carry_quarls_run_script_values(agent, sizes_field):
    """The values of QuaRL's run_multiprocess.sh (2048^3 policy, 4 actors, batch 256, items drawn
    16 times) and its MinSize-only replay, resolved into the agent's config."""
    config = with_preset(ActorQConfig(agent=agent, env="dmc:cartpole-balance" if agent == "d4pg" else "gym:CartPole-v1"),
                         "quarl")
    assert (config.num_actors, config.max_times_sampled, config.rate_limiter) == (4, 16, "min_size")
    assert config.exploration_spacing == "linear" and config.exploration_first == 0.0
    assert config.actor_update_period == (30 if agent == "d4pg" else 100)
    assert (config.min_replay_size, config.replay_capacity, config.prioritized) == (
        (2_000, 100_000, False) if agent == "d4pg" else (100_000, 200_000, True))
    agent_config = AgentFactory(agent, config.env, dict(config.overrides)).config()
    assert getattr(agent_config, sizes_field) == (2048, 2048, 2048) and agent_config.architecture == "quarl"
    assert (agent_config.batch_size, agent_config.n_step, agent_config.target_update_period) == (256, 5, 100)
    with pytest.raises(QrlInputError, match="has no ActorQ preset 'acme'"):
        actorq_preset(agent, "acme")


def test_quarl_d4pg_actor_is_tanh_torso_linear_last_layer_near_zero_head():
    config = d4pg.config_for("dmc:cartpole-balance", {"architecture": "quarl", "actor_hidden_sizes": (16, 16, 8)})
    actor = d4pg_learning.make_actor(config, BOUNDS)
    observations = jax.random.normal(jax.random.PRNGKey(0), (5, 3))
    params = actor.init(jax.random.PRNGKey(1), observations)["params"]
    x = jnp.tanh(observations @ params["torso"]["dense_0"]["kernel"] + params["torso"]["dense_0"]["bias"])
    x = jnp.tanh(x @ params["torso"]["dense_1"]["kernel"] + params["torso"]["dense_1"]["bias"])
    x = x @ params["torso"]["dense_2"]["kernel"] + params["torso"]["dense_2"]["bias"]  # linear
    expected = jnp.tanh(x @ params["head"]["kernel"] + params["head"]["bias"])  # bounds [-1, 1]
    actions = actor.apply({"params": params}, observations)
    np.testing.assert_allclose(actions, expected, rtol=1e-5, atol=1e-7)
    # NearZeroInitializedLinear: a normal of variance 1e-4 / fan_in truncated at two of its standard
    # deviations (TF's VarianceScaling: stddev sqrt(1e-4 / fan_in) / 0.8796), so a fresh policy acts ~0.
    assert np.abs(np.asarray(params["head"]["kernel"])).max() <= 2 * np.sqrt(1e-4 / 8) / 0.87962566103423978
    assert np.abs(np.asarray(actions)).max() < 0.01


def test_quarl_d4pg_critic_is_acmes_layer_norm_mlp():
    config = d4pg.config_for("dmc:cartpole-balance", {"architecture": "quarl", "critic_hidden_sizes": (16, 16, 8),
                                                      "num_atoms": 11})
    critic = d4pg_learning.make_critic(config, BOUNDS)
    observations = jax.random.normal(jax.random.PRNGKey(0), (5, 3))
    actions = jax.random.uniform(jax.random.PRNGKey(2), (5, 2), minval=-1, maxval=1)
    params = critic.init(jax.random.PRNGKey(1), observations, actions)["params"]
    torso = params["torso"]
    x = jnp.concatenate([observations, actions], axis=-1) @ torso["dense_0"]["kernel"] + torso["dense_0"]["bias"]
    x = (x - x.mean(-1, keepdims=True)) / jnp.sqrt(x.var(-1, keepdims=True) + 1e-6)
    x = jnp.tanh(x * torso["layer_norm_0"]["scale"] + torso["layer_norm_0"]["bias"])
    x = nn.elu(x @ torso["dense_1"]["kernel"] + torso["dense_1"]["bias"])
    x = nn.elu(x @ torso["dense_2"]["kernel"] + torso["dense_2"]["bias"])
    expected = x @ params["head"]["kernel"] + params["head"]["bias"]
    logits = critic.apply({"params": params}, observations, actions)
    assert logits.shape == (5, 11)
    np.testing.assert_allclose(logits, expected, rtol=1e-4, atol=1e-5)


def test_quarl_dqn_network_and_its_dynamic_int8_actor():
    config = dqn.config_for("gym:CartPole-v1", {"architecture": "quarl", "hidden_sizes": (64, 64, 32)})
    network = dqn_learning.make_network(config, (4,), 2)
    observations = jax.random.normal(jax.random.PRNGKey(0), (64, 4))
    params = network.init(jax.random.PRNGKey(1), observations)["params"]
    torso = params["torso"]
    x = jnp.tanh(observations @ torso["dense_0"]["kernel"] + torso["dense_0"]["bias"])
    x = jnp.tanh(x @ torso["dense_1"]["kernel"] + torso["dense_1"]["bias"])
    x = x @ torso["dense_2"]["kernel"] + torso["dense_2"]["bias"]
    expected = x @ params["head"]["kernel"] + params["head"]["bias"]
    q_values = network.apply({"params": params}, observations)
    np.testing.assert_allclose(q_values, expected, rtol=1e-5, atol=1e-7)
    # QuaRL's actors run dynamic-range int8 (quarl_dyn8): the same greedy actions nearly everywhere.
    trained = jax.tree.map(lambda leaf: leaf * 1000.0 if leaf.ndim == 2 and leaf.shape[-1] == 2 else leaf, params)
    int8 = parse_precision("quarl_dyn8")
    int8_q = dqn_learning.make_network(config, (4,), 2, int8).apply({"params": quantize_params(trained, int8)},
                                                                      observations)
    fp32_q = network.apply({"params": trained}, observations)
    assert np.mean(np.argmax(int8_q, -1) == np.argmax(fp32_q, -1)) >= 0.95
    with pytest.raises(QrlInputError, match="takes neither dueling nor layer_norm"):
        dqn.config_for("gym:CartPole-v1", {"architecture": "quarl", "dueling": True})
    with pytest.raises(QrlInputError, match="architecture must be one of default, quarl"):
        d4pg.config_for("dmc:cartpole-balance", {"architecture": "acme"})


def test_min_size_limiter_refuses_the_ratio_limiters_settings():
    from qrl.distributed.run import validate

    base = dict(agent="dqn", env="gym:CartPole-v1", max_seconds=5.0, rate_limiter="min_size")
    validate(ActorQConfig(**base))
    with pytest.raises(QrlInputError, match="has no ratio to tolerate"):
        validate(ActorQConfig(**base, samples_per_insert_tolerance=0.5))
    with pytest.raises(QrlInputError, match="--rate_limiter=min_size has none"):
        validate(ActorQConfig(**base, samples_per_insert=4.0))
    with pytest.raises(QrlInputError, match="--exploration_spacing=log needs nonzero"):
        validate(ActorQConfig(agent="dqn", env="gym:CartPole-v1", max_seconds=5.0, exploration_last=0.0))
    validate(with_preset(ActorQConfig(agent="dqn", env="gym:CartPole-v1", max_seconds=5.0), "quarl"))


def test_study_cells_apply_the_preset_as_launch_actorq_does(tmp_path):
    from launch import actorq_study

    options = actorq_study.make_options(str(tmp_path / "study"), "d4pg", "dmc:cartpole-balance", "fp32,int8", "0,1",
                                        max_seconds=60.0, run_flags=["--preset=quarl", "--num_actors=2",
                                                                     "--set=batch_size=64"])
    configs = [actorq_study.cell_config(cell, options) for cell in actorq_study.plan_cells(options)]
    assert len(configs) == 4 and all(config.preset == "quarl" for config in configs)
    assert {(config.num_actors, config.max_times_sampled, config.actor_update_period) for config in configs} == {
        (2, 16, 30)}  # the cell's --num_actors wins; the rest is QuaRL's
    assert {config.overrides["batch_size"] for config in configs} == {"64"}  # --set wins over the preset's 256
    assert {config.seed for config in configs} == {0, 1}


def test_device_script_dry_run_names_each_task_and_the_gpu_learner(tmp_path):
    import os
    import subprocess

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    completed = subprocess.run(["bash", os.path.join(repo, "bench", "device", "actorq.sh"), "--dry-run",
                                str(tmp_path / "out"), "90", "0,1"], capture_output=True, text=True, timeout=60)
    assert completed.returncode == 0, completed.stderr
    studies = [line for line in completed.stdout.splitlines() if "launch.actorq_study" in line]
    assert [next(part for part in line.split() if part.startswith("--envs=")) for line in studies] == [
        "--envs=dmc:cartpole-balance", "--envs=dmc:walker-stand", "--envs=dmc:cheetah-run"]
    assert all("--run_flag=--learner_device=gpu" in line and "--run_flag=--preset=quarl" in line
               and "--seeds=0,1" in line and "--max_seconds=90" in line for line in studies)
    assert completed.stdout.count("launch.actorq_scale") == 3 and not (tmp_path / "out").exists()


@pytest.mark.parametrize("arguments, fragment", [
    ([], "OUT: give the directory"), (["OUT", "0"], "SECONDS_PER_CELL must be a positive integer"),
    (["OUT", "90", "0;rm"], "SEEDS must be a comma-separated list")])
def test_device_script_bad_input_is_one_line_and_exit_2(tmp_path, arguments, fragment):
    import os
    import subprocess

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    arguments = [str(tmp_path / "out") if argument == "OUT" else argument for argument in arguments]
    completed = subprocess.run(["bash", os.path.join(repo, "bench", "device", "actorq.sh"), *arguments],
                               capture_output=True, text=True, timeout=60)
    lines = completed.stderr.strip().splitlines()
    assert completed.returncode == 2 and len(lines) == 1 and fragment in lines[0], completed.stderr
    assert not (tmp_path / "out").exists()
