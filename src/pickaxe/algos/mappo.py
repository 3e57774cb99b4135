"""IPPO and MAPPO: PPO for every agent of a PettingZoo env, on ``[T, N]`` batches whose per-agent keys carry the
agents as a third dimension (``rollout.multiagent``)."""

from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDict
from torch import nn

from pickaxe.algos.base import Algorithm, clip_and_step
from pickaxe.algos.core import adam, explained_variance, linear_schedule
from pickaxe.algos.multiagent_configs import IPPOConfig, MAPPOConfig
from pickaxe.algos.multiagent_core import agent_gae, multiagent_ppo_loss
from pickaxe.data.batch import Batch, minibatches
from pickaxe.models.multiagent import MultiAgentActorCritic


class MultiAgentPPO(Algorithm):
    """PPO over agent-steps: per-agent GAE on the ``[T, N, A]`` rollout, then the rows of present agents (absent
    ones are dropped, not padded) in ``epochs`` passes of shuffled minibatches. The critic reads each agent's
    observation (IPPO) or the env's global state with the agent's id (MAPPO)."""

    loss_name: str = "multi-agent ppo loss"

    def __init__(self, policy: MultiAgentActorCritic, config: IPPOConfig | None = None) -> None:
        self.policy = policy
        self.config = cfg = config or IPPOConfig()
        self.optimizer = adam(policy.parameters(), lr=cfg.lr, eps=cfg.adam_eps)
        self.progress = 0.0

    def set_progress(self, step: int, total_steps: int) -> None:
        """Anneal the learning rate when its schedule is linear."""
        self.progress = step / max(total_steps, 1)

    def targets(self, batch: Batch) -> Batch:
        """The flat rows of present agent-steps with their GAE advantages and returns (``obs``, ``critic_in``,
        ``agent``, ``action``, ``logprob``, ``value``, ``advantage``, ``return``)."""
        cfg, policy = self.config, self.policy
        present = batch["mask"]
        with torch.no_grad():
            next_value = policy.value(batch["next_obs"], batch.get("next_state", None))
        advantage, returns = agent_gae(
            batch["reward"], batch["value"], next_value, batch["terminated"], batch["truncated"], present,
            cfg.gamma, cfg.gae_lambda,
        )  # fmt: skip
        critic_in = policy.critic_input(batch["obs"], batch.get("state", None))
        agent = torch.arange(policy.num_agents, device=present.device).expand_as(present)
        rows = {
            "obs": batch["obs"][present],
            "critic_in": critic_in[present],
            "agent": agent[present],
            "action": batch["action"][present],
            "logprob": batch["logprob"][present],
            "value": batch["value"][present],
            "advantage": advantage[present],
            "return": returns[present],
        }
        return TensorDict(rows, batch_size=[int(present.sum())])

    def update(self, batch: Batch) -> dict[str, float]:
        """Per-agent GAE, then PPO epochs over the present agent-steps."""
        cfg = self.config
        data = self.targets(batch)
        lr = linear_schedule(cfg.lr, 0.0, self.progress) if cfg.lr_schedule == "linear" else cfg.lr
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        history: list[dict[str, float]] = []
        epochs = 0
        for _ in range(cfg.epochs):
            epochs += 1
            for mb in minibatches(data, cfg.minibatch_size):
                history.append(self._step(mb))
            if cfg.target_kl is not None and history[-1]["ppo/approx_kl"] > cfg.target_kl:
                break
        metrics = {k: float(torch.tensor([h[k] for h in history]).mean()) for k in history[0]}
        metrics["ppo/explained_variance"] = explained_variance(data["value"], data["return"])
        metrics["ppo/lr"] = lr
        metrics["ppo/epochs"] = float(epochs)
        metrics["marl/present_fraction"] = float(batch["mask"].float().mean())
        return metrics

    def _step(self, mb: Batch) -> dict[str, float]:
        """One guarded optimizer step on a minibatch of agent-step rows."""
        cfg = self.config
        logprob, entropy, value = self.policy.evaluate_rows(mb["obs"], mb["critic_in"], mb["agent"], mb["action"])
        loss, stats = multiagent_ppo_loss(
            logprob, mb["logprob"], mb["advantage"], entropy, value, mb["value"], mb["return"], None, cfg.clip,
            cfg.vf_coef, cfg.ent_coef, cfg.value_clip, cfg.normalize_advantage,
        )  # fmt: skip
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        sums = torch.stack([v.float().reshape(()) for v in stats.values()])
        values = clip_and_step(self.policy, self.optimizer, cfg.max_grad_norm, loss, name=self.loss_name, sums=sums)
        return {**dict(zip(stats, values[2:], strict=True)), "grad_norm": values[0]}

    def networks(self) -> dict[str, nn.Module]:
        """The multi-agent actor-critic."""
        return {"policy": self.policy}

    def state_dict(self) -> dict[str, Any]:
        """Weights, optimizer and schedule position."""
        return {"policy": self.policy.state_dict(), "optimizer": self.optimizer.state_dict(), "progress": self.progress}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned."""
        self.policy.load_state_dict(state["policy"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.progress = float(state["progress"])


def multiagent_policy(config: IPPOConfig, envs: Any, model: Any) -> MultiAgentActorCritic:
    """The actor-critic for ``envs``' agents (a ``MultiAgentVectorEnv``), shaped by ``model`` and ``config``: a
    categorical actor for Discrete actions, a Gaussian one for Box actions."""
    s = envs.spaces
    return MultiAgentActorCritic(
        s.num_agents, s.obs_dim, s.n_actions, s.state_dim, tuple(model.hidden), model.activation,
        shared=config.shared, agent_id=config.agent_id, central=type(config).central_critic, continuous=s.continuous,
    )  # fmt: skip


def build_ippo(config: IPPOConfig, envs: Any, model: Any, device: torch.device, seed: int) -> MultiAgentPPO:
    """IPPO: each agent's critic on its own observation."""
    return MultiAgentPPO(multiagent_policy(config, envs, model).to(device), config)


def build_mappo(config: MAPPOConfig, envs: Any, model: Any, device: torch.device, seed: int) -> MultiAgentPPO:
    """MAPPO: a centralised critic on the env's global state."""
    return MultiAgentPPO(multiagent_policy(config, envs, model).to(device), config)
