"""The configs of the multi-agent algorithms (IPPO, MAPPO) on PettingZoo envs; torch-free like every config."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from pickaxe.config_keys import ranged, validate


@dataclass
class IPPOConfig:
    """Independent PPO on a PettingZoo env: every agent learns PPO's clipped surrogate with GAE on its own
    observation, actor and critic (shared parameters with the agent's one-hot id, or one network per agent); agents
    absent from a step are masked out of the loss."""

    multiagent: ClassVar[bool] = True
    """Marks a multi-agent algorithm: it trains on a PettingZoo env id, and no other algorithm does."""
    central_critic: ClassVar[bool] = False
    """Whether the critic reads the env's global state (``state()``) instead of the agent's observation."""
    continuous_actions: ClassVar[bool] = True
    """Whether it takes Box actions (a Gaussian actor) as well as Discrete ones."""
    mutable: ClassVar[tuple[str, ...]] = (
        "lr", "clip", "ent_coef", "vf_coef", "max_grad_norm", "target_kl", "epochs", "minibatch_size",
    )  # fmt: skip
    """Fields read afresh at every update, so ``pickaxe set`` may change them while the run trains."""

    lr: float = ranged(7e-4, gt=0, le=10)
    lr_schedule: Literal["constant", "linear"] = "constant"
    gamma: float = ranged(0.99, ge=0, le=1)
    gae_lambda: float = ranged(0.95, ge=0, le=1)
    clip: float = ranged(0.2, gt=0, le=10)
    value_clip: float | None = ranged(0.2, gt=0)
    """Clip the value update around the old value by this much (None: no value clipping)."""
    vf_coef: float = ranged(0.5, ge=0)
    ent_coef: float = ranged(0.01, ge=0)
    epochs: int = ranged(10, ge=1, le=10_000)
    minibatch_size: int = ranged(1024, ge=1)
    """Agent-steps per minibatch (rows of present agents; absent ones are not rows)."""
    max_grad_norm: float = ranged(10.0, gt=0)
    normalize_advantage: bool = True
    """Normalise advantages over each minibatch's rows."""
    target_kl: float | None = ranged(None, gt=0)
    """Stop the epochs of an update early once the approximate KL exceeds this."""
    adam_eps: float = ranged(1e-5, gt=0)
    shared: bool = True
    """One actor and one critic for every agent (parameter sharing); False: one of each per agent."""
    agent_id: bool = True
    """With shared parameters, append the agent's one-hot id to the actor's and critic's inputs."""

    def __post_init__(self) -> None:
        validate(self)


@dataclass
class MAPPOConfig(IPPOConfig):
    """Multi-agent PPO (Yu et al. 2022): IPPO with a centralised critic that reads the env's global state
    (``state()``), the agent's one-hot id appended when parameters are shared; actors act on their own
    observations."""

    central_critic: ClassVar[bool] = True
    summary: ClassVar[str] = (
        "Multi-agent PPO: IPPO with a centralised critic on the env's global state (Yu et al. 2022); actors act on "
        "their own observations"
    )
    """The one-line summary ``pickaxe algos`` shows."""


def is_multiagent(algo: object) -> bool:
    """Whether ``algo`` (a config) configures a multi-agent algorithm, one that trains on a PettingZoo env."""
    return bool(getattr(type(algo), "multiagent", False))


def takes_box_actions(algo: object) -> bool:
    """Whether ``algo`` (a multi-agent config) takes Box actions as well as Discrete ones."""
    return bool(getattr(type(algo), "continuous_actions", False))


def needs_state(algo: object) -> bool:
    """Whether ``algo``'s critic reads the env's global state."""
    return bool(getattr(type(algo), "central_critic", False))


@dataclass
class IDQNConfig:
    """Independent DQN for discrete cooperative games: every agent learns double-DQN Q-values on its own
    observation from a replay of present agent-steps (absent agents store nothing), with a target network and
    epsilon-greedy exploration; shared parameters with the agent's one-hot id, or one Q-network per agent."""

    multiagent: ClassVar[bool] = True
    """Marks a multi-agent algorithm (see ``IPPOConfig``)."""
    central_critic: ClassVar[bool] = False
    continuous_actions: ClassVar[bool] = False
    """Q-values over a Discrete action set: Box actions are refused."""
    mutable: ClassVar[tuple[str, ...]] = ("lr", "gradient_steps", "max_grad_norm")
    """Fields read afresh at every update, so ``pickaxe set`` may change them while the run trains."""

    lr: float = ranged(1e-3, gt=0, le=10)
    gamma: float = ranged(0.99, ge=0, le=1)
    buffer_size: int = ranged(50_000, ge=1)
    """Agent-steps the replay holds."""
    batch_size: int = ranged(256, ge=1)
    learning_starts: int = ranged(1_000, ge=0)
    """Agent-steps in the replay before the first gradient step."""
    gradient_steps: int = ranged(8, ge=1, le=10_000)
    """Gradient steps per collect."""
    target_update_every: int = ranged(200, ge=1)
    """Gradient steps between copies of the online network into the target network."""
    double: bool = True
    eps_start: float = ranged(1.0, ge=0, le=1)
    eps_end: float = ranged(0.05, ge=0, le=1)
    eps_fraction: float = ranged(0.3, gt=0, le=1)
    """Fraction of the run over which epsilon falls linearly from eps_start to eps_end."""
    max_grad_norm: float = ranged(10.0, gt=0)
    shared: bool = True
    """One Q-network for every agent (parameter sharing); False: one per agent."""
    agent_id: bool = True
    """With shared parameters, append the agent's one-hot id to the Q-network's input."""

    def __post_init__(self) -> None:
        validate(self)
