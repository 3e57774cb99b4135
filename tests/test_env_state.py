"""Env state capture: restoring a snapshot replays exactly the same future, for every supported family."""

import importlib.util

import gymnasium as gym
import numpy as np
import pytest

from pickaxe.envs.state import Snapshot

CLASSIC = ["CartPole-v1", "Pendulum-v1", "MountainCar-v0", "MountainCarContinuous-v0", "Acrobot-v1", "FrozenLake-v1"]
MUJOCO = ["HalfCheetah-v5", "Hopper-v5"]
has_mujoco = importlib.util.find_spec("mujoco") is not None
has_ale = importlib.util.find_spec("ale_py") is not None


def _replay(env_id: str, mode: str) -> None:
    envs = gym.make_vec(
        env_id,
        num_envs=2,
        vectorization_mode=mode,
        wrappers=[Snapshot],
        vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP},
    )
    try:
        envs.reset(seed=0)
        envs.action_space.seed(0)
        actions = [envs.action_space.sample() for _ in range(120)]
        for a in actions[:15]:
            envs.step(a)
        assert envs.get_attr("pickaxe_state_support") == ("exact", "exact")
        snapshot = envs.get_attr("pickaxe_state")
        first = [envs.step(a) for a in actions[15:]]  # long enough to cross episode ends (autoreset RNG too)
        envs.set_attr("pickaxe_state", list(snapshot))
        second = [envs.step(a) for a in actions[15:]]
        for (o1, r1, te1, tr1, _), (o2, r2, te2, tr2, _) in zip(first, second, strict=True):
            np.testing.assert_array_equal(o1, o2)
            np.testing.assert_array_equal(r1, r2)
            assert (te1 == te2).all() and (tr1 == tr2).all()
    finally:
        envs.close()


@pytest.mark.parametrize("env_id", CLASSIC)
def test_classic_envs_restore_exactly(env_id: str) -> None:
    _replay(env_id, "sync")


@pytest.mark.skipif(not has_mujoco, reason="mujoco not installed (pip install 'pickaxe[mujoco]')")
@pytest.mark.parametrize("env_id", MUJOCO)
def test_mujoco_envs_restore_exactly(env_id: str) -> None:
    _replay(env_id, "sync")


@pytest.mark.skipif(not has_ale, reason="ale-py not installed (pip install 'pickaxe[atari]')")
def test_atari_envs_restore_exactly() -> None:
    import ale_py

    gym.register_envs(ale_py)
    _replay("ALE/Pong-v5", "sync")


def test_async_envs_restore_across_processes() -> None:
    _replay("CartPole-v1", "async")


@pytest.mark.skipif(not has_mujoco, reason="mujoco not installed (pip install 'pickaxe[mujoco]')")
@pytest.mark.parametrize(("env_id", "obs_size", "act_size"), [("HalfCheetah-v5", 17, 6), ("Hopper-v5", 11, 3)])
def test_mujoco_through_make_resumes_in_a_fresh_process(env_id: str, obs_size: int, act_size: int) -> None:
    """What a resumed run does: the checkpointed state (through runs.state) loaded into envs made anew."""
    from pickaxe.envs.make import make
    from pickaxe.runs.state import flatten_state, unflatten_state

    actions = np.random.default_rng(0).uniform(-1, 1, (150, 2, act_size)).astype(np.float32)
    envs = make(env_id, 2, 3)
    try:
        assert envs.single_observation_space.shape == (obs_size,) and envs.single_action_space.shape == (act_size,)
        envs.reset()
        for a in actions[:20]:
            envs.step(a)
        state = flatten_state(list(envs.get_attr("pickaxe_state")))
        first = [tuple(np.copy(x) for x in envs.step(a)[:4]) for a in actions[20:]]
    finally:
        envs.close()
    fresh = make(env_id, 2, 3)
    try:
        fresh.reset()
        fresh.set_attr("pickaxe_state", unflatten_state(*state))
        fresh.mark_seeded()
        second = [tuple(np.copy(x) for x in fresh.step(a)[:4]) for a in actions[20:]]
    finally:
        fresh.close()
    if env_id == "Hopper-v5":  # random actions topple the hopper: the window crosses episode ends and resets
        assert any(step[2].any() for step in first)
    for a, b in zip(first, second, strict=True):
        for x, y in zip(a, b, strict=True):
            np.testing.assert_array_equal(x, y)
