"""The engine worker: a Ray actor holding its own rollout engine on its own copy of the policy.

The learner never shares a module with a worker: it publishes each policy version's weights once (one ``ray.put``
of a CPU state dict, see :class:`pickaxe.dist.llm_engines.EngineGroup`) and every request names the version it
must be generated with; the worker swaps weights between ``generate`` calls when the version changes. Requests to
one worker run one at a time in submission order (a plain, single-threaded actor), so its sampler draws the same
numbers in the same order as an engine in the learner's process would.

What has run where: the ``HFEngine`` path on CPU (tests/test_dist_llm.py). The ``VLLMEngine`` path (engine built
inside the actor on a GPU worker, weights loaded through ``VLLMEngine.load_weights``) has only run with a fake
engine class on CPU; nothing here has run on a GPU.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from torch import nn

from pickaxe.rollout.engines.base import Completion, Engine, SamplingParams, load_weights
from pickaxe.utils import set_torch_threads

EngineFactory = Callable[[nn.Module | None, int, str], Engine]
"""Builds a worker's engine from ``(model copy or None, seed, device)``; must be picklable (it travels to Ray)."""


@dataclass(frozen=True)
class HFEngineFactory:
    """An ``HFEngine`` on the worker's copy of the policy (CPU, or the worker's GPU)."""

    eos_token_id: int
    pad_token_id: int
    max_batch: int = 512

    ships_model = True
    """The worker needs a copy of the policy module."""

    def __call__(self, model: nn.Module | None, seed: int, device: str) -> Engine:
        """The engine, seeded with ``seed``."""
        from pickaxe.rollout.engines.hf import HFEngine

        if model is None:
            raise ValueError("HFEngineFactory needs the policy module")
        return HFEngine(model, self.eos_token_id, self.pad_token_id, self.max_batch, seed)


@dataclass(frozen=True)
class VLLMEngineFactory:
    """A ``VLLMEngine`` loaded inside the worker from ``model_path`` (a folder the worker can read: on a cluster,
    shared storage). ``engine_class`` is for tests (a fake with ``VLLMEngine``'s constructor); None: the real one.
    Has not run on a GPU (see the module docstring)."""

    model_path: str
    eos_token_id: int
    gpu_memory_utilization: float = 0.4
    dtype: str = "auto"
    engine_class: Callable[..., Engine] | None = None

    ships_model = False
    """vLLM loads the weights from ``model_path``; the published versions overwrite them."""

    def __call__(self, model: nn.Module | None, seed: int, device: str) -> Engine:
        """The engine, seeded with ``seed`` (``model`` is unused)."""
        cls = self.engine_class
        if cls is None:
            from pickaxe.rollout.engines.vllm import VLLMEngine

            cls = VLLMEngine
        return cls(self.model_path, self.eos_token_id, seed, self.gpu_memory_utilization, self.dtype)


class EngineWorker:
    """One rollout worker (wrapped by ``ray.remote`` in :func:`worker_class`): builds its engine with
    ``factory(model, seed, device)``, sets torch's threads like the learner, and generates on request.

    ``generate(prompts, params, version, refs, board)`` loads the weights of ``version`` (``refs``: the ``ray.put``
    of each bucket of its state dict, in a list so Ray does not fetch them for calls that need no swap) if the
    engine holds another version, generates, and returns ``(completions, version, sampler state after)``. With a
    ``board`` (async mode) it first asks the board for the newest published version and uses that when newer.
    Each completion carries the version in ``Completion.version``.
    """

    def __init__(
        self, model: nn.Module | None, factory: EngineFactory, seed: int, torch_threads: int, device: str
    ) -> None:
        set_torch_threads(torch_threads)
        if model is not None:
            model = model.to(device)
        self.engine = factory(model, seed, device)
        self.loaded: int | None = None  # the version whose weights the engine holds (None: as built)
        self.reference: nn.Module | None = None
        self.reference_args: tuple[float, str, int] = (1.0, "off", 256)

    def set_reference(self, refs: list[Any], temperature: float, precision: str, rows: int) -> None:
        """Hold the frozen reference (``refs[0]``: the ``ray.put`` of its state dict; loaded into a copy of the
        engine's model) and score every completion with it from now on: ``Completion.ref_logprobs``, computed as
        the learner's collector would (``temperature``, autocast ``precision``, ``rows`` sequences per forward)."""
        import copy

        from pickaxe.dist.runtime import import_ray

        model = getattr(self.engine, "model", None)
        if model is None:
            raise ValueError("this engine has no module to copy a reference from; score the reference in the learner")
        state = import_ray().get(refs[0])
        self.reference = copy.deepcopy(model)
        self.reference.load_state_dict(state)
        self.reference.eval().requires_grad_(False)
        self.reference_args = (temperature, precision, rows)

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        version: int,
        refs: list[Any],
        board: Any = None,
    ) -> tuple[list[Completion], int, dict[str, Any]]:
        """Completions of ``prompts`` with the weights of ``version`` (or the board's newer ones)."""
        from pickaxe.dist.runtime import import_ray

        ray = import_ray()
        if board is not None:
            newest, newest_refs = ray.get(board.latest.remote())
            if newest > version:
                version, refs = newest, newest_refs
        if version != self.loaded:
            for ref in refs:  # one bucket at a time
                load_weights(self.engine, ray.get(ref), version)
            self.loaded = version
        completions = self.engine.generate(prompts, params)
        for c in completions:
            c.version = version
        if self.reference is not None:
            self._score_reference(prompts, completions)
        return completions, version, self.state()

    def _score_reference(self, prompts: Sequence[Sequence[int]], completions: list[Completion]) -> None:
        """``ref_logprobs`` of every completion under the held reference (no gradient)."""
        import torch

        from pickaxe.models.lm import completion_logprobs
        from pickaxe.rollout.text_collector import pack

        assert self.reference is not None
        temperature, precision, rows = self.reference_args
        pad = int(getattr(self.engine, "pad_token_id", 0))
        data = pack([prompts[c.prompt_index] for c in completions], [c.token_ids for c in completions], pad)
        device = next(self.reference.parameters()).device
        with torch.no_grad():
            ref = completion_logprobs(
                self.reference,
                data["input_ids"].to(device),
                data["attention_mask"].to(device),
                data["loss_mask"].to(device),
                temperature,
                precision=precision,  # type: ignore[arg-type]
                rows=rows,
            ).cpu()
        start = data["input_ids"].shape[1] - max(1, max(len(c.token_ids) for c in completions))
        for r, c in enumerate(completions):
            c.ref_logprobs = ref[r, start : start + len(c.token_ids)].tolist()

    def state(self) -> dict[str, Any]:
        """The engine's sampler state (``{}`` for an engine without one)."""
        return self.engine.state_dict() if hasattr(self.engine, "state_dict") else {}

    def load_state(self, state: dict[str, Any]) -> None:
        """Restore the sampler state ``state`` returned; the next request loads its weights whatever version the
        engine holds (after a rollback a version number can name new weights)."""
        if state and hasattr(self.engine, "load_state_dict"):
            self.engine.load_state_dict(state)
        self.loaded = None

    def ping(self) -> bool:
        """True once the actor is built (its engine constructed)."""
        return True


class WeightBoard:
    """Async mode's notice board (a Ray actor): the newest published version and its weights' reference, which
    workers read before each request so that they run ahead with the newest weights there are."""

    def __init__(self) -> None:
        self.version = -1
        self.refs: list[Any] = []

    def post(self, version: int, refs: list[Any]) -> None:
        """Record a newer version."""
        if version > self.version:
            self.version, self.refs = version, refs

    def latest(self) -> tuple[int, list[Any]]:
        """The newest version and ``[ref]`` to its weights."""
        return self.version, self.refs


_CLASSES: dict[str, Any] = {}


def worker_class(ray: Any, kind: str = "engine") -> Any:
    """The Ray actor class of :class:`EngineWorker` (``kind="engine"``) or :class:`WeightBoard` (``"board"``)."""
    if kind not in _CLASSES:
        cls = EngineWorker if kind == "engine" else WeightBoard
        _CLASSES[kind] = ray.remote(max_restarts=0)(cls)  # a dead worker is replaced by the driver, in order
    return _CLASSES[kind]
