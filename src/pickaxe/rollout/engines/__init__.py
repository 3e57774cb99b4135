"""Rollout engines: ``HFEngine`` (transformers, CPU or GPU) and ``VLLMEngine`` (optional extra, GPU)."""

from pickaxe.rollout.engines.base import Completion, Engine, SamplingParams
from pickaxe.rollout.engines.hf import HFEngine

__all__ = ["Completion", "Engine", "HFEngine", "SamplingParams", "VLLMEngine"]


def __getattr__(name: str):
    if name == "VLLMEngine":  # imported on use: the module itself imports vLLM lazily too
        from pickaxe.rollout.engines.vllm import VLLMEngine

        return VLLMEngine
    raise AttributeError(name)
