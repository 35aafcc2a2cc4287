"""Atari 2600 games (ale-py through gymnasium) with the standard DQN preprocessing, as `dm_env`.

Preprocessing (Mnih et al. 2015; Machado et al. 2018 for sticky actions): up to 30 no-op
starts, frame skip 4 with a max over the last two frames, 84x84 grayscale (gymnasium's
`AtariPreprocessing`), and a stack of the last 4 frames -> uint8 `[84, 84, 4]`. Rewards are
raw game scores: clipping belongs to the agent.
"""

from typing import Optional

import ale_py
import dm_env
import gymnasium
import numpy as np
from dm_env import specs
from gymnasium.wrappers import AtariPreprocessing

from qrl.envs.base import AdapterEnvironment
from qrl.envs.ids import check_options, one_line, unknown_id_error
from qrl.errors import QrlInputError

gymnasium.register_envs(ale_py)

FRAME_SIZE = 84
STACK_SIZE = 4
FRAME_SKIP = 4
STICKY_ACTION_PROBABILITY = 0.25
OPTIONS = ("sticky_actions", "episodic_life", "full_action_space", "noop_max")

_FIRST = dm_env.StepType.FIRST
_MID = dm_env.StepType.MID
_LAST = dm_env.StepType.LAST
_TimeStep = dm_env.TimeStep


class AtariEnvironment(AdapterEnvironment):
    """A preprocessed ALE game: uint8 `[84, 84, 4]` observations, discrete actions.

    With `episodic_life`, losing a life ends the `dm_env` episode with discount 0, but the
    next `reset()` continues the same game with one no-op step (as baselines' EpisodicLifeEnv
    does); the game itself resets only at game over or at ALE's frame limit (truncation,
    discount 1). The first reset seeds the game with `seed`; later ones continue its RNG.
    """

    def __init__(self, env: gymnasium.Env, seed: int, episodic_life: bool):
        self._env = env
        self._ale = env.unwrapped.ale
        self._episodic_life = episodic_life
        self._next_seed: Optional[int] = seed
        self._lives = 0
        self._game_over = True
        self._needs_reset = True
        self._stack = np.zeros((FRAME_SIZE, FRAME_SIZE, STACK_SIZE), np.uint8)
        self._observation_spec = specs.BoundedArray(
            self._stack.shape, np.uint8, minimum=0, maximum=255, name="observation"
        )
        self._action_spec = specs.DiscreteArray(int(env.action_space.n), dtype=np.int32, name="action")

    @property
    def gym_env(self) -> gymnasium.Env:
        """The preprocessed gymnasium environment (frames `[84, 84]`, before stacking)."""
        return self._env

    @property
    def lives(self) -> int:
        """Lives left in the current game."""
        return self._lives

    def _start_stack(self, frame: np.ndarray) -> np.ndarray:
        self._stack = np.repeat(frame[:, :, None], STACK_SIZE, axis=2)
        return self._stack

    def _push_frame(self, frame: np.ndarray) -> np.ndarray:
        stack = np.empty_like(self._stack)
        stack[:, :, :-1] = self._stack[:, :, 1:]
        stack[:, :, -1] = frame
        self._stack = stack
        return stack

    def _reset_game(self) -> np.ndarray:
        frame, _ = self._env.reset(seed=self._next_seed)
        self._next_seed = None
        return frame

    def reset(self) -> dm_env.TimeStep:
        if self._episodic_life and not self._game_over:
            frame, _, terminated, truncated, _ = self._env.step(0)
            if terminated or truncated:
                frame = self._reset_game()
        else:
            frame = self._reset_game()
        self._lives = self._ale.lives()
        self._game_over = False
        self._needs_reset = False
        return _TimeStep(_FIRST, None, None, self._start_stack(frame))

    def step(self, action) -> dm_env.TimeStep:
        if self._needs_reset:
            return self.reset()
        frame, reward, terminated, truncated, _ = self._env.step(action)
        obs = self._push_frame(frame)
        lives = self._ale.lives()
        lost_life = lives < self._lives
        self._lives = lives
        if terminated or truncated:
            self._game_over = True
            self._needs_reset = True
            return _TimeStep(_LAST, float(reward), 0.0 if terminated else 1.0, obs)
        if lost_life and self._episodic_life:
            self._needs_reset = True
            return _TimeStep(_LAST, float(reward), 0.0, obs)
        return _TimeStep(_MID, float(reward), 1.0, obs)


def known_names() -> list[str]:
    """Game names as `atari:` takes them (`Pong`, `Breakout`, ...)."""
    return [name[4:-3] for name in gymnasium.registry if name.startswith("ALE/") and name.endswith("-v5")]


def _resolve_game(name: str) -> str:
    """Exact game name for `name` (case-insensitive); unknown games are input errors."""
    games = known_names()
    if name in games:
        return name
    by_lower = {game.lower(): game for game in games}
    if name.lower() in by_lower:
        return by_lower[name.lower()]
    raise unknown_id_error("atari", name, games)


def make(
    name: str,
    seed: int,
    *,
    sticky_actions: bool = False,
    episodic_life: bool = False,
    full_action_space: bool = False,
    noop_max: int = 30,
    **unknown_options,
) -> AtariEnvironment:
    """`atari:<Game>`: `ALE/<Game>-v5` with DQN preprocessing (see the module docstring)."""
    check_options(f"atari:{name}", unknown_options, OPTIONS)
    game = _resolve_game(name)
    if isinstance(noop_max, bool) or not isinstance(noop_max, (int, np.integer)) or noop_max < 0:
        raise QrlInputError(f"noop_max must be a non-negative integer, got {noop_max!r}")
    try:
        env = gymnasium.make(
            f"ALE/{game}-v5",
            frameskip=1,
            repeat_action_probability=STICKY_ACTION_PROBABILITY if sticky_actions else 0.0,
            full_action_space=bool(full_action_space),
            obs_type="grayscale",
        )
    except gymnasium.error.Error as error:
        raise QrlInputError(f"cannot create atari:{game}: {one_line(error)}") from error
    env = AtariPreprocessing(
        env,
        noop_max=int(noop_max),
        frame_skip=FRAME_SKIP,
        screen_size=FRAME_SIZE,
        terminal_on_life_loss=False,
        grayscale_obs=True,
    )
    return AtariEnvironment(env, seed, bool(episodic_life))
