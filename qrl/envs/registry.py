"""`make(env_id)`: one factory from `family:name` ids to `dm_env` environments.

Family modules are imported on first use, so `import qrl.envs` stays cheap and a user of
gymnasium never pays for importing brax or dm_control.
"""

import importlib

import dm_env

from qrl.envs.ids import check_seed, split_env_id


def make(env_id: str, seed: int = 0, **options) -> dm_env.Environment:
    """Builds the environment named by `env_id`, seeded with `seed`.

    Ids: `gym:<gymnasium id>` (classic control, MuJoCo v5), `atari:<Game>` (ALE with DQN
    preprocessing; options `sticky_actions`, `episodic_life`, `full_action_space`, `noop_max`),
    `dmc:<domain>-<task>` (dm_control suite; options `time_limit`, `environment_kwargs`),
    `brax:<name>` (batched and jitted; options `batch_size`, `episode_length`, `backend`) and
    `gymnax:<name>` (batched and jitted; options `batch_size`, `episode_length`).
    Unknown ids or options raise `QrlInputError` with one line naming what exists.
    """
    family, name = split_env_id(env_id)
    seed = check_seed(seed)
    module = importlib.import_module(f"qrl.envs.{family}")
    return module.make(name, seed, **options)
