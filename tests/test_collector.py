"""The Collector against a plain gymnasium loop: same transitions, no reset steps, same episode returns."""

import gymnasium as gym
import numpy as np
import pytest
import torch

import pickaxe as px
from pickaxe.envs import SeededVectorEnv


class ScriptedPolicy:
    """Actions from a fixed random stream, so a reference loop can replay them."""

    def __init__(self, action_space: gym.Space, seed: int = 0) -> None:
        self.space = action_space
        self.rng = np.random.default_rng(seed)
        self.actions: list[np.ndarray] = []

    def act(self, obs: torch.Tensor, deterministic: bool = False):
        n = obs.shape[0]
        if isinstance(self.space, gym.spaces.Discrete):
            a = self.rng.integers(self.space.n, size=n)
        else:
            a = self.rng.uniform(self.space.low, self.space.high, size=(n, *self.space.shape)).astype(np.float32)
        self.actions.append(a)
        return torch.as_tensor(a), {"logprob": torch.zeros(n)}


def reference(env_id: str, n: int, seed: int, actions: np.ndarray):
    """Plain single-env gymnasium loops; returns per-env transitions and episode returns."""
    out = []
    for i in range(n):
        env = gym.make(env_id)
        obs, _ = env.reset(seed=seed + i)
        trans, returns, ep = [], [], 0.0
        for t in range(actions.shape[0]):
            nxt, r, term, trunc, _ = env.step(actions[t, i])
            trans.append((obs, r, term, trunc, nxt))
            ep += r
            if term or trunc:
                returns.append(ep)
                ep = 0.0
                obs, _ = env.reset()
            else:
                obs = nxt
        out.append((trans, returns))
    return out


def make_envs(env_id: str, n: int, seed: int, mode: str):
    if mode == "pickaxe":
        return px.envs.make(env_id, n=n, seed=seed)
    vec = gym.make_vec(
        env_id, num_envs=n, vectorization_mode="sync", vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode(mode)}
    )
    return SeededVectorEnv(vec, seed)


@pytest.mark.parametrize("mode", ["pickaxe", "NextStep", "SameStep", "Disabled"])
@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_collector_matches_plain_gymnasium(env_id: str, mode: str) -> None:
    n, seed, steps = 3, 7, 3 * 150
    envs = make_envs(env_id, n, seed, mode)
    policy = ScriptedPolicy(envs.single_action_space)
    collector = px.Collector(envs, policy, steps=steps)
    batches, episodes = [], []
    for _ in range(3):  # several collects: episodes span collect boundaries
        batches.append(collector.collect())
        episodes += collector.episodes
    batch = torch.cat(batches, dim=0)
    actions = np.stack(policy.actions)
    ref = reference(env_id, n, seed, actions)
    T = batch.shape[0]
    assert batch.shape == (T, n) and T == 450
    for i, (trans, _returns) in enumerate(ref):
        obs = np.stack([tr[0] for tr in trans])
        np.testing.assert_allclose(batch["obs"][:, i].numpy(), obs, rtol=1e-6)
        np.testing.assert_allclose(batch["next_obs"][:, i].numpy(), np.stack([tr[4] for tr in trans]), rtol=1e-6)
        np.testing.assert_allclose(batch["reward"][:, i].numpy(), [tr[1] for tr in trans], rtol=1e-6)
        assert batch["terminated"][:, i].tolist() == [bool(tr[2]) for tr in trans]
        assert batch["truncated"][:, i].tolist() == [bool(tr[3]) for tr in trans]
    # every episode the collector reported, in completion order per env, equals the reference's
    ref_returns = sorted(r for _, returns in ref for r in returns)
    np.testing.assert_allclose(sorted(r for r, _ in episodes), ref_returns, rtol=1e-5)
    if env_id == "Pendulum-v1":  # only truncation ends Pendulum episodes, at 200 steps
        assert batch["truncated"].sum() == n * 2 and not batch["terminated"].any()
        assert {length for _, length in episodes} == {200}


def test_no_reset_step_enters_the_batch() -> None:
    """Within an episode obs[t+1] == next_obs[t]; across an end, obs[t+1] is a fresh start, never a transition."""
    envs = px.envs.make("CartPole-v1", n=4, seed=0)
    batch = px.Collector(envs, ScriptedPolicy(envs.single_action_space), steps=4 * 200).collect()
    done = (batch["terminated"] | batch["truncated"])[:-1]
    same = (batch["obs"][1:] == batch["next_obs"][:-1]).all(-1)
    assert done.any()
    assert torch.equal(same, ~done)
    # a reset step would show as a zero-reward transition in CartPole (every real step gives +1)
    assert (batch["reward"] == 1.0).all()


def test_collector_keys_and_shapes_with_actor_critic() -> None:
    envs = px.envs.make("CartPole-v1", n=4, seed=0)
    policy = px.models.ActorCritic.for_env(envs)
    batch = px.Collector(envs, policy, steps=64).collect()
    assert batch.batch_size == torch.Size([16, 4])
    assert set(batch.keys()) == {"obs", "action", "reward", "terminated", "truncated", "next_obs", "logprob", "value"}
    assert batch["obs"].dtype == torch.float32 and batch["action"].dtype == torch.int64


def test_collector_rejects_steps_not_multiple_of_envs() -> None:
    envs = px.envs.make("CartPole-v1", n=4, seed=0)
    with pytest.raises(ValueError, match="multiple of the number of envs"):
        px.Collector(envs, ScriptedPolicy(envs.single_action_space), steps=10)


def test_async_envs_collect_the_same_as_sync() -> None:
    sync = px.envs.make("CartPole-v1", n=2, seed=3)
    asyn = px.envs.make("CartPole-v1", n=2, seed=3, vectorization="async")
    try:
        a = px.Collector(sync, ScriptedPolicy(sync.single_action_space), steps=100).collect()
        b = px.Collector(asyn, ScriptedPolicy(asyn.single_action_space), steps=100).collect()
        assert torch.equal(a["obs"], b["obs"]) and torch.equal(a["next_obs"], b["next_obs"])
    finally:
        asyn.close()
