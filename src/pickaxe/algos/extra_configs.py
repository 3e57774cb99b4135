"""Configs of the rest of the classic algorithm list: REINFORCE, NPG and TRPO (on-policy), REDQ (off-policy
continuous control), IQN and FQF (distributional DQN with sampled or proposed quantile fractions) and branching DQN
(MultiDiscrete actions).

Torch-free like every config (``pickaxe recipes``, ``pickaxe set`` and ``config.json`` never import torch); each
field declares its valid range next to it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from pickaxe.algos.control_configs import SACConfig
from pickaxe.config_keys import ranged, validate
from pickaxe.errors import ConfigError


@dataclass
class ReinforceConfig:
    """REINFORCE (Williams 1992): the policy gradient of Monte-Carlo returns, one gradient step per rollout, with or
    without a learned state-value baseline."""

    mutable: ClassVar[tuple[str, ...]] = ("lr", "ent_coef", "vf_coef", "max_grad_norm")
    """Fields read afresh at every update, so ``pickaxe set`` may change them while the run trains."""

    lr: float = ranged(1e-3, gt=0, le=10)
    lr_schedule: Literal["constant", "linear"] = "constant"
    gamma: float = ranged(0.99, ge=0, le=1)
    baseline: bool = True
    """Subtract a learned V(s) from the return (trained by ``vf_coef * mean((V - G)^2)`` in the same step); it also
    bootstraps the return of an episode cut by truncation or by the end of the rollout. False: plain REINFORCE,
    whose returns stop there (no value is learned)."""
    vf_coef: float = ranged(0.5, ge=0)
    ent_coef: float = ranged(0.0, ge=0)
    max_grad_norm: float = ranged(0.5, gt=0)
    normalize_advantage: bool = True
    """Scale the returns (or advantages) of each rollout to mean 0, std 1 (Tianshou's ``reward_normalization``)."""
    adam_eps: float = ranged(1e-5, gt=0)
    normalize_obs: bool = False
    """Normalise observations by their running mean and std (updated once per collect, kept in the model)."""
    obs_clip: float = ranged(10.0, gt=0)
    normalize_reward: bool = False
    """Scale rewards by the running std of the discounted return; logged returns stay raw."""
    reward_clip: float = ranged(10.0, gt=0)

    @property
    def gae_lambda(self) -> float:
        """Monte-Carlo returns: GAE with lambda 1."""
        return 1.0

    def __post_init__(self) -> None:
        validate(self)


@dataclass
class NPGConfig:
    """Natural policy gradient (Kakade 2001): GAE advantages, the policy stepped along F^-1 g (conjugate gradient on
    Fisher-vector products of the KL) by the step whose quadratic KL is ``max_kl``; the critic by Adam."""

    mutable: ClassVar[tuple[str, ...]] = ("max_kl", "critic_lr", "critic_epochs", "damping")
    """Fields read afresh at every update, so ``pickaxe set`` may change them while the run trains."""

    max_kl: float = ranged(0.01, gt=0, le=10)
    """Trust region: the policy step is scaled so that its quadratic estimate of KL(old || new) equals this."""
    gamma: float = ranged(0.99, ge=0, le=1)
    gae_lambda: float = ranged(0.95, ge=0, le=1)
    cg_iters: int = ranged(10, ge=1, le=1_000)
    """Conjugate-gradient iterations solving F x = g."""
    damping: float = ranged(0.1, ge=0)
    """Added to the Fisher matrix (F + damping I) so the solve stays well conditioned."""
    fisher_fraction: float = ranged(1.0, gt=0, le=1)
    """Share of the rollout's rows the Fisher-vector products are computed on (every k-th row)."""
    critic_lr: float = ranged(1e-3, gt=0, le=10)
    critic_epochs: int = ranged(5, ge=1, le=10_000)
    """Passes of Adam over the rollout's shuffled minibatches for the value function, after the policy step."""
    minibatch_size: int = ranged(256, ge=1)
    """Rows per critic minibatch."""
    max_grad_norm: float = ranged(0.5, gt=0)
    """Gradient-norm clip of the critic's steps."""
    normalize_advantage: bool = True
    normalize_obs: bool = False
    """Normalise observations by their running mean and std (updated once per collect, kept in the model)."""
    obs_clip: float = ranged(10.0, gt=0)
    normalize_reward: bool = False
    """Scale rewards by the running std of the discounted return; logged returns stay raw."""
    reward_clip: float = ranged(10.0, gt=0)

    def __post_init__(self) -> None:
        validate(self)


@dataclass
class TRPOConfig(NPGConfig):
    """Trust Region Policy Optimization (Schulman 2015): NPG's direction, then a backtracking line search that
    accepts the first step whose sampled KL(old || new) is within ``max_kl`` and whose surrogate improves."""

    mutable: ClassVar[tuple[str, ...]] = (
        "max_kl", "critic_lr", "critic_epochs", "damping", "backtrack_coef", "max_backtracks",
    )  # fmt: skip
    """Fields read afresh at every update, so ``pickaxe set`` may change them while the run trains."""

    backtrack_coef: float = ranged(0.8, gt=0, lt=1)
    """Each backtrack multiplies the step by this."""
    max_backtracks: int = ranged(10, ge=0, le=1_000)
    """Steps tried after the full one; when none is accepted the policy is left as it was."""
    accept_ratio: float = ranged(0.0, ge=0, le=1)
    """Accept a step only if its surrogate improvement is at least this fraction of the linear prediction (0: any
    improvement)."""


@dataclass
class REDQConfig(SACConfig):
    """Randomized Ensembled Double Q-learning (Chen 2021): SAC with ``ensemble_size`` critics, each target the min
    over a random ``subset_size`` of the target critics, the actor on their mean, a high update-to-data ratio."""

    mutable: ClassVar[tuple[str, ...]] = (
        "lr", "critic_lr", "gradient_steps", "batch_size", "tau", "max_grad_norm", "actor_delay",
    )  # fmt: skip
    """Fields read afresh at every update, so ``pickaxe set`` may change them while the run trains."""

    ensemble_size: int = ranged(10, ge=2, le=1_000)
    """Critics in the ensemble (N)."""
    subset_size: int = ranged(2, ge=1, le=1_000)
    """Target critics drawn (without replacement, per gradient step) for the min of the target (M)."""
    actor_delay: int = ranged(20, ge=1, le=10_000)
    """Critic steps per actor (and temperature) step; REDQ's paper steps the actor once per G critic steps."""
    gradient_steps: int = ranged(20, ge=1, le=10_000)
    """Gradient steps per collected batch: the update-to-data ratio is this over ``collector.steps`` (G = 20 with
    one env step per collect in the paper)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.subset_size > self.ensemble_size:
            raise ConfigError(
                f"algo.subset_size ({self.subset_size}) must be at most algo.ensemble_size ({self.ensemble_size}): "
                f"use --algo.subset-size {self.ensemble_size} or a larger ensemble"
            )


@dataclass
class IQNConfig:
    """Implicit Quantile Networks (Dabney 2018): quantile values at fractions tau ~ U(0, 1) from a cosine embedding
    of tau, trained by the quantile Huber loss against sampled target quantiles; acts on the mean of ``act_taus``."""

    mutable: ClassVar[tuple[str, ...]] = (
        "lr", "gradient_steps", "batch_size", "target_update_every", "max_grad_norm", "eps_end",
    )  # fmt: skip
    """Fields read afresh at every update, so ``pickaxe set`` may change them while the run trains."""

    lr: float = ranged(1e-3, gt=0, le=10)
    gamma: float = ranged(0.99, ge=0, le=1)
    buffer_size: int = ranged(100_000, ge=1)
    batch_size: int = ranged(64, ge=1)
    learning_starts: int = ranged(1_000, ge=0)
    """Env steps stored before the first gradient step."""
    gradient_steps: int = ranged(1, ge=1, le=10_000)
    """Gradient steps per collected batch."""
    target_update_every: int = ranged(500, ge=1)
    """Gradient steps between target-network copies."""
    double: bool = True
    """The online network picks the next action, the target network's quantiles score it."""
    eps_start: float = ranged(1.0, ge=0, le=1)
    eps_end: float = ranged(0.05, ge=0, le=1)
    eps_fraction: float = ranged(0.1, gt=0, le=1)
    """Fraction of the total env steps over which epsilon decays linearly."""
    max_grad_norm: float = ranged(10.0, gt=0)
    n_step: int = ranged(1, ge=1, le=1_000)
    """Rewards summed per stored transition (per env, across collects); the window stops at an episode end."""
    kappa: float = ranged(1.0, gt=0)
    """Huber threshold of the quantile loss."""
    taus: int = ranged(8, ge=1, le=10_000)
    """Fractions sampled per state for the online quantiles (N)."""
    target_taus: int = ranged(8, ge=1, le=10_000)
    """Fractions sampled per next state for the target quantiles (N')."""
    act_taus: int = ranged(32, ge=1, le=10_000)
    """Fractions whose quantiles are averaged into Q when acting (K); evaluation uses the fixed midpoints
    ``(k + 0.5) / K``, so it is a function of the weights alone."""
    embedding_dim: int = ranged(64, ge=1, le=4_096)
    """Cosines ``cos(pi i tau)``, ``i < embedding_dim``, in the fraction embedding."""

    def __post_init__(self) -> None:
        validate(self)


@dataclass
class FQFConfig(IQNConfig):
    """Fully parameterized Quantile Function (Yang 2019): IQN's quantile network evaluated at N fractions that a
    fraction-proposal layer chooses per state, trained to minimise the 1-Wasserstein error of the resulting staircase;
    Q is the fraction-weighted sum of the quantiles. The proposals replace IQN's sampled fractions: ``taus``,
    ``target_taus`` and ``act_taus`` are not used."""

    fractions: int = ranged(32, ge=2, le=10_000)
    """Fractions proposed per state (N); the online and target quantiles are taken at their midpoints."""
    fraction_lr: float = ranged(2.5e-5, gt=0, le=10)
    """Learning rate of the fraction-proposal layer (its own Adam parameter group; much smaller than ``lr``: the
    reference implementations' Atari setting is 2.5e-9 with RMSProp, where the fractions barely move)."""
    fraction_ent_coef: float = ranged(0.0, ge=0)
    """Weight of the entropy bonus on the proposed fractions' widths (the paper's Atari runs use 0.001)."""


@dataclass
class BranchingDQNConfig:
    """Branching dueling Q-network (Tavakoli 2018) for MultiDiscrete actions: a shared torso and state value, one
    advantage head per action dimension, each dimension's TD target the mean over dimensions of the target
    network's value of the online network's greedy sub-actions."""

    mutable: ClassVar[tuple[str, ...]] = (
        "lr", "gradient_steps", "batch_size", "target_update_every", "max_grad_norm", "eps_end",
    )  # fmt: skip
    """Fields read afresh at every update, so ``pickaxe set`` may change them while the run trains."""

    lr: float = ranged(1e-3, gt=0, le=10)
    gamma: float = ranged(0.99, ge=0, le=1)
    buffer_size: int = ranged(100_000, ge=1)
    batch_size: int = ranged(64, ge=1)
    learning_starts: int = ranged(1_000, ge=0)
    """Env steps stored before the first gradient step."""
    gradient_steps: int = ranged(1, ge=1, le=10_000)
    """Gradient steps per collected batch."""
    target_update_every: int = ranged(500, ge=1)
    """Gradient steps between target-network copies."""
    eps_start: float = ranged(1.0, ge=0, le=1)
    eps_end: float = ranged(0.05, ge=0, le=1)
    eps_fraction: float = ranged(0.1, gt=0, le=1)
    """Fraction of the total env steps over which epsilon decays linearly (each dimension explores on its own)."""
    max_grad_norm: float = ranged(10.0, gt=0)
    target: Literal["mean", "max", "independent"] = "mean"
    """How the dimensions' next values make the TD target: their mean (the paper's choice), their max, or each
    dimension its own (independent)."""

    def __post_init__(self) -> None:
        validate(self)
