"""Rollout: the Collector that turns a policy and envs into Batches."""

from pickaxe.rollout.collector import Collector

__all__ = ["Collector"]
