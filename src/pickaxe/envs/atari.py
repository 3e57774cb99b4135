"""The standard Atari wrapper stack (Mnih et al. 2015; Machado et al. 2018's evaluation notes), applied by
``pickaxe.envs.make`` to every ALE id.

Base env: frame skip 1 (the stack skips), sticky actions off (``repeat_action_probability=0``, as in the DQN and
CleanRL/SB3 ``NoFrameskip-v4`` protocol), greyscale screens from the emulator, the minimal action set, and
ALE v5's cap of 108,000 frames (27,000 agent steps) per episode. On top, in this order:

1. ``AtariPreprocessing``: up to 30 no-op actions at reset (count drawn from the env's own RNG), frame skip 4 with
   a max-pool over the last two frames, 84x84 greyscale (gymnasium's wrapper);
2. training only: ``EpisodicLife`` (a lost life ends the episode for the learner; the game itself goes on);
3. ``FireReset`` for games that need FIRE to start (FIRE after every reset; in evaluation also after every lost
   life, since no reset happens there, so a deterministic policy cannot stall the game);
4. training only: ``ClipReward`` to [-1, 1] (gymnasium's wrapper; the sign of the game's integer scores);
5. ``FrameStackObservation(4)``: observations ``[4, 84, 84]`` uint8, oldest frame first.

Evaluation envs play whole games with the raw score, so evaluation returns are the game scores papers report.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import gymnasium as gym
from gymnasium.wrappers import AtariPreprocessing, ClipReward, FrameStackObservation

BASE_KWARGS: dict[str, Any] = {"frameskip": 1, "repeat_action_probability": 0.0, "obs_type": "grayscale"}
"""Keyword arguments of the ALE base env under the stack (each can be overridden with ``--env.kwargs``)."""
NOOP_MAX = 30
FRAME_SKIP = 4
SCREEN_SIZE = 84
FRAME_STACK = 4


def is_atari(env_id: str) -> bool:
    """Whether ``env_id`` is an ALE game (``ALE/Pong-v5``) or registered by ale-py."""
    if env_id.startswith("ALE/"):
        return True
    spec = gym.registry.get(env_id)
    return spec is not None and isinstance(spec.entry_point, str) and spec.entry_point.startswith("ale_py")


def _ale(env: gym.Env) -> Any:
    return env.unwrapped.ale  # type: ignore[attr-defined]


class EpisodicLife(gym.Wrapper):
    """A lost life is ``terminated`` for the learner, but the game continues: the next ``reset`` takes one no-op
    step instead of restarting the game, unless the game really ended (Mnih et al. 2015; training only)."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.lives = 0
        self.real_done = True

    def step(self, action: Any) -> tuple[Any, Any, bool, bool, dict[str, Any]]:
        """Step; ``terminated`` also when a life was lost."""
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.real_done = bool(terminated or truncated)
        lives = _ale(self).lives()
        if 0 < lives < self.lives:
            terminated = True
        self.lives = lives
        return obs, reward, terminated, truncated, info

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        """Restart the game after a real game over (or when re-seeded), else continue it with one no-op step."""
        if self.real_done or seed is not None:
            obs, info = self.env.reset(seed=seed, options=options)
        else:
            obs, _, terminated, truncated, info = self.env.step(0)
            if terminated or truncated:  # the no-op itself ended the game
                obs, info = self.env.reset(options=options)
        self.real_done = False
        self.lives = _ale(self).lives()
        return obs, info


class FireReset(gym.Wrapper):
    """Press FIRE (then action 2, as the standard wrapper does) after every reset, for games that wait for FIRE to
    start; with ``on_life_loss`` also after every lost life (evaluation, where lives do not reset the env)."""

    def __init__(self, env: gym.Env, on_life_loss: bool = False) -> None:
        super().__init__(env)
        self.on_life_loss = on_life_loss
        self.lives = 0

    def _fire(self, options: dict[str, Any] | None) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        total = 0.0
        for action in (1, 2):
            obs, reward, terminated, truncated, info = self.env.step(action)
            total += float(reward)
            if terminated or truncated:
                return obs, total, bool(terminated), bool(truncated), info
        return obs, total, False, False, info

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        """Reset, then FIRE; a game that ends during the FIRE steps is reset once more."""
        self.env.reset(seed=seed, options=options)
        obs, _, terminated, truncated, info = self._fire(options)
        if terminated or truncated:
            obs, info = self.env.reset(options=options)
        self.lives = _ale(self).lives()
        return obs, info

    def step(self, action: Any) -> tuple[Any, Any, bool, bool, dict[str, Any]]:
        """Step; in evaluation, FIRE after a lost life (its rewards count)."""
        obs, reward, terminated, truncated, info = self.env.step(action)
        lives = _ale(self).lives()
        if self.on_life_loss and 0 < lives < self.lives and not (terminated or truncated):
            obs, extra, terminated, truncated, info = self._fire(None)
            reward = float(reward) + extra
        self.lives = lives
        return obs, reward, terminated, truncated, info


def needs_fire(env: gym.Env) -> bool:
    """Whether the game's action set has FIRE as action 1 (the games that wait for it)."""
    meanings = env.unwrapped.get_action_meanings()  # type: ignore[attr-defined]
    return len(meanings) >= 3 and meanings[1] == "FIRE"


def wrap_atari(env: gym.Env, evaluation: bool = False) -> gym.Env:
    """The standard stack on an ALE env made with ``BASE_KWARGS`` (see the module docstring for the order)."""
    env = AtariPreprocessing(env, noop_max=NOOP_MAX, frame_skip=FRAME_SKIP, screen_size=SCREEN_SIZE)
    if not evaluation:
        env = EpisodicLife(env)
    if needs_fire(env):
        env = FireReset(env, on_life_loss=evaluation)
    if not evaluation:
        env = ClipReward(env, -1.0, 1.0)
    return FrameStackObservation(env, FRAME_STACK)


def atari_wrapper(evaluation: bool) -> Any:
    """``wrap_atari`` with ``evaluation`` bound (picklable, for async vector envs)."""
    return partial(wrap_atari, evaluation=evaluation)
