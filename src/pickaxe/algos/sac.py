"""Soft Actor-Critic: twin critics with a min target and an entropy term, a tanh-squashed Gaussian actor, Polyak
targets and automatic temperature (Haarnoja et al. 2018, "SAC and applications"); on a Discrete action space,
discrete SAC (Christodoulou 2019) with exact expectations over the actions instead of samples.

One gradient step is one backward pass and one fused Adam step over the critics, the actor and the temperature
together (three parameter groups, each with its own learning rate). The actor's loss goes through the critics with
their parameters frozen and the temperature's through detached log-probs, so each loss reaches only its own
parameters: the gradients are those of three separate steps taken from the same parameters. That is one host read
per gradient step (``clip_and_step``), for the non-finite check and all the metrics.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from pickaxe.algos.base import Algorithm, clip_and_step
from pickaxe.algos.control_configs import SACConfig
from pickaxe.algos.core import adam, td_target
from pickaxe.algos.hindsight import replay_for
from pickaxe.data.batch import Batch
from pickaxe.data.buffers import ReplayBuffer
from pickaxe.data.hindsight import HINDSIGHT_KEYS, HindsightReplay
from pickaxe.models.continuous import (
    ActionScale,
    CategoricalActor,
    QEnsemble,
    SquashedGaussianActor,
    box_action_dim,
    frozen,
    polyak,
)
from pickaxe.models.mlp import single_spaces

REPLAY_KEYS = ("obs", "action", "reward", "terminated", "next_obs")
"""What the off-policy algorithms keep of a collected batch (truncation is not needed: only termination stops the
bootstrap)."""


def replay_keys(buffer: ReplayBuffer | HindsightReplay) -> tuple[str, ...]:
    """The keys of a collected batch that ``buffer`` stores (a hindsight replay needs truncation too: it ends
    episodes)."""
    return HINDSIGHT_KEYS if isinstance(buffer, HindsightReplay) else REPLAY_KEYS


def minibatches_of_update(
    buffer: ReplayBuffer | HindsightReplay, batch_size: int, count: int
) -> list[dict[str, torch.Tensor]]:
    """``count`` uniform minibatches of ``batch_size`` for one update, drawn in ONE sample of the replay (the buffer
    does not change within an update) and split into plain tensors: one replay index instead of ``count``."""
    data = buffer.sample(batch_size * count)
    keys = list(data.keys())
    parts = {k: data[k].split(batch_size) for k in keys}
    return [{k: parts[k][i] for k in keys} for i in range(count)]


# ----------------------------------------------------------------------------------------------- pure loss pieces
def sac_critic_target(
    reward: torch.Tensor,
    next_q: torch.Tensor,
    next_logprob: torch.Tensor,
    terminated: torch.Tensor,
    gamma: float,
    alpha: float | torch.Tensor,
    discount: torch.Tensor | None = None,
) -> torch.Tensor:
    """``r + gamma (1 - terminated) (min_i Q'_i(s', a') - alpha log pi(a'|s'))`` with ``a' ~ pi(s')``.

    ``next_q``: ``[n critics, B]``; ``next_logprob``: ``[B]``. Truncated steps bootstrap (only ``terminated``
    stops it). ``discount``: as ``td_target``'s."""
    soft_value = next_q.min(dim=0).values - alpha * next_logprob
    return td_target(reward, soft_value, terminated, gamma, discount)


def discrete_sac_critic_target(
    reward: torch.Tensor,
    next_logprobs: torch.Tensor,
    next_q: torch.Tensor,
    terminated: torch.Tensor,
    gamma: float,
    alpha: float | torch.Tensor,
) -> torch.Tensor:
    """Discrete SAC's target: the soft value ``sum_a pi(a|s') (min_i Q'_i(s', a) - alpha log pi(a|s'))`` as an
    exact expectation. ``next_logprobs``: ``[B, actions]``; ``next_q``: ``[n critics, B, actions]``."""
    probs = next_logprobs.exp()
    soft_value = (probs * (next_q.min(dim=0).values - alpha * next_logprobs)).sum(-1)
    return td_target(reward, soft_value, terminated, gamma)


def sac_actor_loss(logprob: torch.Tensor, q: torch.Tensor, alpha: float | torch.Tensor) -> torch.Tensor:
    """``mean(alpha log pi(a|s) - min_i Q_i(s, a))`` for reparameterised ``a ~ pi(s)``; ``q``: ``[n, B]``."""
    return (alpha * logprob - q.min(dim=0).values).mean()


def discrete_sac_actor_loss(logprobs: torch.Tensor, q: torch.Tensor, alpha: float | torch.Tensor) -> torch.Tensor:
    """``mean_s sum_a pi(a|s) (alpha log pi(a|s) - min_i Q_i(s, a))``; ``logprobs``: ``[B, actions]``, ``q``:
    ``[n, B, actions]`` (constants to this loss)."""
    return (logprobs.exp() * (alpha * logprobs - q.min(dim=0).values)).sum(-1).mean()


def temperature_loss(log_alpha: torch.Tensor, neg_entropy: torch.Tensor, target_entropy: float) -> torch.Tensor:
    """``-mean(log_alpha * (log pi + target_entropy))``: its gradient raises alpha while the policy's entropy is
    below ``target_entropy`` and lowers it above. ``neg_entropy`` is ``log pi(a|s)`` of a sample (continuous) or
    ``sum_a pi log pi`` (discrete), ``[B]``; it is a constant to this loss."""
    return -(log_alpha * (neg_entropy.detach() + target_entropy)).mean()


def default_target_entropy(action_space: gym.Space, scale: float = 0.89) -> float:
    """``-|A|`` for a Box (Haarnoja et al.), ``scale * log n`` for Discrete(n) (a fraction of the uniform policy's
    entropy; see ``SACConfig.target_entropy_scale``)."""
    if isinstance(action_space, gym.spaces.Discrete):
        return scale * math.log(int(action_space.n))
    return -float(np.prod(action_space.shape))


# ----------------------------------------------------------------------------------------------------- the policy
class SACPolicy(nn.Module):
    """What SAC acts with: uniform random actions (torch's RNG) while ``random`` is set (before
    ``learning_starts``), then samples of the actor; ``deterministic=True`` is the actor's mean (continuous) or most
    probable action (discrete). Actions are in env units (Box) or indices (Discrete)."""

    def __init__(self, actor: nn.Module, action_space: gym.Space) -> None:
        super().__init__()
        self.actor = actor
        self.discrete = isinstance(action_space, gym.spaces.Discrete)
        self.n = int(action_space.n) if self.discrete else 0
        self.scale = None if self.discrete else ActionScale(action_space)
        self.random = False

    def act(self, obs: torch.Tensor, deterministic: bool = False) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Actions for ``obs``; no extras."""
        b = obs.shape[0]
        if self.discrete:
            if self.random and not deterministic:
                return torch.randint(self.n, (b,), device=obs.device), {}
            logprobs = self.actor(obs)
            if deterministic:
                return logprobs.argmax(-1), {}
            return torch.multinomial(logprobs.exp(), 1).squeeze(-1), {}
        assert self.scale is not None
        if self.random and not deterministic:
            a = torch.rand(b, self.scale.center.numel(), device=obs.device) * 2.0 - 1.0
        elif deterministic:
            a = self.actor.mode(obs)
        else:
            a = self.actor.sample(obs)[0]
        return self.scale.to_env(a), {}


class _Learned(nn.Module):
    """Everything one SAC gradient step changes, as one module for ``clip_and_step``."""

    def __init__(self, actor: nn.Module, critic: QEnsemble, log_alpha: float) -> None:
        super().__init__()
        self.actor, self.critic = actor, critic
        self.log_alpha = nn.Parameter(torch.tensor(float(log_alpha)))


# -------------------------------------------------------------------------------------------------- the algorithm
class SAC(Algorithm):
    """SAC for Box (squashed Gaussian) and Discrete (categorical) actions: stores each collected batch in a uniform
    replay buffer (or ``buffer``: a ``HindsightReplay`` on goal envs), then takes ``gradient_steps`` gradient steps,
    each followed by a Polyak update of the target critics."""

    def __init__(
        self,
        actor: nn.Module,
        critic: QEnsemble,
        action_space: gym.Space,
        config: SACConfig | None = None,
        seed: int = 0,
        buffer: ReplayBuffer | HindsightReplay | None = None,
    ) -> None:
        self.config = cfg = config or SACConfig()
        self.policy = SACPolicy(actor, action_space)
        self.discrete = self.policy.discrete
        self.auto_alpha = cfg.alpha == "auto"
        alpha0 = cfg.alpha_init if self.auto_alpha else float(cfg.alpha)
        self.learned = _Learned(actor, critic, math.log(alpha0))
        device = next(critic.parameters()).device
        self.learned.to(device)
        self.policy.to(device)
        self.actor, self.critic = actor, critic
        self.target = copy.deepcopy(critic).requires_grad_(False)
        self.target_entropy = (
            cfg.target_entropy
            if cfg.target_entropy is not None
            else default_target_entropy(action_space, cfg.target_entropy_scale)
        )
        groups = [
            {"params": list(critic.parameters()), "lr": cfg.critic_lr or cfg.lr},
            {"params": list(actor.parameters()), "lr": cfg.lr},
        ]
        if self.auto_alpha:
            groups.append({"params": [self.learned.log_alpha], "lr": cfg.lr})
        else:
            self.learned.log_alpha.requires_grad_(False)
        self.optimizer = adam(groups, lr=cfg.lr)
        self.buffer = buffer if buffer is not None else ReplayBuffer(cfg.buffer_size, seed=seed, device=device)
        self.replay_keys = replay_keys(self.buffer)
        self.num_updates = 0

    def set_progress(self, step: int, total_steps: int) -> None:
        """Act uniformly at random until ``learning_starts`` env steps have been taken."""
        self.policy.random = step < self.config.learning_starts

    def _losses(self, mb: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(total loss, [critic, actor, temperature loss, alpha, entropy, mean Q])`` of one minibatch."""
        cfg = self.config
        log_alpha = self.learned.log_alpha
        alpha = log_alpha.detach().exp()
        obs, next_obs = mb["obs"], mb["next_obs"]
        b = obs.shape[0]
        if self.discrete:
            logprobs, next_logprobs = self.actor(torch.cat([obs, next_obs])).split(b)  # one actor pass for both
            with torch.no_grad():
                y = discrete_sac_critic_target(
                    mb["reward"], next_logprobs.detach(), self.target(next_obs), mb["terminated"], cfg.gamma, alpha
                )
            q_all = self.critic(obs)
            q = q_all.gather(-1, mb["action"].long().reshape(1, -1, 1).expand(q_all.shape[0], -1, 1)).squeeze(-1)
            actor_loss = discrete_sac_actor_loss(logprobs, q_all.detach(), alpha)
            neg_entropy = (logprobs.exp() * logprobs).sum(-1)
        else:
            both_a, both_logp = self.actor.sample(torch.cat([obs, next_obs]))  # one actor pass for both
            a, next_a = both_a.split(b)
            neg_entropy, next_logp = both_logp.split(b)
            with torch.no_grad():
                y = sac_critic_target(
                    mb["reward"],
                    self.target(next_obs, next_a.detach()),
                    next_logp.detach(),
                    mb["terminated"],
                    cfg.gamma,
                    alpha,
                )
            assert self.policy.scale is not None
            q = self.critic(obs, self.policy.scale.to_unit(mb["action"]))
            with frozen(self.critic):
                actor_loss = sac_actor_loss(neg_entropy, self.critic(obs, a), alpha)
        critic_loss = 0.5 * (q - y.unsqueeze(0)).pow(2).mean(-1).sum()
        total = critic_loss + actor_loss
        if self.auto_alpha:
            alpha_loss = temperature_loss(log_alpha, neg_entropy, self.target_entropy)
            total = total + alpha_loss
        else:
            alpha_loss = torch.zeros(())
        stats = torch.stack([critic_loss, actor_loss, alpha_loss, alpha, -neg_entropy.mean(), q.mean()]).detach()
        return total, stats

    def update(self, batch: Batch) -> dict[str, float]:
        """Store ``batch``; once ``learning_starts`` steps are stored, take ``gradient_steps`` gradient steps."""
        cfg = self.config
        self.buffer.extend(batch.select(*self.replay_keys))
        if len(self.buffer) < max(cfg.learning_starts, 1):
            return {}
        groups = self.optimizer.param_groups
        groups[0]["lr"] = cfg.critic_lr or cfg.lr
        for group in groups[1:]:
            group["lr"] = cfg.lr
        max_norm = cfg.max_grad_norm if cfg.max_grad_norm is not None else math.inf
        totals = np.zeros(7)
        for mb in minibatches_of_update(self.buffer, cfg.batch_size, cfg.gradient_steps):
            total, stats = self._losses(mb)
            self.optimizer.zero_grad(set_to_none=True)
            total.backward()
            values = clip_and_step(self.learned, self.optimizer, max_norm, sums=stats, name="sac loss")
            totals += values
            polyak(self.target, self.critic, cfg.tau)
            self.num_updates += 1
        mean = totals / cfg.gradient_steps
        names = ("sac/grad_norm", "loss/critic", "loss/actor", "loss/alpha", "sac/alpha", "sac/entropy", "sac/q_mean")
        metrics = dict(zip(names, mean.tolist(), strict=True))
        if not self.auto_alpha:
            del metrics["loss/alpha"]
        return metrics

    def networks(self) -> dict[str, nn.Module]:
        """The actor (what acts) first, then the critics and their targets."""
        return {"actor": self.actor, "critic": self.critic, "q_target": self.target}

    def state_dict(self) -> dict[str, Any]:
        """Networks, temperature, optimizer, replay buffer (with its RNG) and the update counter."""
        return {
            "actor": self.actor.state_dict(),
            "critic": self.critic.state_dict(),
            "q_target": self.target.state_dict(),
            "log_alpha": self.learned.log_alpha.detach().clone(),
            "optimizer": self.optimizer.state_dict(),
            "buffer": self.buffer.state_dict(),
            "num_updates": self.num_updates,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned."""
        self.actor.load_state_dict(state["actor"])
        self.critic.load_state_dict(state["critic"])
        self.target.load_state_dict(state["q_target"])
        with torch.no_grad():
            self.learned.log_alpha.copy_(torch.as_tensor(state["log_alpha"]))
        self.optimizer.load_state_dict(state["optimizer"])
        self.buffer.load_state_dict(state["buffer"])
        self.num_updates = int(state["num_updates"])


def build_sac(config: SACConfig, envs: Any, model: Any, device: torch.device, seed: int) -> SAC:
    """SAC sized from ``envs``' spaces (Box actions: squashed Gaussian; Discrete: categorical) with ``model``'s
    hidden sizes and activation for actor and critics; ``seed`` seeds the replay (hindsight replay with
    ``config.her``)."""
    obs_space, action_space = single_spaces(envs)
    hidden, activation = tuple(model.hidden), model.activation
    if isinstance(action_space, gym.spaces.Discrete):
        n = int(action_space.n)
        actor: nn.Module = CategoricalActor(obs_space, n, hidden, activation)
        critic = QEnsemble(obs_space, 0, 2, hidden, activation, outputs=n)
    else:
        dim = box_action_dim(action_space)
        ActionScale(action_space)  # refuses unbounded Boxes before anything is built
        actor = SquashedGaussianActor(obs_space, dim, hidden, activation, config.log_std_min, config.log_std_max)
        critic = QEnsemble(obs_space, dim, 2, hidden, activation)
    buffer = replay_for(config, envs, device, seed)
    return SAC(actor.to(device), critic.to(device), action_space, config, seed=seed, buffer=buffer)
