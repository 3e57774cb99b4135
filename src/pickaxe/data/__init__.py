"""Data: the Batch, buffers and return estimators."""

from pickaxe.data.batch import Batch, minibatches
from pickaxe.data.buffers import ReplayBuffer, RolloutBuffer
from pickaxe.data.returns import discounted_returns, gae

__all__ = ["Batch", "ReplayBuffer", "RolloutBuffer", "discounted_returns", "gae", "minibatches"]
