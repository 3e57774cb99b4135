"""Randomized Ensembled Double Q-learning (Chen et al. 2021) on SAC's pieces: an ensemble of ``N`` critics (one
batched ``QEnsemble``), each gradient step's target the min over a random subset of ``M`` target critics, the actor on
the mean of all ``N``, and many gradient steps per env step (``gradient_steps`` over ``collector.steps``).

The subset is drawn from the algorithm's own generator (in the checkpoint), so a resumed run draws the same subsets.
The actor and temperature step once per ``actor_delay`` critic steps, in the same backward pass as that critic step.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import torch
from torch import nn

from pickaxe.algos.core import td_target
from pickaxe.algos.extra_configs import REDQConfig
from pickaxe.algos.hindsight import replay_for
from pickaxe.algos.sac import SAC, temperature_loss
from pickaxe.data.batch import Batch
from pickaxe.data.buffers import ReplayBuffer
from pickaxe.data.hindsight import HindsightReplay
from pickaxe.models.continuous import ActionScale, QEnsemble, SquashedGaussianActor, box_action_dim, frozen
from pickaxe.models.mlp import single_spaces


def random_subset(n: int, m: int, generator: torch.Generator) -> torch.Tensor:
    """``m`` distinct indices of ``range(n)``, uniformly at random from ``generator`` (a CPU generator)."""
    return torch.randperm(n, generator=generator)[:m]


def redq_target(
    reward: torch.Tensor,
    next_q: torch.Tensor,
    next_logprob: torch.Tensor,
    terminated: torch.Tensor,
    gamma: float,
    alpha: float | torch.Tensor,
    subset: torch.Tensor,
) -> torch.Tensor:
    """``r + gamma (1 - terminated) (min_{i in subset} Q'_i(s', a') - alpha log pi(a'|s'))`` with ``a' ~ pi(s')``.

    ``next_q``: ``[N critics, B]``; ``subset``: the indices of the ``M`` critics whose min is taken; truncated steps
    bootstrap (only ``terminated`` stops it)."""
    soft_value = next_q.index_select(0, subset.to(next_q.device)).min(dim=0).values - alpha * next_logprob
    return td_target(reward, soft_value, terminated, gamma)


def redq_actor_loss(logprob: torch.Tensor, q: torch.Tensor, alpha: float | torch.Tensor) -> torch.Tensor:
    """``mean(alpha log pi(a|s) - mean_i Q_i(s, a))`` for reparameterised ``a ~ pi(s)``: the ensemble's mean, not its
    min (``q``: ``[N, B]``)."""
    return (alpha * logprob - q.mean(dim=0)).mean()


class REDQ(SAC):
    """REDQ for Box actions: SAC's replay, squashed Gaussian actor, temperature and Polyak targets, with
    :func:`redq_target` and :func:`redq_actor_loss` on an ensemble of ``ensemble_size`` critics."""

    def __init__(
        self,
        actor: nn.Module,
        critic: QEnsemble,
        action_space: gym.Space,
        config: REDQConfig | None = None,
        seed: int = 0,
        buffer: ReplayBuffer | HindsightReplay | None = None,
    ) -> None:
        super().__init__(actor, critic, action_space, config or REDQConfig(), seed=seed, buffer=buffer)
        self.subset_generator = torch.Generator().manual_seed(seed + 1)

    def _losses(self, mb: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(total loss, [critic, actor, temperature loss, alpha, entropy, mean Q])`` of one minibatch; the actor's
        and temperature's losses are 0 (and not in the total) except on every ``actor_delay``-th step."""
        cfg = self.config
        log_alpha = self.learned.log_alpha
        alpha = log_alpha.detach().exp()
        obs, next_obs = mb["obs"], mb["next_obs"]
        b = obs.shape[0]
        both_a, both_logp = self.actor.sample(torch.cat([obs, next_obs]))  # one actor pass for both
        a, next_a = both_a.split(b)
        logp, next_logp = both_logp.split(b)
        subset = random_subset(cfg.ensemble_size, cfg.subset_size, self.subset_generator)
        with torch.no_grad():
            y = redq_target(
                mb["reward"],
                self.target(next_obs, next_a),
                next_logp,
                mb["terminated"],
                cfg.gamma,
                alpha,
                subset,
            )
        assert self.policy.scale is not None
        q = self.critic(obs, self.policy.scale.to_unit(mb["action"]))
        critic_loss = 0.5 * (q - y.unsqueeze(0)).pow(2).mean(-1).sum()
        total = critic_loss
        zero = torch.zeros((), device=q.device)
        actor_loss = alpha_loss = zero
        if self.num_updates % cfg.actor_delay == 0:
            with frozen(self.critic):
                actor_loss = redq_actor_loss(logp, self.critic(obs, a), alpha)
            total = total + actor_loss
            if self.auto_alpha:
                alpha_loss = temperature_loss(log_alpha, logp, self.target_entropy)
                total = total + alpha_loss
        stats = torch.stack([critic_loss, actor_loss, alpha_loss, alpha, -logp.mean(), q.mean()]).detach()
        return total, stats

    def update(self, batch: Batch) -> dict[str, float]:
        """SAC's update with REDQ's losses; ``loss/actor`` and ``loss/alpha`` are means over the actor's steps (absent
        when this update took none)."""
        first, steps = self.num_updates, self.config.gradient_steps
        metrics = super().update(batch)
        if not metrics:
            return metrics
        delay = self.config.actor_delay
        actor_steps = sum(1 for k in range(first, first + steps) if k % delay == 0)
        for key in ("loss/actor", "loss/alpha"):
            if key in metrics:
                if actor_steps:
                    metrics[key] *= steps / actor_steps
                else:
                    del metrics[key]
        metrics["redq/actor_steps"] = float(actor_steps)
        return metrics

    def state_dict(self) -> dict[str, Any]:
        """SAC's state and the subset generator."""
        return {**super().state_dict(), "subset_rng": self.subset_generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned."""
        super().load_state_dict(state)
        self.subset_generator.set_state(state["subset_rng"])


def build_redq(config: REDQConfig, envs: Any, model: Any, device: torch.device, seed: int) -> REDQ:
    """REDQ sized from ``envs``' spaces (Box actions: a squashed Gaussian actor, ``ensemble_size`` critics) with
    ``model``'s hidden sizes and activation; ``seed`` seeds the replay and the subset draws."""
    obs_space, action_space = single_spaces(envs)
    hidden, activation = tuple(model.hidden), model.activation
    dim = box_action_dim(action_space)
    ActionScale(action_space)  # refuses unbounded Boxes before anything is built
    actor = SquashedGaussianActor(obs_space, dim, hidden, activation, config.log_std_min, config.log_std_max)
    critic = QEnsemble(obs_space, dim, config.ensemble_size, hidden, activation)
    buffer = replay_for(config, envs, device, seed)
    return REDQ(actor.to(device), critic.to(device), action_space, config, seed=seed, buffer=buffer)
