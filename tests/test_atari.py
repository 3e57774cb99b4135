"""The standard Atari stack on real ALE games: shapes and base settings, frame-stack order, lost lives (training
vs evaluation), reward clipping, exact resume through every wrapper, and a PPO / DQN update on the frames."""

from __future__ import annotations

import importlib.util
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

from pickaxe.algos.configs import DQNConfig, PPOConfig
from pickaxe.algos.dqn import build_dqn
from pickaxe.algos.ppo import build_ppo
from pickaxe.envs.make import SeededVectorEnv, make
from pickaxe.rollout.collector import Collector
from pickaxe.runs.state import flatten_state, unflatten_state
from pickaxe.train.config import ModelConfig

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("ale_py") is None or importlib.util.find_spec("cv2") is None,
    reason="ale-py and opencv not installed (pip install 'pickaxe[atari]')",
)


def _sub(envs: SeededVectorEnv, i: int = 0) -> gym.Env:
    return envs.env.envs[i]  # type: ignore[attr-defined]


def _lives(envs: SeededVectorEnv, i: int = 0) -> int:
    return int(_sub(envs, i).unwrapped.ale.lives())  # type: ignore[attr-defined]


def _chain(env: gym.Env) -> list[str]:
    names = []
    while isinstance(env, gym.Wrapper):
        names.append(type(env).__name__)
        env = env.env
    return names


def test_stack_shapes_and_base_settings() -> None:
    train, evaluation = make("ALE/Pong-v5", 1, 0), make("ALE/Pong-v5", 1, 0, evaluation=True)
    try:
        assert train.single_observation_space == gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
        obs, _ = train.reset()
        assert obs.shape == (1, 4, 84, 84) and obs.dtype == np.uint8
        base = _sub(train).unwrapped
        assert base._frameskip == 1 and base.ale.getFloat("repeat_action_probability") == 0.0
        chain = _chain(_sub(train))
        for name in ("FrameStackObservation", "ClipReward", "FireReset", "EpisodicLife", "AtariPreprocessing"):
            assert name in chain
        assert chain.index("FrameStackObservation") < chain.index("ClipReward") < chain.index("AtariPreprocessing")
        eval_chain = _chain(_sub(evaluation))
        assert "EpisodicLife" not in eval_chain and "ClipReward" not in eval_chain and "FireReset" in eval_chain
    finally:
        train.close()
        evaluation.close()


def test_frame_stack_is_oldest_first() -> None:
    envs = make("ALE/Pong-v5", 1, 0)
    try:
        obs, _ = envs.reset()
        assert all(np.array_equal(obs[0, k], obs[0, 3]) for k in range(3))  # padded with the reset frame
        changed = False
        for _ in range(60):
            nxt, _, term, trunc, _ = envs.step(np.array([2]))
            assert not (term.any() or trunc.any())
            np.testing.assert_array_equal(nxt[0, :3], obs[0, 1:])  # each frame moves one slot towards the front
            changed |= not np.array_equal(nxt[0, 3], obs[0, 3])
            obs = nxt
        assert changed  # new frames arrive at the back
    finally:
        envs.close()


def _play_until(envs: SeededVectorEnv, stop: Any, steps: int = 1500, seed: int = 0) -> tuple[int, Any]:
    rng = np.random.default_rng(seed)
    for t in range(steps):
        out = envs.step(rng.integers(0, envs.single_action_space.n, envs.num_envs))
        if stop(out):
            return t, out
    raise AssertionError("the condition never happened")


def test_lost_life_ends_training_episodes_but_not_the_game() -> None:
    train = make("ALE/Breakout-v5", 1, 0)
    try:
        train.reset()
        _, (_, _, term, trunc, _) = _play_until(train, lambda out: out[2].any() or out[3].any())
        assert term[0] and not trunc[0] and _lives(train) == 4  # one life of 5 lost: an episode end for the learner
        train.step(np.array([0]))  # the autoreset continued the same game (no new game: still 4 lives)
        assert _lives(train) == 4
    finally:
        train.close()
    evaluation = make("ALE/Breakout-v5", 1, 0, evaluation=True)
    try:
        evaluation.reset()
        seen = []
        _play_until(evaluation, lambda out: seen.append(bool(out[2][0])) or _lives(evaluation) < 5)
        assert not any(seen)  # a lost life does not end the evaluation episode
        lives_then = _lives(evaluation)
        _play_until(evaluation, lambda out: out[2][0] or _lives(evaluation) < lives_then, seed=1)
        assert _lives(evaluation) < lives_then  # the game went on after the lost life (FIRE was pressed for us)
    finally:
        evaluation.close()


def test_rewards_clipped_in_training_and_raw_in_evaluation() -> None:
    train, evaluation = make("ALE/SpaceInvaders-v5", 1, 3), make("ALE/SpaceInvaders-v5", 1, 3, evaluation=True)
    try:
        train.reset()
        evaluation.reset()
        rng = np.random.default_rng(0)
        for _ in range(400):  # same seed and actions: the same game until the first lost life
            action = rng.integers(0, 6, 1)
            _, r_train, term, _, _ = train.step(action)
            _, r_eval, _, _, _ = evaluation.step(action)
            if term[0]:
                break
            assert r_train[0] == np.clip(r_eval[0], -1, 1)
            if r_eval[0] > 1:  # invaders score 5-30 points: raw in evaluation, 1 in training
                assert r_train[0] == 1.0
                return
        raise AssertionError("no invader was hit before the first lost life")
    finally:
        train.close()
        evaluation.close()


def _run(envs: SeededVectorEnv, actions: np.ndarray) -> list[tuple[Any, ...]]:
    return [tuple(np.copy(x) for x in envs.step(a)[:4]) for a in actions]


def test_restored_envs_continue_bit_identically_through_the_wrappers() -> None:
    rng = np.random.default_rng(0)
    actions = rng.integers(0, 4, (140, 2))
    envs = make("ALE/Breakout-v5", 2, 7)
    try:
        envs.reset()
        _run(envs, actions[:20])
        state = flatten_state({"envs": list(envs.get_attr("pickaxe_state"))})  # as a checkpoint stores it
        first = _run(envs, actions[20:])
    finally:
        envs.close()
    assert any(step[2].any() for step in first)  # the window crosses lost lives (episodic life, FIRE, no-ops)
    fresh = make("ALE/Breakout-v5", 2, 7)  # a resumed process: same construction, state loaded into it
    try:
        fresh.reset()
        fresh.set_attr("pickaxe_state", unflatten_state(*state)["envs"])
        fresh.mark_seeded()
        second = _run(fresh, actions[20:])
    finally:
        fresh.close()
    for a, b in zip(first, second, strict=True):
        for x, y in zip(a, b, strict=True):
            np.testing.assert_array_equal(x, y)


def test_ppo_and_dqn_update_on_atari_frames() -> None:
    envs = make("ALE/Breakout-v5", 2, 0)
    try:
        torch.manual_seed(0)
        ppo = build_ppo(PPOConfig(epochs=1, minibatch_size=16), envs, ModelConfig(hidden=()), torch.device("cpu"), 0)
        batch = Collector(envs, ppo.policy, steps=32).collect()
        assert batch["obs"].dtype == torch.uint8 and batch["obs"].shape == (16, 2, 4, 84, 84)
        assert np.isfinite(ppo.update(batch)["loss/value"])
        dqn_config = DQNConfig(learning_starts=0, batch_size=8, buffer_size=64)
        dqn = build_dqn(dqn_config, envs, ModelConfig(hidden=()), "cpu", 0)
        assert np.isfinite(dqn.update(Collector(envs, dqn.policy, steps=16).collect())["loss/q"])
    finally:
        envs.close()


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["breakout-ppo", "pong-dqn"])
def test_atari_recipes_train_and_evaluate_end_to_end(recipe: str, tmp_path: Any) -> None:
    import json

    from pickaxe.cli import main

    argv = ["train", recipe, "--env.num-envs", "2", "--collector.steps", "64", "--trainer.total-steps", "256"]
    argv += ["--trainer.eval-every", "256", "--env.eval-envs", "1", "--trainer.eval-episodes", "1"]
    argv += ["--algo.buffer-size", "512", "--algo.learning-starts", "128"] if recipe == "pong-dqn" else []
    assert main([*argv, "--run-dir", str(tmp_path / "run")]) == 0
    last = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["step"] == 256 and np.isfinite(last["eval/return_mean"])
    if recipe == "pong-dqn":  # a whole game: one side reaches 21 points
        assert last["eval/return_mean"] <= -1 and last["eval/length_mean"] > 500
