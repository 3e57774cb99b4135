"""Evaluation: the deterministic policy on separate eval envs."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import AutoresetMode

from pickaxe.envs.make import SeededVectorEnv
from pickaxe.models.policy import Policy


def evaluate(
    policy: Policy,
    envs: gym.vector.VectorEnv,
    episodes: int = 10,
    device: str | torch.device = "cpu",
    deterministic: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
    """Run ``episodes`` full episodes and return their ``(returns, lengths)``.

    Episodes are split evenly over the sub-envs and each sub-env runs exactly its share, so short
    episodes are not over-represented. A ``SeededVectorEnv`` is re-seeded every call, which makes an
    evaluation a pure function of the policy's weights (and of the eval seed).
    """
    n = envs.num_envs
    quota = np.array([(episodes + i) // n for i in range(n)])
    seed = envs.seed if isinstance(envs, SeededVectorEnv) else None
    obs, _ = envs.reset(seed=seed)
    act_space = envs.single_action_space
    clip = (act_space.low, act_space.high) if isinstance(act_space, gym.spaces.Box) else None
    same_step = envs.metadata.get("autoreset_mode") == AutoresetMode.SAME_STEP
    ep_ret, ep_len = np.zeros(n), np.zeros(n, dtype=np.int64)
    done_count = np.zeros(n, dtype=np.int64)
    returns: list[float] = []
    lengths: list[int] = []
    device = torch.device(device)
    with torch.no_grad():
        while (done_count < quota).any():
            obs_t = torch.as_tensor(np.asarray(obs, dtype=np.float32), device=device)
            action, _ = policy.act(obs_t, deterministic=deterministic)
            act_np = action.cpu().numpy()
            if clip is not None:
                act_np = np.clip(act_np, *clip)
            obs, reward, term, trunc, _ = envs.step(act_np)
            ep_ret += reward
            ep_len += 1
            done = term | trunc
            for i in np.flatnonzero(done):
                if done_count[i] < quota[i]:
                    returns.append(float(ep_ret[i]))
                    lengths.append(int(ep_len[i]))
                done_count[i] += 1
            ep_ret[done], ep_len[done] = 0.0, 0
            if done.any() and not same_step:
                reset_obs, _ = envs.reset(options={"reset_mask": done})
                obs = np.where(done.reshape(-1, *[1] * (np.ndim(obs) - 1)), reset_obs, obs)
    return np.array(returns), np.array(lengths)
