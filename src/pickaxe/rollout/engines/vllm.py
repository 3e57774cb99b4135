"""``VLLMEngine``: the ``Engine`` interface on vLLM (GPU only, optional extra ``pip install 'pickaxe[vllm]'``).

vLLM is imported when the engine is built, never at pickaxe import time. Its sampler runs in the model's dtype
with its own kernels, so its log-probs differ slightly from the learner's: enable GRPO's ``tis_cap`` (truncated
importance sampling) when training from vLLM rollouts, and watch ``check/logprob_diff_max``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from pickaxe.errors import PickaxeError
from pickaxe.rollout.engines.base import Completion, SamplingParams


class EngineUnavailable(PickaxeError):
    """An engine whose optional dependency (or hardware) is missing."""


def _import_vllm() -> Any:
    try:
        import vllm
    except ImportError:
        raise EngineUnavailable(
            "the vllm engine needs vLLM and a CUDA GPU: pip install 'pickaxe[vllm]' (or pip install vllm), "
            "or use --engine.name hf"
        ) from None
    return vllm


class VLLMEngine:
    """Generation with a ``vllm.LLM`` loaded from a local model folder; weights are pushed from the learner
    in ``sync_weights`` (in-process, same GPU)."""

    def __init__(
        self,
        model_path: str,
        eos_token_id: int,
        seed: int = 0,
        gpu_memory_utilization: float = 0.4,
        dtype: str = "auto",
    ) -> None:
        import torch

        vllm = _import_vllm()
        if not torch.cuda.is_available():
            raise EngineUnavailable("the vllm engine runs only on a CUDA GPU; use --engine.name hf on this machine")
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # keep the model in this process for syncs
        self._vllm = vllm
        kwargs: dict[str, Any] = dict(
            model=model_path, seed=seed, gpu_memory_utilization=gpu_memory_utilization, dtype=dtype
        )
        try:  # log-probs of the distribution actually sampled from (after temperature/top-k/top-p)
            self.llm = vllm.LLM(**kwargs, logprobs_mode="processed_logprobs")
        except TypeError:  # older vLLM: raw log-probs only; GRPO's tis_cap absorbs the difference
            self.llm = vllm.LLM(**kwargs)
        self.eos_token_id = int(eos_token_id)
        self.seed = seed
        self.version = 0
        self._calls = 0

    def sync_weights(self, policy: nn.Module, version: int) -> None:
        """Load ``policy``'s current weights into the vLLM model (same process, same GPU)."""
        self.load_weights(policy.state_dict(), version)

    def load_weights(self, state: Mapping[str, torch.Tensor], version: int) -> None:
        """Load a state dict (names of the ``transformers`` model; an engine worker gets it from the learner's
        publish, on CPU) into the vLLM model and tag it ``version``. Not yet run on a GPU inside a Ray worker."""
        self._worker_model().load_weights((name, t.detach()) for name, t in state.items())
        if hasattr(self.llm, "reset_prefix_cache"):
            self.llm.reset_prefix_cache()  # cached prefixes were computed with the old weights
        self.version = version

    def state_dict(self) -> dict[str, Any]:
        """The sampling state: each ``generate`` call seeds vLLM with ``seed`` and the call count."""
        return {"calls": self._calls, "version": self.version}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned."""
        self._calls, self.version = int(state["calls"]), int(state["version"])

    def _worker_model(self) -> Any:
        paths = (
            "model_executor.driver_worker.model_runner.model",  # vLLM V0
            "model_executor.driver_worker.worker.model_runner.model",  # vLLM V1 in-process
        )
        for path in paths:
            obj: Any = self.llm.llm_engine
            try:
                for attr in path.split("."):
                    obj = getattr(obj, attr)
            except AttributeError:
                continue
            return obj
        raise EngineUnavailable(
            "cannot reach the vLLM model to load weights in-process; this vLLM version is not supported "
            "(set VLLM_ENABLE_V1_MULTIPROCESSING=0, or use --engine.name hf)"
        )

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Completion]:
        """Complete each prompt ``params.n`` times; log-probs are vLLM's, of the processed distribution."""
        vllm = self._vllm
        self._calls += 1
        sp = vllm.SamplingParams(
            n=params.n,
            max_tokens=params.max_new_tokens,
            temperature=params.temperature,
            top_k=params.top_k if params.top_k > 0 else -1,
            top_p=params.top_p,
            logprobs=0,
            stop_token_ids=[self.eos_token_id],
            seed=self.seed * 1_000_003 + self._calls,
        )
        inputs = [{"prompt_token_ids": list(p)} for p in prompts]
        outputs = self.llm.generate(inputs, sp, use_tqdm=False)
        completions: list[Completion] = []
        for i, request in enumerate(outputs):
            for seq in request.outputs:
                ids = list(seq.token_ids)
                logps = [float(step[tok].logprob) for tok, step in zip(ids, seq.logprobs or [], strict=False)]
                completions.append(
                    Completion(prompt_index=i, token_ids=ids, logprobs=logps, finished=seq.finish_reason == "stop")
                )
        return completions
