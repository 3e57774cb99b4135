"""The config of PPO with an exploration bonus (RND or ICM intrinsic rewards), torch-free like every config."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from pickaxe.algos.configs import PPOConfig
from pickaxe.config_keys import ranged

Intrinsic = Literal["rnd", "icm", "none"]
"""The exploration bonus: random network distillation, the intrinsic curiosity module, or none (plain PPO)."""


@dataclass
class ExplorePPOConfig(PPOConfig):
    """PPO with an intrinsic exploration reward for sparse-reward tasks: RND (a predictor distils a fixed random
    network; intrinsic and extrinsic value heads with their own discounts) or ICM (inverse and forward models in a
    learned feature space). Discrete or Box actions."""

    mutable: ClassVar[tuple[str, ...]] = (*PPOConfig.mutable, "int_coef", "ext_coef", "icm_eta")
    """Fields read afresh at every update, so ``pickaxe set`` may change them while the run trains."""

    intrinsic: Intrinsic = "rnd"
    """rnd: random network distillation; icm: intrinsic curiosity module; none: plain PPO (the same numbers)."""
    gamma: float = ranged(0.999, ge=0, le=1)
    """The extrinsic discount (episodic; the RND paper's 0.999)."""
    explore_hidden: int = ranged(64, ge=1, le=65_536)
    """Width of the two hidden layers of every exploration network (RND's target, predictor and intrinsic critic;
    ICM's encoder, inverse and forward models)."""
    explore_features: int = ranged(64, ge=1, le=65_536)
    """Output size of RND's target and predictor, and of ICM's feature encoder."""
    explore_obs_clip: float = ranged(5.0, gt=0)
    """The exploration networks see observations normalised by their own running statistics, clipped to this."""
    gamma_int: float = ranged(0.99, ge=0, le=1)
    """RND: the intrinsic discount (non-episodic: intrinsic returns run on across episode ends)."""
    int_coef: float = ranged(1.0, ge=0)
    """RND: weight of the intrinsic advantage in the combined advantage (the paper's 1)."""
    ext_coef: float = ranged(2.0, ge=0)
    """RND: weight of the extrinsic advantage in the combined advantage (the paper's 2)."""
    rnd_update_proportion: float = ranged(1.0, gt=0, le=1)
    """RND: the fraction of each minibatch's rows the predictor learns from (the paper's 0.25 with 128 envs; keeps the
    bonus from vanishing too fast when many envs collect)."""
    icm_eta: float = ranged(1.0, ge=0)
    """ICM: the intrinsic reward is ``icm_eta * 0.5 * ||phi_hat(s') - phi(s')||^2``, added to the env's reward (on
    MountainCar-v0 against its -1 per step, 0.01 was too small to matter: docs/exploration.md)."""
    icm_beta: float = ranged(0.2, ge=0, le=1)
    """ICM: module loss = (1 - icm_beta) * inverse loss + icm_beta * forward loss (the paper's 0.2)."""
    icm_coef: float = ranged(1.0, ge=0)
    """ICM: weight of the module loss added to PPO's (the paper weights the policy loss by 0.1 instead: 10 here)."""
