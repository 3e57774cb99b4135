"""Rollout: collectors that turn a policy and envs into Batches, and the LLM rollout engines."""

from pickaxe.rollout.collector import Collector
from pickaxe.rollout.engines.base import Engine, SamplingParams
from pickaxe.rollout.engines.hf import HFEngine
from pickaxe.rollout.text_collector import TextCollector

__all__ = ["Collector", "Engine", "HFEngine", "SamplingParams", "TextCollector"]
