"""Every task the ActorQ study names runs end to end (in-process, a few learner steps each):
D4PG on five DM Control tasks, DQN on three gymnasium classic-control tasks, with int8 actors."""

import pytest

from agents.actorq import run_actorq
from qrl.distributed.run import ActorQConfig

D4PG_TASKS = ("dmc:cartpole-balance", "dmc:walker-stand", "dmc:reacher-hard", "dmc:cheetah-run", "dmc:finger-spin")
DQN_TASKS = ("gym:CartPole-v1", "gym:MountainCar-v0", "gym:Acrobot-v1")
SMALL = {
    "d4pg": {"actor_hidden_sizes": "32-32", "critic_hidden_sizes": "32-32", "batch_size": 16, "learning_starts": 32},
    "dqn": {"hidden_sizes": "32-32", "batch_size": 16, "learning_starts": 32, "train_freq": 4, "gradient_steps": 1},
}


@pytest.mark.parametrize("agent, env_id", [("d4pg", env) for env in D4PG_TASKS] + [("dqn", env) for env in DQN_TASKS])
def test_actorq_runs_the_task(agent, env_id):
    config = ActorQConfig(
        agent=agent, env=env_id, num_actors=2, actor_precision="int8", max_learner_steps=8, min_replay_size=32,
        insert_chunk=8, publish_period=2, actor_update_period=20, eval_episodes=1, eval_every_seconds=60.0,
        max_eval_episode_steps=20, overrides=SMALL[agent],
    )
    results = run_actorq(config, printer=lambda line: None)
    assert results["stop_reason"] == "max_learner_steps"
    assert results["counts"]["learner_steps"] == 8  # the learner stops itself exactly there
    assert results["counts"]["actor_steps"] >= 32  # the replay's minimum size was filled
    assert results["final_return"]["actor"] is not None
    assert results["publish"]["count"] >= 2 and results["breakdown"]["loads"] >= 2


@pytest.mark.parametrize("options, ratio_range", [
    # prioritized replay, compressed fp16 publishes to bf16 actors, synchronous pulls, 4 envs per actor
    (dict(prioritized=True, compress=True, actor_precision="bf16", comm_precision="fp16", sync_pull=True,
          envs_per_actor=4), (0.3, 0.55)),
    # fp32 publishes quantized by each int8 actor itself, at QuaRL's dynamic-range scheme
    (dict(actor_precision="int8", comm_precision="fp32", actor_int8_scheme="quarl_dyn8"), (0.95, 1.05)),
])
def test_actorq_option_combinations_run(options, ratio_range):
    config = ActorQConfig(
        agent="dqn", env="gym:CartPole-v1", num_actors=2, max_learner_steps=8, min_replay_size=32, insert_chunk=8,
        publish_period=2, actor_update_period=20, eval_episodes=1, eval_every_seconds=60.0, max_eval_episode_steps=20,
        overrides=SMALL["dqn"], **options,
    )
    results = run_actorq(config, printer=lambda line: None)
    assert results["counts"]["learner_steps"] == 8 and results["breakdown"]["loads"] >= 2
    assert ratio_range[0] <= results["publish"]["ratio_to_fp32"] <= ratio_range[1]
    assert results["final_return"]["actor"] is not None
