"""Configs of the offline algorithms: behaviour cloning, TD3+BC, IQL, CQL, discrete BCQ and CRR. Torch-free like
every config.

Offline runs learn from a dataset (``--data.dataset DIR``) instead of env steps: the Trainer's ``collector.steps``
transitions per iteration come from the dataset sampler, and each algorithm cuts them into minibatches of
``batch_size``, one gradient step each; ``trainer.total_steps`` counts transitions sampled, so a run takes
``total_steps / batch_size`` gradient steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from pickaxe.config_keys import ranged, validate
from pickaxe.errors import ConfigError

OFFLINE_MUTABLE = ("lr", "critic_lr", "max_grad_norm")
"""What every offline config lets ``pickaxe set`` change while a run trains."""


@dataclass
class NormalizeObs:
    """The observation normalisation every offline algorithm's config has (a base of each)."""

    normalize_obs: bool = False
    """Feed every network (actor and critics, next observations in the targets too) ``(obs - mean) / (std + 1e-3)``
    with the mean and std of the whole dataset's observations (TD3+BC's normalisation, Fujimoto & Gu 2021), computed
    once in float64 before training and never updated; they are buffers of the networks, so the weights file, the
    checkpoints and every later use of the weights (eval, acting, collect, FQE, a warm start) carry them."""


@dataclass
class ScaledRewards(NormalizeObs):
    """The reward scaling every offline algorithm with a critic has (a base of each config but behaviour cloning's)."""

    reward_scale: Literal["none", "return-range"] = "none"
    """``return-range``: multiply every reward of the training targets by ``1000 / (max - min)`` of the dataset's
    episode returns (IQL's reference code on locomotion datasets: Kostrikov's implicit_q_learning, CORL), computed
    once from the dataset's episodes before training and kept with the algorithm's state (a resume and an online
    continuation use the same number). Evaluation returns stay in the env's units. ``none``: the rewards as
    stored."""


@dataclass
class BCConfig(NormalizeObs):
    """Behaviour cloning: maximum likelihood of the dataset's actions (a categorical policy on Discrete actions, a
    Gaussian with a tanh mean and a learned state-independent std on Box actions), or on Box actions a deterministic
    actor fitted by the squared error (``box_loss mse``)."""

    offline: ClassVar[bool] = True
    mutable: ClassVar[tuple[str, ...]] = ("lr", "max_grad_norm")
    """Fields read afresh at every update, so ``pickaxe set`` may change them while the run trains."""

    lr: float = ranged(1e-3, gt=0, le=10)
    batch_size: int = ranged(256, ge=1)
    """Transitions per gradient step (``collector.steps`` must be a multiple)."""
    max_grad_norm: float | None = ranged(None, gt=0)
    """Clip the gradient norm (None: no clipping)."""
    box_loss: Literal["likelihood", "mse"] = "likelihood"
    """Box actions: ``likelihood``, a Gaussian policy (tanh mean, learned std) by maximum likelihood; ``mse``, a
    deterministic tanh actor by the mean squared error to the dataset's action (TD3+BC's BC term alone: the BC
    baseline of the TD3+BC paper and CORL, and Tianshou's BC on Box actions). Discrete actions: likelihood only."""

    def __post_init__(self) -> None:
        validate(self)


@dataclass
class TD3BCConfig(ScaledRewards):
    """TD3+BC (Fujimoto & Gu 2021): TD3 whose actor loss adds a behaviour-cloning term, ``-lambda Q(s, pi(s)) +
    (pi(s) - a)^2`` with ``lambda = alpha / mean|Q|``; Box actions."""

    offline: ClassVar[bool] = True
    mutable: ClassVar[tuple[str, ...]] = OFFLINE_MUTABLE
    """Fields read afresh at every update, so ``pickaxe set`` may change them while the run trains."""

    lr: float = ranged(3e-4, gt=0, le=10)
    """Learning rate of the actor."""
    critic_lr: float | None = ranged(None, gt=0, le=10)
    """Learning rate of the critics (None: ``lr``)."""
    gamma: float = ranged(0.99, ge=0, le=1)
    tau: float = ranged(0.005, gt=0, le=1)
    """Polyak rate of the target actor and critics, applied at every actor update."""
    batch_size: int = ranged(256, ge=1)
    """Transitions per gradient step (``collector.steps`` must be a multiple)."""
    policy_delay: int = ranged(2, ge=1, le=1_000)
    target_noise: float = ranged(0.2, ge=0, le=10)
    target_noise_clip: float = ranged(0.5, ge=0, le=10)
    alpha: float = ranged(2.5, ge=0, le=1e6)
    """Weight of the Q term against the behaviour-cloning term (the paper's 2.5; 0 is pure BC)."""
    max_grad_norm: float | None = ranged(None, gt=0)

    def __post_init__(self) -> None:
        validate(self)


@dataclass
class IQLConfig(ScaledRewards):
    """Implicit Q-learning (Kostrikov et al. 2021): a state value fitted to an upper expectile of the target Q, Q
    fitted to ``r + gamma V(s')`` (never querying unseen actions) and the policy extracted by advantage-weighted
    regression; Box and Discrete actions."""

    summary: ClassVar[str] = (
        "Implicit Q-learning (Kostrikov 2021): V fits an upper expectile of Q, Q fits r + gamma V(s'), the policy is "
        "advantage-weighted regression; Box and Discrete actions"
    )
    offline: ClassVar[bool] = True
    mutable: ClassVar[tuple[str, ...]] = OFFLINE_MUTABLE
    """Fields read afresh at every update, so ``pickaxe set`` may change them while the run trains."""

    lr: float = ranged(3e-4, gt=0, le=10)
    """Learning rate of the policy and the value."""
    critic_lr: float | None = ranged(None, gt=0, le=10)
    """Learning rate of the Q critics (None: ``lr``)."""
    gamma: float = ranged(0.99, ge=0, le=1)
    tau: float = ranged(0.005, gt=0, le=1)
    """Polyak rate of the target critics."""
    batch_size: int = ranged(256, ge=1)
    """Transitions per gradient step (``collector.steps`` must be a multiple)."""
    expectile: float = ranged(0.7, gt=0, lt=1)
    """The expectile of Q that V fits (0.5: the mean, i.e. SARSA; towards 1: the max over the data's actions)."""
    beta: float = ranged(3.0, ge=0, le=1e4)
    """Inverse temperature of the advantage weights ``exp(beta * A)`` (0: behaviour cloning)."""
    max_weight: float = ranged(100.0, gt=0, le=1e9)
    """Advantage weights are clipped to this."""
    actor_lr_schedule: Literal["constant", "cosine"] = "constant"
    """``cosine``: the policy's learning rate at gradient step ``k`` of the run's ``N`` (``trainer.total_steps /
    batch_size``) is ``lr * 0.5 * (1 + cos(pi k / N))``, IQL's reference schedule (``optax.cosine_decay_schedule``,
    CORL's ``CosineAnnealingLR``); the value and the critics keep theirs."""
    max_grad_norm: float | None = ranged(None, gt=0)

    def __post_init__(self) -> None:
        validate(self)


@dataclass
class CQLConfig(ScaledRewards):
    """Conservative Q-learning (Kumar et al. 2020): a penalty ``logsumexp_a Q(s, a) - Q(s, a_data)`` that pushes
    down the values of actions the data does not take. Box actions: on SAC (CQL(H), the log-sum-exp estimated from
    uniform and policy samples); Discrete: on DQN."""

    summary: ClassVar[str] = (
        "Conservative Q-learning (Kumar 2020): the critic loss adds logsumexp_a Q(s, a) - Q(s, a_data); on SAC for Box "
        "actions, on DQN for Discrete ones"
    )
    offline: ClassVar[bool] = True
    mutable: ClassVar[tuple[str, ...]] = (*OFFLINE_MUTABLE, "cql_alpha")
    """Fields read afresh at every update, so ``pickaxe set`` may change them while the run trains."""

    lr: float = ranged(3e-4, gt=0, le=10)
    """Learning rate of the actor and the temperature (Box), of the Q-network (Discrete)."""
    critic_lr: float | None = ranged(None, gt=0, le=10)
    """Learning rate of the critics on Box actions (None: ``lr``)."""
    gamma: float = ranged(0.99, ge=0, le=1)
    tau: float = ranged(0.005, gt=0, le=1)
    """Polyak rate of the target critics (Q-network)."""
    batch_size: int = ranged(256, ge=1)
    """Transitions per gradient step (``collector.steps`` must be a multiple)."""
    cql_alpha: float = ranged(1.0, ge=0, le=1e6)
    """Weight of the conservative penalty (0: plain SAC / DQN on the dataset)."""
    action_samples: int = ranged(10, ge=1, le=1_000)
    """Box actions: uniform and policy samples per state for the log-sum-exp estimate."""
    alpha: float | Literal["auto"] = "auto"
    """Box actions: SAC's entropy temperature (``auto``: learned towards ``-|A|``)."""
    alpha_init: float = ranged(1.0, gt=0, le=1e6)
    log_std_min: float = ranged(-5.0, ge=-20, le=0)
    log_std_max: float = ranged(2.0, ge=0, le=20)
    max_grad_norm: float | None = ranged(None, gt=0)

    def __post_init__(self) -> None:
        validate(self)
        if self.alpha != "auto" and not (isinstance(self.alpha, int | float) and 0 < self.alpha < 1e6):
            raise ConfigError(f"algo.alpha must be 'auto' or a number > 0, got {self.alpha!r}")


@dataclass
class BCQConfig(ScaledRewards):
    """Discrete BCQ (Fujimoto et al. 2019, "Benchmarking batch deep RL algorithms"): a Q-network and a
    behaviour-cloning head; actions whose cloned probability, relative to the most probable action's, is below
    ``threshold`` are left out of the argmax, in the TD target and when acting. Discrete actions."""

    summary: ClassVar[str] = (
        "Discrete BCQ (Fujimoto 2019): DQN whose argmax (target and acting) skips actions the behaviour-cloning head "
        "deems unlikely (probability / max probability < threshold); Discrete actions"
    )
    offline: ClassVar[bool] = True
    mutable: ClassVar[tuple[str, ...]] = ("lr", "max_grad_norm", "threshold")
    """Fields read afresh at every update, so ``pickaxe set`` may change them while the run trains."""

    lr: float = ranged(3e-4, gt=0, le=10)
    """Learning rate of the Q-network and the behaviour-cloning head."""
    gamma: float = ranged(0.99, ge=0, le=1)
    tau: float = ranged(0.005, gt=0, le=1)
    """Polyak rate of the target Q-network."""
    batch_size: int = ranged(256, ge=1)
    """Transitions per gradient step (``collector.steps`` must be a multiple)."""
    threshold: float = ranged(0.3, ge=0, le=1)
    """Actions with ``pi_bc(a|s) / max_a' pi_bc(a'|s)`` below this are filtered out (0: DQN; 1: only the most
    probable action, i.e. behaviour cloning)."""
    imitation_penalty: float = ranged(0.01, ge=0, le=1e6)
    """Weight of the squared logits of the behaviour-cloning head (the paper's regulariser)."""
    max_grad_norm: float | None = ranged(None, gt=0)

    def __post_init__(self) -> None:
        validate(self)


@dataclass
class CRRConfig(ScaledRewards):
    """Critic-regularised regression (Wang et al. 2020): a critic fitted by TD to ``r + gamma E_{a'~pi} Q'(s', a')``
    and the policy by behaviour cloning weighted by ``f(A)``, ``A(s, a) = Q(s, a) - V(s)`` with ``V`` the mean or the
    max of ``Q(s, .)`` over the policy's actions; ``f`` is ``exp(A / beta)`` (clipped) or ``1[A > 0]``. Box and
    Discrete actions."""

    summary: ClassVar[str] = (
        "Critic-regularised regression (Wang 2020): behaviour cloning weighted by exp(A / beta) or 1[A > 0], the "
        "advantage against the mean or max of Q over the policy's actions; Box and Discrete actions"
    )
    offline: ClassVar[bool] = True
    mutable: ClassVar[tuple[str, ...]] = OFFLINE_MUTABLE
    """Fields read afresh at every update, so ``pickaxe set`` may change them while the run trains."""

    lr: float = ranged(3e-4, gt=0, le=10)
    """Learning rate of the policy."""
    critic_lr: float | None = ranged(None, gt=0, le=10)
    """Learning rate of the critics (None: ``lr``)."""
    gamma: float = ranged(0.99, ge=0, le=1)
    tau: float = ranged(0.005, gt=0, le=1)
    """Polyak rate of the target critics."""
    batch_size: int = ranged(256, ge=1)
    """Transitions per gradient step (``collector.steps`` must be a multiple)."""
    weight: Literal["exp", "binary"] = "exp"
    """``exp``: ``min(exp(A / beta), max_weight)``; ``binary``: ``1[A > 0]``."""
    advantage: Literal["mean", "max"] = "mean"
    """``V(s)``: the mean (``mean``) or the max (``max``) of ``Q(s, a)`` over the policy's actions (Discrete: all
    actions, the mean weighted by the policy's probabilities; Box: ``action_samples`` sampled actions)."""
    beta: float = ranged(1.0, gt=0, le=1e6)
    """Temperature of the ``exp`` weights."""
    max_weight: float = ranged(20.0, gt=0, le=1e9)
    """``exp`` weights are clipped to this."""
    action_samples: int = ranged(4, ge=1, le=1_000)
    """Box actions: policy samples per state for ``V(s)``."""
    max_grad_norm: float | None = ranged(None, gt=0)

    def __post_init__(self) -> None:
        validate(self)


ONLINE_MUTABLE = ("gradient_steps", "exploration_epsilon")
"""What the online continuations add to their offline algorithm's live-changeable fields."""


@dataclass
class IQLOnlineConfig(IQLConfig):
    """IQL trained online (the IQL paper's fine-tuning, Kostrikov et al. 2021, Sec. 5.3): the same losses on minibatches
    of a replay buffer that the collector fills, usually started from an offline IQL run (``--warm-start.run``) with
    the replay seeded from its dataset. Acts by sampling its policy."""

    summary: ClassVar[str] = (
        "IQL trained online from a replay buffer (offline-to-online fine-tuning: --warm-start.run an iql run); Box and "
        "Discrete actions"
    )
    offline: ClassVar[bool] = False
    mutable: ClassVar[tuple[str, ...]] = (*OFFLINE_MUTABLE, *ONLINE_MUTABLE)
    """Fields read afresh at every update, so ``pickaxe set`` may change them while the run trains."""

    normalize_obs: bool = False
    """Observations pass through the frozen dataset statistics of the offline run that ``--warm-start.run``
    continues: set from that run's config (never computed online); without a warm start it must stay false."""
    reward_scale: Literal["none", "return-range"] = "none"
    """The offline run's reward scaling, continued (its scale comes with its training state, so the replay's rewards
    are scaled as the dataset's were): set from that run's config; without a warm start it must stay ``none``."""
    buffer_size: int = ranged(1_000_000, ge=1)
    """Replay capacity (the offline dataset and the online steps together; the oldest are overwritten)."""
    learning_starts: int = ranged(0, ge=0)
    """No gradient step until the replay holds this many transitions (a seeded replay usually holds more)."""
    gradient_steps: int = ranged(1, ge=1, le=10_000)
    """Gradient steps per collected batch."""
    exploration_epsilon: float = ranged(0.0, ge=0, le=1)
    """Discrete actions: a uniformly random action with this probability on top of the sampled policy."""

    def __post_init__(self) -> None:
        validate(self)
        if self.actor_lr_schedule != "constant":
            raise ConfigError(
                "algo.actor_lr_schedule: iql-online keeps the policy's learning rate constant (the cosine decay is "
                "the offline run's); drop --algo.actor-lr-schedule"
            )


@dataclass
class CQLOnlineConfig(CQLConfig):
    """CQL trained online, conservative penalty kept (the CQL fine-tuning of Nakamoto et al. 2023, "Cal-QL"): CQL's
    losses on minibatches of a replay buffer that the collector fills, usually started from an offline CQL run
    (``--warm-start.run``) with the replay seeded from its dataset; ``cql_alpha 0`` makes it SAC (Box) or DQN
    (Discrete) from the CQL weights. Acts by sampling its policy (Box) or epsilon-greedily (Discrete)."""

    summary: ClassVar[str] = (
        "CQL trained online from a replay buffer, penalty kept (offline-to-online fine-tuning: --warm-start.run a cql "
        "run); on SAC for Box actions, on DQN for Discrete ones"
    )
    offline: ClassVar[bool] = False
    mutable: ClassVar[tuple[str, ...]] = (*OFFLINE_MUTABLE, "cql_alpha", *ONLINE_MUTABLE)
    """Fields read afresh at every update, so ``pickaxe set`` may change them while the run trains."""

    normalize_obs: bool = False
    """Observations pass through the frozen dataset statistics of the offline run that ``--warm-start.run``
    continues: set from that run's config (never computed online); without a warm start it must stay false."""
    reward_scale: Literal["none", "return-range"] = "none"
    """The offline run's reward scaling, continued (its scale comes with its training state, so the replay's rewards
    are scaled as the dataset's were): set from that run's config; without a warm start it must stay ``none``."""
    buffer_size: int = ranged(1_000_000, ge=1)
    """Replay capacity (the offline dataset and the online steps together; the oldest are overwritten)."""
    learning_starts: int = ranged(0, ge=0)
    """No gradient step until the replay holds this many transitions (a seeded replay usually holds more)."""
    gradient_steps: int = ranged(1, ge=1, le=10_000)
    """Gradient steps per collected batch."""
    exploration_epsilon: float = ranged(0.05, ge=0, le=1)
    """Discrete actions: a uniformly random action with this probability instead of the greedy one."""


OFFLINE_CONFIGS = (BCConfig, TD3BCConfig, IQLConfig, CQLConfig, BCQConfig, CRRConfig)
"""Every offline algorithm's config type (an ``offline`` class attribute marks each)."""


def is_offline(algo: object) -> bool:
    """Whether ``algo`` (a config) configures an offline algorithm, one that learns from ``--data.dataset``."""
    return bool(getattr(type(algo), "offline", False))
