"""``EngineGroup``: the learner's side of separate engine workers (``--dist.placement separate`` on LLM runs).

Contract:

- **The ``Engine`` protocol** (``sync_weights`` + ``generate``), so a ``TextCollector`` uses it unchanged in sync
  mode, and the ``RequestEngine`` protocol (``publish``, ``submit``/``result``) for running ahead
  (:mod:`pickaxe.rollout.pipelined`).
- **Splitting**: a request's prompts are split into ``workers`` contiguous chunks (sizes differ by at most one),
  chunk ``i`` to worker ``i``, whose engine was seeded with ``seed + i``; completions come back prompt-major as
  one engine would return them. With one worker and the colocated engine's seed, the completions are the
  colocated engine's, token for token (CPU, same torch threads).
- **Versioned weights**: ``publish(policy, version)`` puts the policy's weights once per version (one ``ray.put``
  per bucket of at most :data:`BUCKET_BYTES`, copied to the host one bucket at a time, shared by every worker; by
  default only the trainable tensors, so a LoRA policy sends its adapters only); every request names its version,
  and a worker swaps weights between ``generate`` calls when it changes. ``time/weight_sync_s`` (copy + put of the last publish) and ``dist/weight_sync_mb`` report it.
- **Faults**: a worker that dies (``RayActorError``) is replaced: a new actor with the same seed, its sampler
  state set to what it was after the last request it completed, and its unfinished requests resubmitted in
  order, each with its own version's weights. No completion is lost or generated twice, and the numbers are
  those of an undisturbed run. ``dist/worker_restarts`` counts restarts (an event is recorded for each); a
  request that kills its worker ``max_restarts`` times in a row is an error.
"""

from __future__ import annotations

import contextlib
import copy
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from pickaxe.dist.engine_worker import EngineFactory, worker_class
from pickaxe.dist.runtime import ensure_ray
from pickaxe.errors import PickaxeError
from pickaxe.models.lora import is_lora, merge_lora
from pickaxe.rollout.engines.base import Completion, SamplingParams

WeightsFn = Callable[[nn.Module], dict[str, torch.Tensor]]


BUCKET_BYTES = 256 << 20
"""The most bytes of weights one publish copies to the host and puts at once (one ``ray.put`` per bucket)."""


def trainable_weights(model: nn.Module) -> dict[str, torch.Tensor]:
    """The tensors an update can change: the trainable parameters, where they are (for a LoRA policy, its adapters).
    Frozen parameters and buffers never change after the model is built, so a worker keeps its own copy."""
    return {name: p.detach() for name, p in model.named_parameters() if p.requires_grad}


def full_weights(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and buffer of the plain model (a LoRA policy's adapters merged first), where they are: what
    an engine that loads its own weights from disk (vLLM) needs."""
    plain = merge_lora(model) if is_lora(model) else model
    return {name: t.detach() for name, t in plain.state_dict().items()}


def weight_buckets(state: dict[str, torch.Tensor], limit: int | None = None) -> list[list[str]]:
    """The names of ``state`` in order, in consecutive buckets of at most ``limit`` bytes (default
    :data:`BUCKET_BYTES`; a larger tensor alone)."""
    limit = BUCKET_BYTES if limit is None else limit
    buckets: list[list[str]] = [[]]
    size = 0
    for name, t in state.items():
        n = t.numel() * t.element_size()
        if buckets[-1] and size + n > limit:
            buckets.append([])
            size = 0
        buckets[-1].append(name)
        size += n
    return [b for b in buckets if b]


@dataclass
class _Call:
    """One worker's share of a request."""

    worker: int
    prompts: list[list[int]]
    offset: int  # index in the request of its first prompt
    params: SamplingParams
    version: int
    newest: bool
    ref: Any = None  # the running call's ObjectRef
    failures: int = 0
    done: tuple[list[Completion], int, dict[str, Any]] | None = None


class EngineGroup:
    """``workers`` engine workers (Ray actors) and the bookkeeping of their requests; see the module docstring.

    ``factory`` builds each worker's engine (``HFEngineFactory`` or ``VLLMEngineFactory`` from
    :mod:`pickaxe.dist.engine_worker`); when it ships the model (``factory.ships_model``), ``model`` is sent once
    to every worker as its starting copy. ``weights`` chooses what a publish sends (:func:`trainable_weights`;
    :func:`full_weights` for vLLM). ``async_board``: also post each version on a board that workers read before
    ``submit(..., newest=True)`` requests (async mode). ``on_event(message)`` records restarts.
    """

    def __init__(
        self,
        model: nn.Module | None,
        factory: EngineFactory,
        workers: int = 1,
        seed: int = 0,
        torch_threads: int = 1,
        worker_cpus: float = 1.0,
        worker_gpus: float = 0.0,
        address: str | None = None,
        weights: WeightsFn = trainable_weights,
        async_board: bool = False,
        on_event: Callable[[str], None] | None = None,
        max_restarts: int = 3,
    ) -> None:
        self._ray = ray = ensure_ray(address)
        self.factory = factory
        self.seed = seed
        self.torch_threads = torch_threads
        self.device = "cuda" if worker_gpus > 0 else "cpu"
        self._options = {"num_cpus": worker_cpus, "num_gpus": worker_gpus}
        self.weights_fn = weights
        self.on_event = on_event
        self.max_restarts = max_restarts
        self.version = -1  # newest published version
        self.restarts = 0
        if address is None:  # on this machine nothing autoscales: workers that do not fit would wait forever
            _check_fits(ray.cluster_resources(), workers, worker_cpus, worker_gpus)
        self._model_ref = None
        if getattr(factory, "ships_model", True):
            if model is None:
                raise ValueError("this engine factory needs the policy module")
            on_cpu = all(t.device.type == "cpu" for t in model.state_dict().values())
            self._model_ref = ray.put(model if on_cpu else copy.deepcopy(model).cpu())
        self._actors = [self._start(i) for i in range(workers)]
        self._check_started()
        self._board = worker_class(ray, "board").options(num_cpus=0).remote() if async_board else None
        self._weights: dict[int, list[Any]] = {}  # version -> ObjectRefs of its published weights, one per bucket
        self._queues: list[deque[_Call]] = [deque() for _ in range(workers)]  # unfetched calls, in order
        self._tickets: dict[int, list[_Call]] = {}
        self._next_ticket = 0
        self._state: list[dict[str, Any] | None] = [None] * workers  # sampler state after the last fetched call
        self._sync_s = 0.0
        self._sync_mb = 0.0
        self._reference: tuple[list[Any], float, str, int] | None = None  # set_reference's arguments

    @property
    def workers(self) -> int:
        """How many workers there are."""
        return len(self._actors)

    @property
    def actors(self) -> list[Any]:
        """The workers' actor handles (tests kill them)."""
        return list(self._actors)

    def _start(self, i: int) -> Any:
        cls = worker_class(self._ray)
        return cls.options(**self._options).remote(
            self._model_ref, self.factory, self.seed + i, self.torch_threads, self.device
        )

    def _check_started(self) -> None:
        ray = self._ray
        for i, actor in enumerate(self._actors):
            try:
                ray.get(actor.ping.remote())
            except ray.exceptions.RayError as e:
                self.close()
                raise PickaxeError(f"engine worker {i} failed to start: {_last_line(e)}") from None

    # ---------------------------------------------------------------------------------------- weights
    def publish(self, policy: nn.Module, version: int) -> None:
        """Put ``policy``'s weights as ``version`` (nothing when that version is already published)."""
        if version in self._weights:
            self.version = version
            self._sync_s = self._sync_mb = 0.0
            return
        start = time.perf_counter()
        state = self.weights_fn(policy)
        # bucket by bucket: a learner on a GPU never holds a host copy of more than one bucket at a time
        refs = [self._ray.put({name: state[name].cpu() for name in names}) for names in weight_buckets(state)]
        self._sync_s = time.perf_counter() - start
        self._sync_mb = sum(t.numel() * t.element_size() for t in state.values()) / 1e6
        self._weights[version] = refs
        self.version = max(self.version, version)
        if self._board is not None:
            self._board.post.remote(version, refs)
        self._prune()

    def set_reference(self, reference: nn.Module, temperature: float, precision: str, rows: int) -> None:
        """Send the frozen ``reference`` to every worker (one ``ray.put``), which from then on scores its
        completions' reference log-probs (``Completion.ref_logprobs``) right after generating them, off the
        learner's critical path. A replaced worker gets it again."""
        state = {name: t.detach().cpu() for name, t in reference.state_dict().items()}
        self._reference = ([self._ray.put(state)], temperature, precision, rows)
        for actor in self._actors:
            actor.set_reference.remote(*self._reference)

    def sync_weights(self, policy: nn.Module, version: int) -> None:
        """The ``Engine`` protocol's sync: :meth:`publish`."""
        self.publish(policy, version)

    def _prune(self) -> None:
        """Drop published versions no unfetched call and no future request can need."""
        needed = {self.version} | {c.version for q in self._queues for c in q}
        for v in [v for v in self._weights if v not in needed]:
            del self._weights[v]

    # ---------------------------------------------------------------------------------------- requests
    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Completion]:
        """The ``Engine`` protocol's generate: submit with the newest published weights and wait."""
        return self.result(self.submit(prompts, params))

    def submit(self, prompts: Sequence[Sequence[int]], params: SamplingParams, newest: bool = False) -> int:
        """Split ``prompts`` among the workers and start generating with the newest published version (with
        ``newest``: or a newer one a worker finds on the board when it starts); returns a ticket."""
        if self.version not in self._weights:
            raise RuntimeError("EngineGroup.submit before any publish: publish the policy's weights first")
        n, w = len(prompts), self.workers
        calls = []
        start = 0
        for i in range(w):
            size = n // w + (1 if i < n % w else 0)
            if size == 0:
                continue
            chunk = [list(p) for p in prompts[start : start + size]]
            call = _Call(i, chunk, start, params, self.version, newest and self._board is not None)
            self._launch(call)
            self._queues[i].append(call)
            calls.append(call)
            start += size
        ticket = self._next_ticket
        self._next_ticket += 1
        self._tickets[ticket] = calls
        return ticket

    def _launch(self, call: _Call) -> None:
        board = self._board if call.newest else None
        refs = self._weights[call.version]
        actor = self._actors[call.worker]
        call.ref = actor.generate.remote(call.prompts, call.params, call.version, refs, board)

    def result(self, ticket: int) -> list[Completion]:
        """The completions of ``ticket`` (prompt indices of the whole request), waiting for them."""
        out: list[Completion] = []
        for call in self._tickets.pop(ticket):
            self._wait(call)
            assert call.done is not None
            for c in call.done[0]:
                c.prompt_index += call.offset
                out.append(c)
        return out

    def discard(self, ticket: int) -> None:
        """Forget ``ticket``'s result (its calls still run, in order, and are fetched with the ones after)."""
        self._tickets.pop(ticket, None)

    def drain(self) -> None:
        """Wait for every call in flight."""
        for q in self._queues:
            while q:
                self._wait(q[-1])

    def _wait(self, call: _Call) -> None:
        """Fetch the calls of ``call``'s worker up to and including it, in order, replacing the worker when it
        died."""
        ray = self._ray
        queue = self._queues[call.worker]
        while call.done is None:
            front = queue[0]
            try:
                front.done = ray.get(front.ref)
            except ray.exceptions.RayActorError as e:
                self._restart(call.worker, front, e)
                continue
            queue.popleft()
            self._state[call.worker] = front.done[2]

    def _restart(self, i: int, failed: _Call, error: Exception) -> None:
        """Replace dead worker ``i``: same seed, the sampler state after its last completed call, and its
        unfinished calls resubmitted in order."""
        ray = self._ray
        failed.failures += 1
        if failed.failures > self.max_restarts:
            raise PickaxeError(
                f"engine worker {i} died {failed.failures} times on the same request; the last error: "
                f"{_last_line(error)}"
            ) from None
        with contextlib.suppress(Exception):  # already gone
            ray.kill(self._actors[i], no_restart=True)
        self.restarts += 1
        actor = self._actors[i] = self._start(i)
        if self._state[i] is not None:
            actor.load_state.remote(self._state[i])  # runs before the resubmitted calls (actor calls are ordered)
        if self._reference is not None:
            actor.set_reference.remote(*self._reference)
        for call in self._queues[i]:
            self._launch(call)
        if self.on_event is not None:
            self.on_event(
                f"engine worker {i} died ({type(error).__name__}); replaced it and resubmitted its "
                f"{len(self._queues[i])} unfinished request(s) (restart {self.restarts})"
            )

    # ---------------------------------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        """Every worker's sampler state (after draining the calls in flight) and the restart count."""
        self.drain()
        states = []
        for i, actor in enumerate(self._actors):
            state = self._state[i]
            if state is None:
                state = self._state[i] = self._ray.get(actor.state.remote())
            states.append(state)
        return {"workers": states, "restarts": self.restarts}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore every worker's sampler state (calls in flight finish first; their results are dropped). The
        published versions are forgotten: after a rollback the same version numbers name new weights."""
        states = state["workers"]
        if len(states) != self.workers:
            raise PickaxeError(
                f"the checkpoint holds the sampler states of {len(states)} engine workers, this run has "
                f"{self.workers}: resume with --dist.workers {len(states)}"
            )
        self.drain()
        self._tickets.clear()
        self._weights.clear()
        self.version = -1
        for i, (actor, s) in enumerate(zip(self._actors, states, strict=True)):
            actor.load_state.remote(s)
            self._state[i] = s
        self.restarts = int(state.get("restarts", 0))

    def metrics(self) -> dict[str, float]:
        """``time/weight_sync_s`` and ``dist/weight_sync_mb`` of the last publish (0 when it published nothing
        new), ``dist/worker_restarts`` so far."""
        return {
            "time/weight_sync_s": self._sync_s,
            "dist/weight_sync_mb": self._sync_mb,
            "dist/worker_restarts": float(self.restarts),
        }

    def close(self) -> None:
        """Stop the workers (and the board)."""
        for actor in [*self._actors, *([self._board] if getattr(self, "_board", None) is not None else [])]:
            with contextlib.suppress(Exception):  # already gone
                self._ray.kill(actor, no_restart=True)
        self._actors = []


def _check_fits(resources: dict[str, float], workers: int, cpus: float, gpus: float) -> None:
    """One-line ``PickaxeError`` when ``workers`` workers of ``cpus``/``gpus`` each exceed Ray's resources."""
    for name, each, flag in (("CPU", cpus, "--dist.worker-cpus"), ("GPU", gpus, "--dist.worker-gpus")):
        have = resources.get(name, 0.0)
        if workers * each > have + 1e-9:
            raise PickaxeError(
                f"{workers} engine workers x {flag} {each:g} need {workers * each:g} {name}s, Ray on this machine has "
                f"{have:g}: lower --dist.workers or {flag} (fractions share a {name})"
            )


def _last_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[-1] if lines else type(error).__name__


__all__ = ["BUCKET_BYTES", "EngineGroup", "full_weights", "trainable_weights", "weight_buckets"]
