"""Models: policies and value networks."""

from pickaxe.models.actor_critic import ActorCritic
from pickaxe.models.lm import load_lm, tiny_lm
from pickaxe.models.mlp import mlp
from pickaxe.models.normalize import ObsNormalized
from pickaxe.models.policy import Policy
from pickaxe.models.q_network import EpsilonGreedy, QNetwork
from pickaxe.models.tokenizer import char_tokenizer, load_tokenizer

__all__ = [
    "ActorCritic",
    "EpsilonGreedy",
    "ObsNormalized",
    "Policy",
    "QNetwork",
    "char_tokenizer",
    "load_lm",
    "load_tokenizer",
    "mlp",
    "tiny_lm",
]
