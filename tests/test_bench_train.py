"""bench/train_throughput.py: the qrl and sbx sides share hyperparameters; a quick qrl-only run."""

import os
import subprocess
import sys

from bench.train_throughput import (CASES, DQN_REJAX, DQN_REJAX_IN_QRL, PPO_REJAX, PPO_REJAX_IN_QRL, PPO_ZOO_SBX,
                                    summarize)

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_ppo_case_matches_the_zoo_preset_qrl_trains_with():
    from agents.ppo import config_for

    config = config_for("gym:CartPole-v1")
    assert (config.num_envs, config.num_steps, config.batch_size, config.num_epochs) == (
        PPO_ZOO_SBX["n_envs"], PPO_ZOO_SBX["n_steps"], PPO_ZOO_SBX["batch_size"], PPO_ZOO_SBX["n_epochs"])
    assert (config.gamma, config.gae_lambda, config.learning_rate, config.clip_range, config.ent_coef) == (
        PPO_ZOO_SBX["gamma"], PPO_ZOO_SBX["gae_lambda"], PPO_ZOO_SBX["learning_rate"], PPO_ZOO_SBX["clip_range"],
        PPO_ZOO_SBX["ent_coef"])
    assert config.learning_rate_schedule == config.clip_range_schedule == "linear"
    assert set(PPO_ZOO_SBX["linear"]) == {"learning_rate", "clip_range"}
    assert tuple(PPO_ZOO_SBX["net_arch"]) == config.hidden_sizes and config.activation == "tanh"


def test_sac_cases_match_the_presets():
    from agents.sac import config_for

    assert config_for("gym:Pendulum-v1").learning_rate == 1e-3
    case = CASES["sac_pendulum"]
    sbx = next(spec for name, kind, spec in case["candidates"] if kind == "sbx")
    assert sbx["learning_rate"] == 1e-3 and sbx["learning_starts"] == 100


def test_rejax_cases_set_rejax_s_cartpole_configs_in_qrl_s_names():
    """The same run on both sides: updates per environment step, batch, buffer, warm-up, network,
    target averaging, exploration (rejax: `num_epochs` updates per `num_envs` steps, its Polyak
    factor applied once per iteration; qrl: `gradient_steps` per `train_freq`, tau = 1 - polyak
    every `gradient_steps` updates)."""
    from agents.dqn import config_for as dqn_config
    from agents.ppo import config_for as ppo_config

    dqn = dqn_config("gymnax:CartPole-v1", DQN_REJAX_IN_QRL)
    case = CASES["dqn_device"]
    qrl_spec = next(spec for _, kind, spec in case["candidates"] if kind == "qrl")
    assert qrl_spec["num_envs"] == DQN_REJAX["num_envs"] == dqn.train_freq
    assert dqn.gradient_steps == DQN_REJAX["num_epochs"] == dqn.target_update_period
    assert (dqn.batch_size, dqn.buffer_size, dqn.learning_starts, dqn.learning_rate, dqn.max_grad_norm) == (
        DQN_REJAX["batch_size"], DQN_REJAX["buffer_size"], DQN_REJAX["fill_buffer"], DQN_REJAX["learning_rate"],
        DQN_REJAX["max_grad_norm"])
    assert abs(dqn.tau - (1 - DQN_REJAX["polyak"])) < 1e-12 and dqn.dueling and dqn.double_q == DQN_REJAX["ddqn"]
    assert (dqn.exploration_initial_eps, dqn.exploration_final_eps, dqn.exploration_fraction, dqn.gamma) == (
        DQN_REJAX["eps_start"], DQN_REJAX["eps_end"], DQN_REJAX["exploration_fraction"], DQN_REJAX["gamma"])
    assert dqn.hidden_sizes == (64, 64)
    ppo = ppo_config("gymnax:CartPole-v1", PPO_REJAX_IN_QRL)
    assert (ppo.num_envs, ppo.num_steps, ppo.num_epochs) == (
        PPO_REJAX["num_envs"], PPO_REJAX["num_steps"], PPO_REJAX["num_epochs"])
    assert ppo.num_envs * ppo.num_steps // ppo.batch_size == PPO_REJAX["num_minibatches"]
    assert (ppo.learning_rate, ppo.max_grad_norm, ppo.gamma, ppo.gae_lambda, ppo.clip_range, ppo.ent_coef, ppo.vf_coef) == (
        PPO_REJAX["learning_rate"], PPO_REJAX["max_grad_norm"], PPO_REJAX["gamma"], PPO_REJAX["gae_lambda"],
        PPO_REJAX["clip_eps"], PPO_REJAX["ent_coef"], PPO_REJAX["vf_coef"])
    assert ppo.activation == PPO_REJAX["agent_kwargs"]["activation"] and ppo.learning_rate_schedule == "constant"
    assert ppo.clip_range_vf == PPO_REJAX["clip_eps"] and ppo.clip_range_schedule == "constant"  # rejax clips values too


def test_summary_ratios_per_baseline_map_and_target():
    runs = [{"name": "dqn fp32", "steps_per_second": 100.0}, {"name": "dqn qat8", "steps_per_second": 80.0},
            {"name": "ppo fp32", "steps_per_second": 50.0}, {"name": "ppo qat8", "steps_per_second": 45.0}]
    summary = summarize("qat", CASES["qat"], runs)
    assert summary["ratios"] == {"dqn qat8": 0.8, "ppo qat8": 0.9}
    runs = [{"name": "qrl", "steps_per_second": 9000.0}, {"name": "sbx", "steps_per_second": 2000.0}]
    summary = summarize("ppo_cartpole", CASES["ppo_cartpole"], runs)
    assert summary["ratios"] == {"qrl": 4.5} and summary["passed"] is True


def test_quick_run_without_peer():
    completed = subprocess.run(
        [sys.executable, "-m", "bench.train_throughput", "--case=ppo_cartpole,qat,dqn_device", "--quick",
         "--peer-python=/nonexistent/python"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=600,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "sbx: skipped" in completed.stdout
    assert "ppo_cartpole    round 1  qrl" in completed.stdout
    assert "ratios: dqn qat8 / dqn fp32" in completed.stdout
    assert "dqn_device      round 1  qrl device steps/s" in completed.stdout and "rejax" not in completed.stdout
