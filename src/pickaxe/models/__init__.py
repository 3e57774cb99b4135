"""Models: policies and value networks.

Names resolve on first use (PEP 562), so ``pickaxe.models.folders`` (the torch-free checks of model folders and of
the tiny model's shape) imports without torch. The MLP factory is ``pickaxe.models.mlp.mlp`` (``pickaxe.models.mlp``
is its module).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pickaxe.lazy import lazy_getattr

_LAZY = {
    "ActorCritic": "pickaxe.models.actor_critic",
    "EpsilonGreedy": "pickaxe.models.q_network",
    "ObsNormalized": "pickaxe.models.normalize",
    "Policy": "pickaxe.models.policy",
    "QNetwork": "pickaxe.models.q_network",
    "char_tokenizer": "pickaxe.models.tokenizer",
    "load_lm": "pickaxe.models.lm",
    "load_tokenizer": "pickaxe.models.tokenizer",
    "tiny_lm": "pickaxe.models.lm",
}
__all__ = sorted(_LAZY)

if TYPE_CHECKING:
    from pickaxe.models.actor_critic import ActorCritic  # noqa: F401
    from pickaxe.models.lm import load_lm, tiny_lm  # noqa: F401
    from pickaxe.models.normalize import ObsNormalized  # noqa: F401
    from pickaxe.models.policy import Policy  # noqa: F401
    from pickaxe.models.q_network import EpsilonGreedy, QNetwork  # noqa: F401
    from pickaxe.models.tokenizer import char_tokenizer, load_tokenizer  # noqa: F401


__getattr__ = lazy_getattr("pickaxe.models", _LAZY, globals())
