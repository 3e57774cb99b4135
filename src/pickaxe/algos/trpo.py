"""Natural policy gradient and TRPO on PPO's actor-critic, GAE and normalisations.

The policy step is the natural gradient ``F^-1 g``: ``g`` the gradient of the surrogate ``mean(ratio * A)``, ``F``
the Fisher matrix, never formed: :func:`conjugate_gradient` solves ``(F + damping I) x = g`` from Fisher-vector
products (the Hessian of the sampled KL(old || new) times a vector, :func:`fisher_vector_product`). The step is
scaled so that its quadratic KL ``0.5 s^T F s`` is ``max_kl`` (:func:`natural_step`); NPG takes it as it is, TRPO
backtracks from it until the sampled KL is within ``max_kl`` and the surrogate improves
(:func:`backtracking_line_search`). The critic is fitted by Adam on the GAE returns after the policy step.

Each piece is a pure function tested against a direct solve on a small explicit matrix.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from pickaxe.algos.base import clip_and_step
from pickaxe.algos.core import adam, explained_variance, normalize
from pickaxe.algos.extra_configs import NPGConfig, TRPOConfig
from pickaxe.algos.ppo import PPO, actor_critic, compute_targets, normalized
from pickaxe.algos.reinforce import critic_of
from pickaxe.data.batch import Batch
from pickaxe.errors import ConfigError, NonFiniteError


# ------------------------------------------------------------------------------------------------------ pure maths
def flat_grad(
    output: torch.Tensor, params: Sequence[torch.Tensor], create_graph: bool = False, retain_graph: bool | None = None
) -> torch.Tensor:
    """The gradient of scalar ``output`` with respect to ``params``, flattened into one vector (zeros for a
    parameter ``output`` does not depend on)."""
    grads = torch.autograd.grad(
        output, list(params), create_graph=create_graph, retain_graph=retain_graph, allow_unused=True
    )
    flat = [(torch.zeros_like(p) if g is None else g).reshape(-1) for g, p in zip(grads, params, strict=True)]
    return torch.cat(flat)


def conjugate_gradient(
    matvec: Callable[[torch.Tensor], torch.Tensor], b: torch.Tensor, iters: int, residual_tol: float = 1e-10
) -> torch.Tensor:
    """Approximately solve ``A x = b`` for a symmetric positive-definite ``A`` given only ``matvec(v) = A v``, by
    ``iters`` conjugate-gradient iterations from ``x = 0`` (exact after ``dim`` iterations in exact arithmetic).

    Once the squared residual falls to ``residual_tol`` the iterate stops moving; the test is made on the device
    (no host read), so the loop always runs ``iters`` products."""
    x = torch.zeros_like(b)
    r = b.clone()
    p = b.clone()
    rr = r @ r
    for _ in range(iters):
        ap = matvec(p)
        done = rr <= residual_tol
        alpha = torch.where(done, torch.zeros_like(rr), rr / torch.where(done, torch.ones_like(rr), p @ ap))
        x = x + alpha * p
        r = r - alpha * ap
        rr_new = r @ r
        beta = torch.where(done, torch.zeros_like(rr), rr_new / torch.where(done, torch.ones_like(rr), rr))
        p = r + beta * p
        rr = rr_new
    return x


def natural_step(
    g: torch.Tensor, fvp: Callable[[torch.Tensor], torch.Tensor], max_kl: float, cg_iters: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The natural-gradient step of size ``max_kl``: ``s = sqrt(2 max_kl / (x^T F x)) x`` with ``x`` the
    conjugate-gradient solution of ``F x = g`` (``fvp(v) = F v``, damping included), so that the quadratic KL
    ``0.5 s^T F s`` equals ``max_kl``. Returns ``(s, g^T s)``, the step and the surrogate's linear improvement."""
    x = conjugate_gradient(fvp, g, cg_iters)
    xfx = (x @ fvp(x)).clamp_min(1e-12)
    step = torch.sqrt(2.0 * max_kl / xfx) * x
    return step, g @ step


def backtracking_line_search(
    evaluate: Callable[[float], tuple[float, float]],
    expected_improve: float,
    max_kl: float,
    backtrack_coef: float = 0.8,
    max_backtracks: int = 10,
    accept_ratio: float = 0.0,
) -> tuple[float, int]:
    """TRPO's line search along a full step: ``evaluate(frac)`` puts the parameters at ``old + frac * step`` and
    returns ``(surrogate improvement, sampled KL(old || new))``. Tries ``frac = backtrack_coef^k`` for ``k = 0 ...
    max_backtracks`` and accepts the first whose KL is at most ``max_kl`` and whose improvement is positive and at
    least ``accept_ratio * frac * expected_improve``. Returns ``(accepted frac, steps tried)``, frac 0.0 when none
    was accepted (the caller restores the old parameters)."""
    frac = 1.0
    for k in range(max_backtracks + 1):
        improve, kl = evaluate(frac)
        if (
            math.isfinite(improve)
            and math.isfinite(kl)
            and kl <= max_kl
            and improve > 0
            and improve >= accept_ratio * frac * expected_improve
        ):
            return frac, k + 1
        frac *= backtrack_coef
    return 0.0, max_backtracks + 1


def kl_divergence(
    kind: str, old: dict[str, torch.Tensor], new: dict[str, torch.Tensor], nvec: Sequence[int] = ()
) -> torch.Tensor:
    """Per-row KL(old || new) of two action distributions of an ``ActorCritic`` (``kind``: its action space's name;
    ``old`` / ``new`` as :func:`action_distribution` gives them), summed over the action's dimensions: ``[B]``."""
    out_old, out_new = old["out"], new["out"]
    if kind == "Discrete":
        logp_old, logp_new = out_old.log_softmax(-1), out_new.log_softmax(-1)
        return (logp_old.exp() * (logp_old - logp_new)).sum(-1)
    if kind == "Box":
        ls_old, ls_new = old["log_std"], new["log_std"]
        var_old, var_new = (2 * ls_old).exp(), (2 * ls_new).exp()
        return (ls_new - ls_old + (var_old + (out_old - out_new).pow(2)) / (2 * var_new) - 0.5).sum(-1)
    if kind == "MultiDiscrete":
        parts = zip(out_old.split(list(nvec), -1), out_new.split(list(nvec), -1), strict=True)
        return sum(kl_divergence("Discrete", {"out": a}, {"out": b}) for a, b in parts)
    # MultiBinary: independent Bernoullis with logits out
    p = torch.sigmoid(out_old)
    return (
        p * (F.logsigmoid(out_old) - F.logsigmoid(out_new))
        + (1 - p) * (F.logsigmoid(-out_old) - F.logsigmoid(-out_new))
    ).sum(-1)


def action_distribution(policy: nn.Module, obs: torch.Tensor) -> dict[str, torch.Tensor]:
    """The parameters of an ``ActorCritic``'s action distribution at ``obs`` (through its observation normaliser
    when it has one): ``out`` (logits or means) and, for Box actions, ``log_std`` broadcast to the rows."""
    inner = getattr(policy, "inner", policy)
    norm = getattr(policy, "obs_norm", None)
    x = inner.features(norm(obs) if norm is not None else obs)
    out = inner.actor(x)
    dist = {"out": out}
    if inner.kind == "Box":
        dist["log_std"] = inner.log_std.expand_as(out)
    return dist


def fisher_vector_product(
    kl: torch.Tensor, params: Sequence[torch.Tensor], damping: float
) -> Callable[[torch.Tensor], torch.Tensor]:
    """``v -> (F + damping I) v`` with ``F`` the Hessian of the mean sampled ``kl`` (KL(old || new), 0 at the current
    parameters) with respect to ``params``, by double backpropagation (``F`` is never formed)."""
    grad_kl = flat_grad(kl, params, create_graph=True)

    def fvp(v: torch.Tensor) -> torch.Tensor:
        return flat_grad(grad_kl @ v.detach(), params, retain_graph=True) + damping * v

    return fvp


# -------------------------------------------------------------------------------------------------- the algorithms
class NPG(PPO):
    """Natural policy gradient: GAE over each rollout, one natural-gradient step of the actor of KL size
    ``max_kl``, then ``critic_epochs`` passes of Adam on the critic. Shares PPO's observation and reward
    normalisation and checkpoint state (the optimizer in it is the critic's)."""

    supports_data_parallel = False
    loss_name = "value loss"
    prefix = "npg"

    def __init__(self, policy: nn.Module, config: NPGConfig | None = None) -> None:
        super().__init__(policy, config or NPGConfig())
        critic = {id(p) for p in critic_of(policy).parameters()}
        self.actor_params = [p for p in policy.parameters() if id(p) not in critic]

    def _optimizer(self) -> torch.optim.Optimizer:
        return adam(critic_of(self.policy).parameters(), lr=self.config.critic_lr)

    def update(self, batch: Batch) -> dict[str, float]:
        """GAE on the ``[T, N]`` rollout, the actor's natural step, then the critic's Adam passes."""
        cfg = self.config
        self._scale_rewards(batch)
        data = compute_targets(self.policy, self.rollout, batch)
        metrics = self._policy_step(data)
        for group in self.optimizer.param_groups:
            group["lr"] = cfg.critic_lr
        losses = []
        for _ in range(cfg.critic_epochs):
            for mb in self.rollout.minibatches(cfg.minibatch_size):
                loss = F.mse_loss(self.policy.value(mb["obs"]), mb["return"])
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                losses.append(clip_and_step(self.policy, self.optimizer, cfg.max_grad_norm, loss, name="value loss")[1])
        metrics["loss/value"] = sum(losses) / len(losses)
        metrics[f"{self.prefix}/explained_variance"] = explained_variance(data["value"], data["return"])
        self._update_obs_stats(batch)
        return metrics

    def _policy_step(self, data: Batch) -> dict[str, float]:
        """The actor's step on the flattened rollout ``data``; its metrics."""
        cfg = self.config
        obs, action = data["obs"], data["action"]
        advantage = normalize(data["advantage"]) if cfg.normalize_advantage else data["advantage"]
        params = self.actor_params
        with torch.no_grad():
            old = {k: v.detach() for k, v in action_distribution(self.policy, obs).items()}
            old_logprob = self.policy.evaluate_actions(obs, action)[0]

        def surrogate() -> torch.Tensor:
            logprob = self.policy.evaluate_actions(obs, action)[0]
            return ((logprob - old_logprob).exp() * advantage).mean()

        def mean_kl(rows: slice = slice(None)) -> torch.Tensor:
            new = action_distribution(self.policy, obs[rows])
            return kl_divergence(self.kind, {k: v[rows] for k, v in old.items()}, new, self.nvec).mean()

        before = surrogate()
        g = flat_grad(before, params)
        every = max(1, round(1 / cfg.fisher_fraction))
        fvp = fisher_vector_product(mean_kl(slice(None, None, every)), params, cfg.damping)
        step, expected = natural_step(g, fvp, cfg.max_kl, cfg.cg_iters)
        norm, expected_f, before_f = torch.stack([step.norm(), expected, before.detach()]).tolist()  # one host read
        if not (math.isfinite(norm) and math.isfinite(expected_f)):
            raise NonFiniteError(f"{self.prefix} policy step (norm {norm}, expected improvement {expected_f})")
        old_params = torch.cat([p.detach().reshape(-1) for p in params])
        frac, tries = self._move(old_params, step, expected_f, before_f, surrogate, mean_kl)
        with torch.no_grad():
            after, kl = surrogate(), mean_kl()
        after_f, kl_f = torch.stack([after, kl]).tolist()
        return {
            f"{self.prefix}/kl": kl_f,
            f"{self.prefix}/improvement": after_f - before_f,
            f"{self.prefix}/expected_improvement": expected_f,
            f"{self.prefix}/step_norm": norm * frac,
            f"{self.prefix}/step_fraction": frac,
            f"{self.prefix}/line_search_tries": float(tries),
        }

    def _move(
        self,
        old_params: torch.Tensor,
        step: torch.Tensor,
        expected: float,
        before: float,
        surrogate: Callable[[], torch.Tensor],
        mean_kl: Callable[[], torch.Tensor],
    ) -> tuple[float, int]:
        """Put the actor at ``old_params + step`` (NPG: the whole step, one try); returns ``(fraction, tries)``."""
        set_flat(self.actor_params, old_params + step)
        return 1.0, 1

    @property
    def kind(self) -> str:
        """The action space's name (``ActorCritic.kind``)."""
        return getattr(self.policy, "inner", self.policy).kind

    @property
    def nvec(self) -> list[int]:
        """MultiDiscrete: the size of each action dimension (else empty)."""
        return list(getattr(getattr(self.policy, "inner", self.policy), "nvec", []))


class TRPO(NPG):
    """TRPO: NPG's step, then a backtracking line search on the sampled KL and the surrogate
    (:func:`backtracking_line_search`); no accepted step leaves the actor as it was."""

    prefix = "trpo"

    def __init__(self, policy: nn.Module, config: TRPOConfig | None = None) -> None:
        super().__init__(policy, config or TRPOConfig())

    def _move(
        self,
        old_params: torch.Tensor,
        step: torch.Tensor,
        expected: float,
        before: float,
        surrogate: Callable[[], torch.Tensor],
        mean_kl: Callable[[], torch.Tensor],
    ) -> tuple[float, int]:
        """Backtrack from the full step; restore ``old_params`` when no step is accepted."""
        cfg = self.config

        def evaluate(frac: float) -> tuple[float, float]:
            set_flat(self.actor_params, old_params + frac * step)
            with torch.no_grad():
                after, kl = torch.stack([surrogate(), mean_kl()]).tolist()
            return after - before, kl

        frac, tries = backtracking_line_search(
            evaluate, expected, cfg.max_kl, cfg.backtrack_coef, cfg.max_backtracks, cfg.accept_ratio
        )
        set_flat(self.actor_params, old_params + frac * step)
        return frac, tries


@torch.no_grad()
def set_flat(params: Sequence[torch.Tensor], flat: torch.Tensor) -> None:
    """Copy the vector ``flat`` into ``params`` in place (in order, each its own number of elements)."""
    offset = 0
    for p in params:
        p.copy_(flat[offset : offset + p.numel()].view_as(p))
        offset += p.numel()


def _actor_critic(config: Any, envs: Any, model: Any, device: torch.device) -> nn.Module:
    if getattr(model, "shared", False):
        raise ConfigError(
            "npg/trpo step the actor by a natural gradient and the critic by Adam: they need separate networks; "
            "use --model.shared False"
        )
    return normalized(actor_critic(envs, model), envs, config).to(device)


def build_npg(config: NPGConfig, envs: Any, model: Any, device: torch.device, seed: int) -> NPG:
    """NPG with an ``ActorCritic`` (separate actor and critic) sized from ``envs``' spaces and shaped by ``model``,
    behind an observation normaliser when ``config.normalize_obs``."""
    return NPG(_actor_critic(config, envs, model, device), config)


def build_trpo(config: TRPOConfig, envs: Any, model: Any, device: torch.device, seed: int) -> TRPO:
    """TRPO with an ``ActorCritic`` (separate actor and critic) sized from ``envs``' spaces and shaped by
    ``model``, behind an observation normaliser when ``config.normalize_obs``."""
    return TRPO(_actor_critic(config, envs, model, device), config)
