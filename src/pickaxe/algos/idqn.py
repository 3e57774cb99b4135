"""Independent DQN on a PettingZoo env: every agent a double-DQN learner on its own observation, from one replay of
present agent-steps (the rows of ``rollout.multiagent`` batches whose ``mask`` is set)."""

from __future__ import annotations

import copy
from typing import Any

import torch
from tensordict import TensorDict
from torch import nn

from pickaxe.algos.base import Algorithm, clip_and_step
from pickaxe.algos.core import adam, huber, linear_schedule
from pickaxe.algos.multiagent_configs import IDQNConfig
from pickaxe.algos.multiagent_core import independent_q_target
from pickaxe.data.batch import Batch
from pickaxe.data.buffers import ReplayBuffer
from pickaxe.models.multiagent import MultiAgentQNetwork


class IndependentDQN(Algorithm):
    """Double DQN for every agent: present agent-steps go into the replay (absent agents add nothing), then
    ``gradient_steps`` Huber-loss steps on sampled rows, the target network copied every ``target_update_every``."""

    def __init__(self, qnet: MultiAgentQNetwork, config: IDQNConfig | None = None, seed: int = 0) -> None:
        self.config = cfg = config or IDQNConfig()
        self.policy = self.qnet = qnet
        self.target = copy.deepcopy(qnet).requires_grad_(False)
        self.optimizer = adam(qnet.parameters(), lr=cfg.lr)
        self.replay = ReplayBuffer(cfg.buffer_size, seed, next(qnet.parameters()).device)
        self.updates = 0
        self.progress = 0.0
        qnet.epsilon = cfg.eps_start

    def set_progress(self, step: int, total_steps: int) -> None:
        """Epsilon falls linearly from ``eps_start`` to ``eps_end`` over ``eps_fraction`` of the run."""
        cfg = self.config
        self.progress = step / max(total_steps, 1)
        self.qnet.epsilon = linear_schedule(cfg.eps_start, cfg.eps_end, self.progress / cfg.eps_fraction)

    def update(self, batch: Batch) -> dict[str, float]:
        """Store the present agent-steps, then the gradient steps once the replay holds ``learning_starts``."""
        cfg = self.config
        present = batch["mask"]
        agent = torch.arange(self.qnet.num_agents, device=present.device).expand_as(present)
        rows = {
            "obs": batch["obs"][present],
            "next_obs": batch["next_obs"][present],
            "agent": agent[present],
            "action": batch["action"][present],
            "reward": batch["reward"][present],
            "terminated": batch["terminated"][present],
        }
        self.replay.extend(TensorDict(rows, batch_size=[int(present.sum())]))
        metrics = {"dqn/epsilon": self.qnet.epsilon, "dqn/replay": float(len(self.replay))}
        if len(self.replay) < max(cfg.learning_starts, 1):
            return metrics
        for group in self.optimizer.param_groups:
            group["lr"] = cfg.lr
        losses, norms, qs = [], [], []
        for _ in range(cfg.gradient_steps):
            mb = self.replay.sample(cfg.batch_size)
            q = self.qnet.q_rows(mb["obs"], mb["agent"]).gather(-1, mb["action"].long().unsqueeze(-1)).squeeze(-1)
            with torch.no_grad():
                online = self.qnet.q_rows(mb["next_obs"], mb["agent"]) if cfg.double else None
                following = self.target.q_rows(mb["next_obs"], mb["agent"])
                target = independent_q_target(
                    following if online is None else online, following, mb["reward"], mb["terminated"], cfg.gamma,
                    cfg.double,
                )  # fmt: skip
            loss = huber(q, target)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            norm, value, q_mean = clip_and_step(
                self.qnet, self.optimizer, cfg.max_grad_norm, loss, extra=q.detach().mean().reshape(1), name="dqn loss"
            )
            losses.append(value)
            norms.append(norm)
            qs.append(q_mean)
            self.updates += 1
            if self.updates % cfg.target_update_every == 0:
                self.target.load_state_dict(self.qnet.state_dict())
        n = len(losses)
        metrics.update({"loss/q": sum(losses) / n, "grad_norm": sum(norms) / n, "dqn/q_mean": sum(qs) / n})
        return metrics

    def networks(self) -> dict[str, nn.Module]:
        """The Q-network (the acting policy)."""
        return {"qnet": self.qnet}

    def state_dict(self) -> dict[str, Any]:
        """Networks, optimizer, replay (with its sampling RNG), counters and epsilon."""
        return {
            "qnet": self.qnet.state_dict(),
            "target": self.target.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "replay": self.replay.state_dict(),
            "updates": self.updates,
            "progress": self.progress,
            "epsilon": self.qnet.epsilon,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned."""
        self.qnet.load_state_dict(state["qnet"])
        self.target.load_state_dict(state["target"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.replay.load_state_dict(state["replay"])
        self.updates, self.progress = int(state["updates"]), float(state["progress"])
        self.qnet.epsilon = float(state["epsilon"])


def build_idqn(config: IDQNConfig, envs: Any, model: Any, device: torch.device, seed: int) -> IndependentDQN:
    """Independent DQN with a Q-network for ``envs``' agents (a ``MultiAgentVectorEnv``) shaped by ``model``."""
    s = envs.spaces
    if s.continuous:
        raise ValueError("idqn takes Discrete actions; use ippo or mappo for Box actions")
    qnet = MultiAgentQNetwork(
        s.num_agents, s.obs_dim, s.n_actions, tuple(model.hidden), model.activation, config.shared, config.agent_id
    )
    return IndependentDQN(qnet.to(device), config, seed)
