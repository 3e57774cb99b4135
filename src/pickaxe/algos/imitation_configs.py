"""The config of GAIL (generative adversarial imitation learning), torch-free like every config.

GAIL learns from the env, like PPO, but never from its rewards: a discriminator trained alongside PPO tells the
demonstrations' ``(s, a)`` pairs (``--data.dataset DIR``, a Minari dataset) from the policy's, and its verdict is the
reward PPO maximises. The env's own return is still logged (``rollout/return_mean``, ``eval/return_mean``) to judge
the imitation by.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from pickaxe.algos.configs import PPOConfig
from pickaxe.config_keys import ranged

GAILReward = Literal["gail", "airl"]
"""The discriminator's reward: ``gail`` is ``-log(1 - D(s, a))`` (Ho & Ermon 2016: positive, so it also rewards
living on), ``airl`` is ``log D - log(1 - D)``, the discriminator's logit (Fu et al. 2018's form: no sign bias)."""


@dataclass
class GAILConfig(PPOConfig):
    """GAIL (Ho & Ermon 2016): PPO on the reward of a discriminator trained alongside it to tell the demonstrations'
    (s, a) pairs (--data.dataset) from the policy's; the env's rewards are logged, never learned from. Discrete or Box
    actions."""

    summary: ClassVar[str] = (
        "GAIL (Ho & Ermon 2016): imitation from demonstrations (--data.dataset) with env interaction; PPO on the "
        "reward of a discriminator of expert vs policy (s, a); Discrete and Box actions"
    )
    demonstrations: ClassVar[bool] = True
    """Needs ``--data.dataset`` although it learns from the env (see :func:`uses_demonstrations`)."""
    mutable: ClassVar[tuple[str, ...]] = (*PPOConfig.mutable, "disc_lr", "disc_steps", "grad_penalty")
    """Fields read afresh at every update, so ``pickaxe set`` may change them while the run trains."""

    disc_lr: float = ranged(3e-4, gt=0, le=10)
    """Learning rate of the discriminator (Adam)."""
    disc_steps: int = ranged(4, ge=0, le=10_000)
    """Discriminator gradient steps per PPO update, each on ``disc_batch_size`` demonstration pairs and as many of
    the rollout's (0: the discriminator stays as initialised)."""
    disc_batch_size: int = ranged(256, ge=1)
    """Demonstration pairs (and as many policy pairs) per discriminator step."""
    disc_hidden: int = ranged(64, ge=1, le=65_536)
    """Width of the discriminator's two hidden layers (tanh)."""
    grad_penalty: float = ranged(0.0, ge=0, le=1e6)
    """Weight of the gradient penalty ``(||grad_x logit(x)|| - 1)^2`` at random mixes of demonstration and policy
    inputs (Gulrajani et al. 2017's form), added to the discriminator's loss (0: plain GAIL)."""
    reward: GAILReward = "gail"
    """``gail``: ``-log(1 - D)``; ``airl``: ``log D - log(1 - D)``."""
    absorbing: bool = False
    """Treat episode ends (terminations; truncations still bootstrap) as steps into an absorbing state that the
    discriminator also judges (Kostrikov et al. 2019): the demonstrations' and the rollout's terminations each add an
    absorbing row to the discriminator's data, and a terminated step's reward gains ``gamma * r_abs / (1 - gamma)``,
    the discounted reward of staying absorbed forever. Removes the reward forms' built-in bias about ending episodes
    (``gail`` rewards living on, ``airl`` can reward dying early)."""


def uses_demonstrations(algo: object) -> bool:
    """Whether ``algo`` (a config) configures an online algorithm that imitates ``--data.dataset`` (GAIL)."""
    return bool(getattr(type(algo), "demonstrations", False))
