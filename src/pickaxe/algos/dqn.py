"""Deep Q-Network and its family as options of one algorithm: double DQN with a target network, n-step returns,
prioritized replay, dueling heads and distributional heads (C51, QR-DQN); "Rainbow" is a recipe turning them on.

The loss pieces are pure functions tested against hand values: :func:`categorical_projection` (C51),
:func:`quantile_huber_loss` (QR-DQN), and in ``pickaxe.data.replay`` the n-step windows and importance weights.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from pickaxe.algos.base import Algorithm, clip_and_step
from pickaxe.algos.configs import DQNConfig
from pickaxe.algos.core import adam, discounts, huber, linear_schedule, td_target
from pickaxe.data.batch import Batch
from pickaxe.data.buffers import ReplayBuffer
from pickaxe.data.replay import NSTEP_KEYS, NStepAccumulator, PrioritizedReplayBuffer
from pickaxe.models.q_network import EpsilonGreedy, QNetwork

_REPLAY_KEYS = ("obs", "action", "reward", "terminated", "next_obs")


def discount_of(mb: Batch, gamma: float) -> torch.Tensor:
    """Each transition's bootstrap discount: its own ``discount`` (n-step: ``gamma^k``, 0 if terminated) where it
    has one, else ``gamma * (1 - terminated)`` (:func:`~pickaxe.algos.core.discounts`)."""
    if "discount" in mb.keys():  # noqa: SIM118 - TensorDict refuses `in` on itself
        return mb["discount"]
    return discounts(mb["reward"], mb["terminated"], gamma)


def _bootstrap(mb: Batch, next_value: torch.Tensor, gamma: float) -> torch.Tensor:
    """``r + discount * next_value``; ``next_value`` may have a trailing atom dimension."""
    shape = (-1, *[1] * (next_value.dim() - 1))
    return mb["reward"].view(shape) + discount_of(mb, gamma).view(shape) * next_value


@torch.no_grad()
def dqn_target(qnet: QNetwork, target: QNetwork, mb: Batch, cfg: DQNConfig) -> torch.Tensor:
    """TD targets ``r + gamma * (1 - terminated) * Q_target(s', a')`` of a replay minibatch (n-step transitions:
    ``r_n + discount * Q_target(s_{t+k}, a')``).

    ``a'`` is the online network's argmax when ``cfg.double`` (double DQN), else the target network's.
    """
    if "discount" not in mb.keys():  # noqa: SIM118
        next_q_target = target(mb["next_obs"])
        if cfg.double:  # online net picks the action, target net scores it
            next_action = qnet(mb["next_obs"]).argmax(-1, keepdim=True)
        else:
            next_action = next_q_target.argmax(-1, keepdim=True)
        next_value = next_q_target.gather(-1, next_action).squeeze(-1)
        return td_target(mb["reward"], next_value, mb["terminated"], cfg.gamma)
    next_q_target = target.q_values(target.dist(mb["next_obs"]))
    next_action = (qnet(mb["next_obs"]) if cfg.double else next_q_target).argmax(-1, keepdim=True)
    next_value = next_q_target.gather(-1, next_action).squeeze(-1)
    return _bootstrap(mb, next_value, cfg.gamma)


def categorical_projection(
    next_probs: torch.Tensor, reward: torch.Tensor, discount: torch.Tensor, support: torch.Tensor
) -> torch.Tensor:
    """C51's projection of the distribution ``r + discount * Z`` onto the fixed ``support``.

    ``next_probs`` ``[B, atoms]`` are the probabilities of the returns ``support`` (evenly spaced); each shifted
    atom ``r + discount * z_j``, clipped to ``[v_min, v_max]``, splits its probability between the two nearest
    support atoms in proportion to closeness (all of it to one atom it falls exactly on). Returns ``[B, atoms]``.
    """
    atoms = support.numel()
    v_min, v_max = float(support[0]), float(support[-1])
    delta = (v_max - v_min) / (atoms - 1)
    tz = (reward.unsqueeze(-1) + discount.unsqueeze(-1) * support).clamp(v_min, v_max)
    b = ((tz - v_min) / delta).clamp(0, atoms - 1)
    lower, upper = b.floor().long(), b.ceil().long()
    w_upper = b - lower.to(b.dtype)
    w_lower = 1.0 - w_upper  # exactly on an atom: lower == upper gets weight 1
    out = torch.zeros_like(next_probs)
    out.scatter_add_(-1, lower, next_probs * w_lower)
    out.scatter_add_(-1, upper, next_probs * w_upper)
    return out


def quantile_huber_loss(quantiles: torch.Tensor, target: torch.Tensor, kappa: float = 1.0) -> torch.Tensor:
    """QR-DQN's quantile Huber loss per sample, ``[B]``.

    ``quantiles`` ``[B, N]`` estimate the return's quantiles at ``tau_i = (2i + 1) / 2N``; ``target`` ``[B, M]``
    are samples of the target distribution. With ``u = target_j - quantiles_i``, each pair costs
    ``|tau_i - 1{u < 0}| * huber_kappa(u) / kappa``; the loss sums over ``i`` and averages over ``j``.
    """
    n = quantiles.shape[-1]
    tau = (torch.arange(n, device=quantiles.device, dtype=quantiles.dtype) + 0.5) / n
    u = target.unsqueeze(-2) - quantiles.unsqueeze(-1)  # [B, N, M]
    abs_u = u.abs()
    hub = torch.where(abs_u <= kappa, 0.5 * u.pow(2), kappa * (abs_u - 0.5 * kappa))
    rho = (tau.view(-1, 1) - (u.detach() < 0).to(u.dtype)).abs() * hub / kappa
    return rho.sum(-2).mean(-1)


def dqn_loss(
    qnet: QNetwork, target: QNetwork, mb: Batch, cfg: DQNConfig, weights: torch.Tensor | None = None
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The minibatch loss of ``cfg``'s head and its stats: TD loss (``cfg.loss``: Huber or MSE) against
    :func:`dqn_target`, C51's cross-entropy against the projected target distribution, or QR-DQN's quantile
    Huber loss. With importance ``weights`` ``[B]`` (prioritized replay) the per-sample losses are weighted and
    ``stats["priority"]`` holds each sample's new priority (its |TD error|, or its distributional loss)."""
    action = mb["action"].long().view(-1, 1)
    if cfg.distributional == "none" and not qnet.dueling and weights is None:
        y = dqn_target(qnet, target, mb, cfg)
        q = qnet(mb["obs"]).gather(-1, action).squeeze(-1)
        loss = huber(q, y) if cfg.loss == "huber" else F.mse_loss(q, y)
        return loss, {"loss/q": loss.detach(), "dqn/q_mean": q.detach().mean()}
    batch = mb["obs"].shape[0]
    online_picks = cfg.double
    if online_picks:  # one online pass over obs and next_obs; the next_obs half only picks the next action
        both = qnet.dist(torch.cat([mb["obs"], mb["next_obs"]]))
        head = both[:batch]
        next_action = qnet.q_values(both[batch:].detach()).argmax(-1, keepdim=True)
    else:
        head = qnet.dist(mb["obs"])
    chosen = head.gather(1, action.unsqueeze(-1).expand(-1, 1, head.shape[-1])).squeeze(1)  # [B, atoms]
    with torch.no_grad():
        next_head = target.dist(mb["next_obs"])
        if not online_picks:
            next_action = target.q_values(next_head).argmax(-1, keepdim=True)
        next_chosen = next_head.gather(1, next_action.unsqueeze(-1).expand(-1, 1, next_head.shape[-1])).squeeze(1)
    if cfg.distributional == "c51":
        with torch.no_grad():
            discount = discount_of(mb, cfg.gamma)
            m = categorical_projection(next_chosen.softmax(-1), mb["reward"], discount, qnet.support)
        per_sample = -(m * chosen.log_softmax(-1)).sum(-1)
        q = (chosen.softmax(-1) * qnet.support).sum(-1).detach()
        priority = per_sample.detach()
    elif cfg.distributional == "qr":
        y = _bootstrap(mb, next_chosen, cfg.gamma).detach()
        per_sample = quantile_huber_loss(chosen, y, cfg.kappa)
        q = chosen.mean(-1).detach()
        priority = per_sample.detach()
    else:
        y = _bootstrap(mb, next_chosen.squeeze(-1), cfg.gamma)
        q_pred = chosen.squeeze(-1)
        if cfg.loss == "huber":
            per_sample = F.smooth_l1_loss(q_pred, y, reduction="none")
        else:
            per_sample = F.mse_loss(q_pred, y, reduction="none")
        q = q_pred.detach()
        priority = (q_pred - y).detach().abs()
    loss = per_sample.mean() if weights is None else (weights * per_sample).mean()
    stats = {"loss/q": loss.detach(), "dqn/q_mean": q.mean()}
    if weights is not None:
        stats["priority"] = priority
    return loss, stats


def _step(
    module: nn.Module,
    optimizer: torch.optim.Optimizer,
    loss: torch.Tensor,
    max_grad_norm: float,
    name: str,
    extra: torch.Tensor | None,
) -> list[float]:
    """Backward, then ``clip_and_step`` (one host read: norm, loss and ``extra``); returns what it read."""
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    return clip_and_step(module, optimizer, max_grad_norm, loss, extra=extra, name=name)


def replay_q_state(algo: Any) -> dict[str, Any]:
    """The state every replay Q-learner keeps (DQN, IQN, FQF, branching DQN): online and target networks,
    optimizer, replay buffer (with its sampler), update counter, epsilon, and pending n-step windows when it has
    an ``nstep`` accumulator."""
    state = {
        "q": algo.qnet.state_dict(),
        "q_target": algo.target.state_dict(),
        "optimizer": algo.optimizer.state_dict(),
        "buffer": algo.buffer.state_dict(),
        "num_updates": algo.num_updates,
        "epsilon": algo.policy.epsilon,
    }
    if getattr(algo, "nstep", None) is not None:
        state["nstep"] = algo.nstep.state_dict()
    return state


def load_replay_q_state(algo: Any, state: dict[str, Any]) -> None:
    """Restore what ``replay_q_state`` returned into ``algo``."""
    algo.qnet.load_state_dict(state["q"])
    algo.target.load_state_dict(state["q_target"])
    algo.optimizer.load_state_dict(state["optimizer"])
    algo.buffer.load_state_dict(state["buffer"])
    algo.num_updates = int(state["num_updates"])
    algo.policy.epsilon = float(state["epsilon"])
    if getattr(algo, "nstep", None) is not None:
        algo.nstep.load_state_dict(state["nstep"])


class DQN(Algorithm):
    """DQN and its family: stores each collected batch in replay (as n-step transitions when ``n_step > 1``,
    prioritized when ``prioritized``), then takes ``gradient_steps`` steps on ``cfg``'s head."""

    def __init__(self, qnet: QNetwork, config: DQNConfig | None = None, seed: int = 0) -> None:
        self.config = cfg = config or DQNConfig()
        if (cfg.distributional, cfg.dueling, cfg.noisy) != (qnet.distributional, qnet.dueling, qnet.noisy):
            raise ValueError(
                f"the Q-network (distributional={qnet.distributional!r}, dueling={qnet.dueling}, noisy={qnet.noisy}) "
                f"does not match the config ({cfg.distributional!r}, {cfg.dueling}, {cfg.noisy}); build it with "
                "QNetwork.for_env"
            )
        self.qnet = qnet
        self.target = copy.deepcopy(qnet).requires_grad_(False)
        self.policy = EpsilonGreedy(qnet, cfg.eps_start)
        self.optimizer = adam(qnet.parameters(), lr=cfg.lr)
        device = next(qnet.parameters()).device
        self.buffer: ReplayBuffer | PrioritizedReplayBuffer
        if cfg.prioritized:
            self.buffer = PrioritizedReplayBuffer(
                cfg.buffer_size, cfg.priority_alpha, cfg.priority_eps, seed=seed, device=device
            )
        else:
            self.buffer = ReplayBuffer(cfg.buffer_size, seed=seed, device=device)
        self.nstep = NStepAccumulator(cfg.n_step, cfg.gamma) if cfg.n_step > 1 else None
        self.beta = cfg.priority_beta_start
        self.num_updates = 0
        self.noise_generator = torch.Generator().manual_seed(seed + 1) if cfg.noisy else None
        if self.noise_generator is not None:
            self.qnet.reset_noise(self.noise_generator)
            self.target.reset_noise(self.noise_generator)

    def set_progress(self, step: int, total_steps: int) -> None:
        """Decay epsilon linearly over the first ``eps_fraction`` of training; anneal the importance-weight
        exponent beta linearly from ``priority_beta_start`` to 1 over all of it."""
        cfg = self.config
        progress = step / max(cfg.eps_fraction * total_steps, 1)
        self.policy.epsilon = linear_schedule(cfg.eps_start, cfg.eps_end, progress)
        self.beta = linear_schedule(cfg.priority_beta_start, 1.0, step / max(total_steps, 1))

    def update(self, batch: Batch) -> dict[str, float]:
        """Store ``batch``; once ``learning_starts`` transitions are stored, take ``gradient_steps`` steps.

        Each step has one host read (``clip_and_step``): with prioritized replay the new priorities are read in it
        too, so updating the sum-tree costs no extra synchronisation."""
        cfg = self.config
        if self.nstep is None:
            self.buffer.extend(batch.select(*_REPLAY_KEYS))
        else:
            self.buffer.extend(self.nstep.push(batch.select(*NSTEP_KEYS)))
        metrics: dict[str, float] = {"dqn/epsilon": self.policy.epsilon, "dqn/lr": cfg.lr}
        if cfg.prioritized:
            metrics["dqn/beta"] = self.beta
        if len(self.buffer) < cfg.learning_starts or len(self.buffer) == 0:
            return metrics
        for group in self.optimizer.param_groups:
            group["lr"] = cfg.lr
        history = []
        for _ in range(cfg.gradient_steps):
            if self.noise_generator is not None:  # fresh noise for every step, online and target
                self.qnet.reset_noise(self.noise_generator)
                self.target.reset_noise(self.noise_generator)
            if isinstance(self.buffer, PrioritizedReplayBuffer):
                mb, index, weights = self.buffer.sample(cfg.batch_size, self.beta)
                loss, stats = dqn_loss(self.qnet, self.target, mb, cfg, weights)
                priority = stats.pop("priority")
            else:
                loss, stats = dqn_loss(self.qnet, self.target, self.buffer.sample(cfg.batch_size), cfg)
                priority = None
            values = _step(self.qnet, self.optimizer, loss, cfg.max_grad_norm, "td loss", priority)
            if priority is not None:
                self.buffer.update_priorities(index, values[2:])
            self.num_updates += 1
            if self.num_updates % cfg.target_update_every == 0:
                self._update_target()
            history.append(stats)
        metrics.update({k: float(torch.stack([h[k] for h in history]).mean()) for k in history[0]})
        return metrics

    @torch.no_grad()
    def _update_target(self) -> None:
        if self.config.tau >= 1.0:
            self.target.load_state_dict(self.qnet.state_dict())
            return
        for t, p in zip(self.target.parameters(), self.qnet.parameters(), strict=False):
            t.lerp_(p, self.config.tau)

    def networks(self) -> dict[str, nn.Module]:
        """Online and target Q-networks."""
        return {"q": self.qnet, "q_target": self.target}

    def state_dict(self) -> dict[str, Any]:
        """Networks, optimizer, replay buffer (priorities and sampler included), pending n-step windows, update
        counter, epsilon and beta."""
        state = replay_q_state(self)
        if self.config.prioritized:
            state["beta"] = self.beta
        if self.noise_generator is not None:
            state["noise_rng"] = self.noise_generator.get_state()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned."""
        load_replay_q_state(self, state)
        if self.config.prioritized:
            self.beta = float(state["beta"])
        if self.noise_generator is not None:
            self.noise_generator.set_state(state["noise_rng"])


def build_dqn(config: DQNConfig, envs: Any, model: Any, device: torch.device, seed: int) -> DQN:
    """DQN with a ``QNetwork`` sized from ``envs``' spaces (images get the Nature CNN) and shaped by ``model`` and
    the config's head options; ``seed`` seeds the replay."""
    qnet = QNetwork.for_env(
        envs,
        hidden=tuple(model.hidden),
        activation=model.activation,
        dueling=config.dueling,
        distributional=config.distributional,
        atoms=config.atoms,
        v_min=config.v_min,
        v_max=config.v_max,
        noisy=config.noisy,
        noisy_sigma=config.noisy_sigma,
    )
    return DQN(qnet.to(device), config, seed=seed)
