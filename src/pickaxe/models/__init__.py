"""Models: policies and value networks."""

from pickaxe.models.actor_critic import ActorCritic
from pickaxe.models.mlp import mlp
from pickaxe.models.policy import Policy
from pickaxe.models.q_network import EpsilonGreedy, QNetwork

__all__ = ["ActorCritic", "EpsilonGreedy", "Policy", "QNetwork", "mlp"]
