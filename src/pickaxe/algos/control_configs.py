"""Configs of the off-policy continuous-control algorithms: SAC (continuous and discrete actions), TD3 and DDPG.

Torch-free like every config (``pickaxe recipes``, ``pickaxe set`` and ``config.json`` never import torch); each
field declares its valid range next to it.

Update-to-data ratio: the Trainer collects ``collector.steps`` env steps (all envs together) and then calls
``update``, which takes ``gradient_steps`` gradient steps, so a run makes ``gradient_steps / collector.steps``
gradient steps per env step (SB3's ``train_freq=1, gradient_steps=1`` is ``collector.steps = num_envs = 1``,
``gradient_steps = 1``).

Goal envs: ``her`` (``future``, ``final``, ``episode``) replaces the uniform replay with hindsight experience replay,
``her_k`` relabelled goals per transition.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from pickaxe.config_keys import ranged, validate
from pickaxe.errors import ConfigError


@dataclass
class SACConfig:
    """Soft Actor-Critic with twin critics and automatic entropy tuning (Haarnoja 2018), discrete SAC on Discrete
    actions (Christodoulou 2019: exact expectations over the actions)."""

    mutable: ClassVar[tuple[str, ...]] = (
        "lr", "critic_lr", "gradient_steps", "batch_size", "tau", "max_grad_norm",
    )  # fmt: skip
    """Fields read afresh at every update, so ``pickaxe set`` may change them while the run trains."""

    lr: float = ranged(3e-4, gt=0, le=10)
    """Learning rate of the actor and the temperature."""
    critic_lr: float | None = ranged(None, gt=0, le=10)
    """Learning rate of the critics (None: ``lr``)."""
    gamma: float = ranged(0.99, ge=0, le=1)
    tau: float = ranged(0.005, gt=0, le=1)
    """Polyak rate of the target critics, applied after every gradient step (1: copy)."""
    buffer_size: int = ranged(1_000_000, ge=1)
    batch_size: int = ranged(256, ge=1)
    learning_starts: int = ranged(1_000, ge=0)
    """Env steps taken with uniformly random actions (from torch's RNG) before the actor acts and learning starts."""
    gradient_steps: int = ranged(1, ge=1, le=10_000)
    """Gradient steps per collected batch (see the module docstring for the update-to-data ratio)."""
    alpha: float | Literal["auto"] = "auto"
    """Entropy temperature: ``auto`` learns it towards ``target_entropy`` (starting at ``alpha_init``), a number
    fixes it."""
    alpha_init: float = ranged(1.0, gt=0, le=1e6)
    """Starting temperature when ``alpha`` is ``auto``."""
    target_entropy: float | None = None
    """Entropy the temperature steers towards (None: ``-|A|`` for Box actions, ``target_entropy_scale * log n``
    for Discrete(n))."""
    target_entropy_scale: float = ranged(0.89, gt=0, le=1)
    """Discrete actions: target entropy as a fraction of the uniform policy's ``log n``. Christodoulou's 0.98 keeps
    the policy nearly uniform, which stalls learning on small action sets; 0.89 is CleanRL's tested value."""
    max_grad_norm: float | None = ranged(None, gt=0)
    """Clip the joint gradient norm of critics, actor and temperature (None: no clipping, as in the paper)."""
    log_std_min: float = ranged(-5.0, ge=-20, le=0)
    log_std_max: float = ranged(2.0, ge=0, le=20)
    her: Literal["none", "future", "final", "episode"] = "none"
    """Hindsight experience replay on a goal env (``pickaxe.data.hindsight``): the relabelling strategy, ``none`` for
    the plain replay. Needs observations with ``observation``, ``achieved_goal`` and ``desired_goal``."""
    her_k: int = ranged(4, ge=1, le=64)
    """Hindsight goals per original transition: ``her_k`` of every ``her_k + 1`` sampled transitions are
    relabelled."""

    def __post_init__(self) -> None:
        validate(self)
        if self.alpha != "auto" and not (isinstance(self.alpha, int | float) and 0 < self.alpha < 1e6):
            raise ConfigError(f"algo.alpha must be 'auto' or a number > 0, got {self.alpha!r}")


@dataclass
class TD3Config:
    """Twin Delayed DDPG (Fujimoto 2018): twin critics, delayed actor and target updates, target policy smoothing;
    noise scales are fractions of the action bounds' half-range (1.0 = the whole half-range)."""

    mutable: ClassVar[tuple[str, ...]] = (
        "lr", "critic_lr", "gradient_steps", "batch_size", "tau", "exploration_noise", "max_grad_norm",
    )  # fmt: skip
    """Fields read afresh at every update, so ``pickaxe set`` may change them while the run trains."""

    lr: float = ranged(1e-3, gt=0, le=10)
    """Learning rate of the actor."""
    critic_lr: float | None = ranged(None, gt=0, le=10)
    """Learning rate of the critics (None: ``lr``)."""
    gamma: float = ranged(0.99, ge=0, le=1)
    tau: float = ranged(0.005, gt=0, le=1)
    """Polyak rate of the target actor and critics, applied at every actor update (1: copy)."""
    buffer_size: int = ranged(1_000_000, ge=1)
    batch_size: int = ranged(256, ge=1)
    learning_starts: int = ranged(1_000, ge=0)
    """Env steps taken with uniformly random actions (from torch's RNG) before the actor acts and learning starts."""
    gradient_steps: int = ranged(1, ge=1, le=10_000)
    """Gradient steps per collected batch (see the module docstring for the update-to-data ratio)."""
    exploration_noise: float = ranged(0.1, ge=0, le=10)
    """Std of the Gaussian added to the actor's action while collecting, relative to the half-range."""
    policy_delay: int = ranged(2, ge=1, le=1_000)
    """Critic steps per actor (and target) step."""
    target_noise: float = ranged(0.2, ge=0, le=10)
    """Std of the target policy smoothing noise, relative to the half-range."""
    target_noise_clip: float = ranged(0.5, ge=0, le=10)
    """The smoothing noise is clipped to +-this (relative to the half-range)."""
    twin: bool = True
    """Two critics and the min of their targets (False: one critic, as DDPG)."""
    max_grad_norm: float | None = ranged(None, gt=0)
    """Clip the joint gradient norm of the critics and actor (None: no clipping)."""
    her: Literal["none", "future", "final", "episode"] = "none"
    """Hindsight experience replay on a goal env (``pickaxe.data.hindsight``): the relabelling strategy, ``none`` for
    the plain replay. Needs observations with ``observation``, ``achieved_goal`` and ``desired_goal``."""
    her_k: int = ranged(4, ge=1, le=64)
    """Hindsight goals per original transition: ``her_k`` of every ``her_k + 1`` sampled transitions are
    relabelled."""
    normalize_obs: bool = False
    """Observations pass through the frozen dataset statistics of the TD3+BC run that ``--warm-start.run`` continues
    (set from that run's config; TD3 computes none itself): without a warm start it must stay false."""

    def __post_init__(self) -> None:
        validate(self)


@dataclass
class DDPGConfig(TD3Config):
    """DDPG in the TD3 paper's form (Lillicrap 2016; Fujimoto 2018): one critic, actor and targets updated at every
    step, no target smoothing, Gaussian exploration noise."""

    policy_delay: int = ranged(1, ge=1, le=1_000)
    target_noise: float = ranged(0.0, ge=0, le=10)
    twin: bool = False
