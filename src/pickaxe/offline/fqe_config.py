"""The settings of fitted Q evaluation (``pickaxe eval RUN --checkpoints ... --fqe --fqe.steps N``); torch-free, so
``pickaxe eval`` parses and checks them before it imports torch."""

from __future__ import annotations

from dataclasses import dataclass

from pickaxe.config_keys import ranged, validate


@dataclass
class FQEConfig:
    """How fitted Q evaluation scores one checkpoint's policy from a dataset: a fresh Q network, ``steps`` gradient
    steps on minibatches of the dataset toward ``r + gamma (1 - terminated) Q'(s', pi(s'))``, then the mean of
    ``Q(s_0, pi(s_0))`` over the dataset's episode starts."""

    steps: int = ranged(2000, ge=1, le=10_000_000)
    """Gradient steps of the fresh Q network, per checkpoint."""
    batch_size: int = ranged(256, ge=1, le=1_000_000)
    """Transitions per gradient step (sampled uniformly, with replacement)."""
    lr: float = ranged(1e-3, gt=0, le=1)
    """Adam's learning rate."""
    gamma: float = ranged(0.99, ge=0, lt=1)
    """Discount of the estimated value (the scale of the estimate: at most max reward / (1 - gamma))."""
    target_every: int = ranged(10, ge=1, le=10_000_000)
    """Gradient steps between copies of the Q network into its target Q' (one fitted-Q iteration each)."""
    hidden: tuple[int, ...] = ranged((64, 64), ge=1, le=65536)
    """Hidden layer sizes of the Q network (relu)."""
    policy: str = ranged("greedy", pattern="greedy|sampled", choices="greedy or sampled")
    """Which policy is scored: greedy (the deterministic action, what evaluation in the env plays) or sampled (the
    policy's stochastic actions: the target averages Q' over action_samples draws per state)."""
    action_samples: int = ranged(16, ge=1, le=1024)
    """Draws of the policy's action per state with --fqe.policy sampled (Discrete: their empirical distribution)."""
    seed: int = ranged(0, ge=0, lt=2**63)
    """Seed of the Q network's initialisation, the minibatches and the sampled actions."""
    dataset: str | None = None
    """The dataset to fit on; default: the run's --data.dataset (and --data.mix)."""

    def __post_init__(self) -> None:
        validate(self, "fqe.")
