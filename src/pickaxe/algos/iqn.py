"""Implicit Quantile Networks (Dabney et al. 2018) and the Fully parameterized Quantile Function (Yang et al. 2019)
on the DQN family's pieces: replay (uniform, n-step windows), target network, double-DQN action choice, epsilon
decay, and QR-DQN's quantile Huber loss generalised to any fractions (:func:`quantile_huber_loss_at`).

IQN samples its fractions ``tau ~ U(0, 1)`` (torch's RNG, which the checkpoint restores) for the online quantiles
and, independently, for the target's. FQF's proposal layer chooses ``N`` fractions per state; the online quantiles
are taken at the midpoints of the state's proposals, the target's at those of the next state's, weighted by their
widths in the quantile loss (:func:`fqf_loss`), and the proposal is trained by the gradient of the 1-Wasserstein
error of the staircase they make (:func:`fraction_loss`), in its own Adam parameter group with ``fraction_lr``. Each
gradient step is one backward pass and one host read (``clip_and_step``).
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from pickaxe.algos.base import Algorithm, clip_and_step
from pickaxe.algos.core import linear_schedule
from pickaxe.algos.dqn import discount_of, load_replay_q_state, replay_q_state
from pickaxe.algos.extra_configs import FQFConfig, IQNConfig
from pickaxe.data.batch import Batch
from pickaxe.data.buffers import ReplayBuffer
from pickaxe.data.replay import NSTEP_KEYS, NStepAccumulator
from pickaxe.models.quantile import ImplicitQuantileNetwork, QuantileGreedy

REPLAY_KEYS = ("obs", "action", "reward", "terminated", "next_obs")


# ------------------------------------------------------------------------------------------------------ pure losses
def quantile_huber_loss_at(
    quantiles: torch.Tensor,
    tau: torch.Tensor,
    target: torch.Tensor,
    kappa: float = 1.0,
    target_weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """The quantile Huber loss per sample, ``[B]``, of ``quantiles`` ``[B, N]`` estimated at fractions ``tau``
    ``[B, N]`` (each row its own, e.g. sampled) against ``target`` ``[B, M]`` samples of the target distribution.

    With ``u = target_j - quantiles_i``, each pair costs ``|tau_i - 1{u < 0}| * huber_kappa(u) / kappa``; the loss
    sums over ``i`` and averages over ``j`` (QR-DQN's ``quantile_huber_loss`` is this at ``tau_i = (2i + 1) / 2N``).
    ``target_weights`` ``[B, M]`` (each row summing to 1) replaces that average by a weighted sum: the target is then
    the distribution with mass ``target_weights_j`` at ``target_j`` (FQF's staircase, whose steps have the proposed
    widths), not ``M`` equally likely samples (IQN's, whose fractions are drawn uniformly).
    """
    u = target.unsqueeze(-2) - quantiles.unsqueeze(-1)  # [B, N, M]
    abs_u = u.abs()
    hub = torch.where(abs_u <= kappa, 0.5 * u.pow(2), kappa * (abs_u - 0.5 * kappa))
    rho = (tau.unsqueeze(-1) - (u.detach() < 0).to(u.dtype)).abs() * hub / kappa
    per_target = rho.sum(-2)  # [B, M]
    if target_weights is None:
        return per_target.mean(-1)
    return (per_target * target_weights).sum(-1)


def fraction_loss(z_tau: torch.Tensor, z_hat: torch.Tensor, tau: torch.Tensor) -> torch.Tensor:
    """FQF's fraction-proposal loss per sample, ``[B]``, whose gradient in each inner fraction ``tau_i`` is the
    1-Wasserstein error's: ``dW1/dtau_i = 2 F^-1(tau_i) - F^-1(tau_hat_i) - F^-1(tau_hat_{i-1})``.

    ``z_tau`` ``[B, N - 1]``: the quantiles at the inner fractions ``tau_1 .. tau_{N-1}``; ``z_hat`` ``[B, N]``: at the
    midpoints ``tau_hat_0 .. tau_hat_{N-1}``; ``tau`` ``[B, N + 1]``: the fractions (``tau_0 = 0``, ``tau_N = 1``).
    The quantiles are constants here; the loss is ``sum_i (dW1/dtau_i) tau_i``."""
    grad = 2 * z_tau - z_hat[:, :-1] - z_hat[:, 1:]
    return (grad.detach() * tau[:, 1:-1]).sum(-1)


def _chosen(z: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
    """The quantiles ``[B, N]`` of ``action`` ``[B]`` from ``z`` ``[B, N, actions]``."""
    return z.gather(-1, action.long().view(-1, 1, 1).expand(-1, z.shape[1], 1)).squeeze(-1)


def iqn_loss(
    qnet: ImplicitQuantileNetwork, target: ImplicitQuantileNetwork, mb: Batch, cfg: IQNConfig
) -> tuple[torch.Tensor, torch.Tensor]:
    """IQN's minibatch loss and its stats ``[loss, mean Q]``: quantiles of the taken action at ``taus`` sampled
    fractions against ``r + discount * Z'_tau'(s', a*)`` at ``target_taus`` others, ``a*`` the greedy action of the
    online (``double``) or target network's Q at ``act_taus`` sampled fractions."""
    obs, next_obs = mb["obs"], mb["next_obs"]
    b = obs.shape[0]
    tau = torch.rand(b, cfg.taus, device=obs.device)
    chosen = _chosen(qnet.quantiles(qnet.features(obs), tau), mb["action"])
    with torch.no_grad():
        picker = qnet if cfg.double else target
        next_action = picker.q_values(next_obs, cfg.act_taus, sample=True).argmax(-1)
        tau_next = torch.rand(b, cfg.target_taus, device=obs.device)
        z_next = _chosen(target.quantiles(target.features(next_obs), tau_next), next_action)
        y = mb["reward"].unsqueeze(-1) + discount_of(mb, cfg.gamma).unsqueeze(-1) * z_next
    loss = quantile_huber_loss_at(chosen, tau, y, cfg.kappa).mean()
    return loss, torch.stack([loss.detach(), chosen.detach().mean()])


def fqf_loss(
    qnet: ImplicitQuantileNetwork, target: ImplicitQuantileNetwork, mb: Batch, cfg: FQFConfig
) -> tuple[torch.Tensor, torch.Tensor]:
    """FQF's minibatch loss (quantile loss + fraction loss - ``fraction_ent_coef`` x the widths' entropy; disjoint
    parameters) and its stats ``[quantile loss, fraction loss, mean Q, entropy]``.

    The taken action's quantiles at the midpoints ``tau_hat`` proposed for ``s`` regress on the target staircase
    ``r + discount * Z'_{tau_hat'}(s', a*)``: the target network's quantiles at the midpoints ``tau_hat'`` proposed
    for ``s'`` by the network that picks ``a*`` (the online one when ``double``, else the target), each step weighted
    by its width ``w'``. So the target's mean is ``r + discount * sum_j w'_j Z'_j``, the staircase's own mean (how FQF
    defines Q); averaging the steps equally (Algorithm 1 of the paper) over-weights the narrow ones, and on CartPole
    drove Q past ``1 / (1 - gamma)`` and the runs into divergence once the proposals learned."""
    obs, next_obs = mb["obs"], mb["next_obs"]
    x = qnet.features(obs)
    tau, tau_hat, entropy = qnet.propose(x)
    tau_hat_c = tau_hat.detach()
    z_hat = _chosen(qnet.quantiles(x, tau_hat_c), mb["action"])
    with torch.no_grad():
        picker = qnet if cfg.double else target
        q_next, tau_hat_next, widths_next = picker.proposed_q(picker.features(next_obs))
        next_action = q_next.argmax(-1)
        z_next = _chosen(target.quantiles(target.features(next_obs), tau_hat_next), next_action)
        y = mb["reward"].unsqueeze(-1) + discount_of(mb, cfg.gamma).unsqueeze(-1) * z_next
        z_tau = _chosen(qnet.quantiles(x.detach(), tau[:, 1:-1].detach()), mb["action"])
    q_loss = quantile_huber_loss_at(z_hat, tau_hat_c, y, cfg.kappa, widths_next).mean()
    f_loss = fraction_loss(z_tau, z_hat.detach(), tau).mean()
    ent = entropy.mean()
    total = q_loss + f_loss - cfg.fraction_ent_coef * ent
    q_mean = ((tau[:, 1:] - tau[:, :-1]) * z_hat).sum(-1).mean()
    return total, torch.stack([q_loss, f_loss, q_mean, ent]).detach()


# -------------------------------------------------------------------------------------------------- the algorithm
class IQN(Algorithm):
    """IQN (or FQF, with an ``FQFConfig`` and a network with a proposal layer): stores each collected batch in replay
    (as n-step transitions when ``n_step > 1``), then takes ``gradient_steps`` steps, copying the online network into
    the target every ``target_update_every`` of them."""

    def __init__(self, qnet: ImplicitQuantileNetwork, config: IQNConfig | None = None, seed: int = 0) -> None:
        self.config = cfg = config or IQNConfig()
        self.fqf = isinstance(cfg, FQFConfig)
        if self.fqf != bool(qnet.fractions):
            raise ValueError("FQF needs a quantile network with a proposal layer (fractions > 0), IQN one without")
        self.qnet = qnet
        self.target = copy.deepcopy(qnet).requires_grad_(False)
        self.policy = QuantileGreedy(qnet, cfg.act_taus, cfg.eps_start)
        proposal = list(qnet.proposal.parameters()) if self.fqf else []
        ids = {id(p) for p in proposal}
        groups = [{"params": [p for p in qnet.parameters() if id(p) not in ids], "lr": cfg.lr}]
        if proposal:
            groups.append({"params": proposal, "lr": cfg.fraction_lr})
        self.optimizer = torch.optim.Adam(groups, lr=cfg.lr, fused=True)
        device = next(qnet.parameters()).device
        self.buffer = ReplayBuffer(cfg.buffer_size, seed=seed, device=device)
        self.nstep = NStepAccumulator(cfg.n_step, cfg.gamma) if cfg.n_step > 1 else None
        self.num_updates = 0
        self.prefix = "fqf" if self.fqf else "iqn"

    def set_progress(self, step: int, total_steps: int) -> None:
        """Decay epsilon linearly over the first ``eps_fraction`` of training."""
        cfg = self.config
        self.policy.epsilon = linear_schedule(cfg.eps_start, cfg.eps_end, step / max(cfg.eps_fraction * total_steps, 1))

    def update(self, batch: Batch) -> dict[str, float]:
        """Store ``batch``; once ``learning_starts`` transitions are stored, take ``gradient_steps`` steps."""
        cfg = self.config
        if self.nstep is None:
            self.buffer.extend(batch.select(*REPLAY_KEYS))
        else:
            self.buffer.extend(self.nstep.push(batch.select(*NSTEP_KEYS)))
        metrics: dict[str, float] = {f"{self.prefix}/epsilon": self.policy.epsilon}
        if len(self.buffer) < max(cfg.learning_starts, 1):
            return metrics
        groups = self.optimizer.param_groups
        groups[0]["lr"] = cfg.lr
        totals: torch.Tensor | None = None
        for _ in range(cfg.gradient_steps):
            mb = self.buffer.sample(cfg.batch_size)
            loss, stats = (fqf_loss if self.fqf else iqn_loss)(self.qnet, self.target, mb, cfg)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            values = torch.tensor(
                clip_and_step(
                    self.qnet, self.optimizer, cfg.max_grad_norm, loss, sums=stats, name=f"{self.prefix} loss"
                )
            )
            totals = values if totals is None else totals + values
            self.num_updates += 1
            if self.num_updates % cfg.target_update_every == 0:
                self.target.load_state_dict(self.qnet.state_dict())
        assert totals is not None
        mean = (totals / cfg.gradient_steps).tolist()
        if self.fqf:
            names = ("grad_norm", "loss/total", "loss/quantile", "loss/fraction", "fqf/q_mean", "fqf/fraction_entropy")
        else:
            names = ("grad_norm", "loss/total", "loss/quantile", "iqn/q_mean")
        metrics.update(dict(zip(names, mean, strict=True)))
        del metrics["loss/total"]
        return metrics

    def networks(self) -> dict[str, nn.Module]:
        """Online and target quantile networks."""
        return {"q": self.qnet, "q_target": self.target}

    def state_dict(self) -> dict[str, Any]:
        """Networks, optimizer, replay buffer (with its sampler), pending n-step windows, update counter, epsilon."""
        return replay_q_state(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned."""
        load_replay_q_state(self, state)


def _network(config: IQNConfig, envs: Any, model: Any, fractions: int) -> ImplicitQuantileNetwork:
    return ImplicitQuantileNetwork.for_env(
        envs,
        hidden=tuple(model.hidden),
        activation=model.activation,
        embedding_dim=config.embedding_dim,
        fractions=fractions,
    )


def build_iqn(config: IQNConfig, envs: Any, model: Any, device: torch.device, seed: int) -> IQN:
    """IQN with a quantile network sized from ``envs``' spaces (images get the Nature CNN) and shaped by ``model``;
    ``seed`` seeds the replay."""
    return IQN(_network(config, envs, model, 0).to(device), config, seed=seed)


def build_fqf(config: FQFConfig, envs: Any, model: Any, device: torch.device, seed: int) -> IQN:
    """FQF: IQN's network with a fraction-proposal layer of ``config.fractions`` fractions."""
    return IQN(_network(config, envs, model, config.fractions).to(device), config, seed=seed)
