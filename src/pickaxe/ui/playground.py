"""The playground page and API of ``pickaxe ui``: talk to any checkpoint of an LLM run.

- ``GET /api/playground/runs``: the LLM runs under RUNS_DIR that have a policy (not reward-model or best-of-n
  runs), each with the checkpoints it can load (kept policies, checkpoints, ``final``);
- ``POST /api/playground/generate`` ``{"run", "checkpoint", "prompt", "max_new_tokens"?, "temperature"?,
  "seed"?, "logprobs"?}``: the response text, and with ``logprobs`` each token with its log-prob.

Runs are named by their folder relative to RUNS_DIR and must be under it. Loaded models are kept in a small LRU
cache (:data:`CACHE_SIZE`), so asking the same checkpoint again skips the load. At most ``max_generations`` of
``create_app`` (:data:`~pickaxe.ui.DEFAULT_MAX_GENERATIONS`, ``pickaxe ui --max-generations``) generations run at
once; a request beyond them is answered 429 at once (see :class:`GenerationSlots`). Errors are one-line 4xx details.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import FileResponse
from starlette.concurrency import run_in_threadpool

from pickaxe.errors import PickaxeError
from pickaxe.runs.listing import find_run_dirs
from pickaxe.ui.body import json_body

__all__ = ["CACHE_SIZE", "GenerationSlots", "PolicyCache", "router"]

router = APIRouter()
"""Routes of the playground; ``pickaxe.ui.app.create_app`` includes them."""

STATIC_DIR = Path(__file__).parent / "static"
CACHE_SIZE = 4
"""Loaded policies kept in memory per app (least recently used dropped first)."""
MAX_PROMPT_CHARS = 4000
MAX_NEW_TOKENS = 512
MAX_BODY_BYTES = 32_768


class PolicyCache:
    """A small LRU cache of loaded policies keyed by run folder, checkpoint and the weights file's stamp (a final
    model rewritten on disk is loaded again). Loads are serialised, so two requests for one checkpoint load it once."""

    def __init__(self, size: int = CACHE_SIZE) -> None:
        self.size = size
        self._items: OrderedDict[tuple[str, str | int, float], Any] = OrderedDict()
        self._lock = threading.Lock()
        self._load_lock = threading.Lock()
        self.loads = 0

    def get(self, run_dir: Path, checkpoint: str | int) -> tuple[Any, bool]:
        """The policy of ``run_dir`` at ``checkpoint`` and whether it came from the cache."""
        from pickaxe.train.generate import load_run_policy

        stamp = (run_dir / "model.safetensors").stat().st_mtime if checkpoint == "final" else 0.0
        key = (str(run_dir), checkpoint, stamp)
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key], True
        with self._load_lock:
            with self._lock:
                if key in self._items:
                    return self._items[key], True
            policy = load_run_policy(run_dir, checkpoint, "cpu")
            self.loads += 1
            with self._lock:
                self._items[key] = policy
                while len(self._items) > self.size:
                    self._items.popitem(last=False)
        return policy, False


class GenerationSlots:
    """At most ``limit`` generations at once. A request finding every slot taken is refused at once with a one-line
    429 (and ``Retry-After``) rather than queued: a generation waits in one of the threads that serve every page's
    requests, so queued generations would slow the whole app down."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.running = 0
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def take(self) -> Iterator[None]:
        """Hold a slot for the duration of the block (429 when none is free)."""
        with self._lock:
            if self.running >= self.limit:
                raise HTTPException(
                    429,
                    f"the playground is busy: {self.limit} generation{'s' if self.limit > 1 else ''} already running "
                    "(pickaxe ui --max-generations N allows more); try again when one finishes",
                    headers={"Retry-After": "1"},
                )
            self.running += 1
        try:
            yield
        finally:
            with self._lock:
                self.running -= 1


def _cache(request: Request) -> PolicyCache:
    state = request.app.state
    with _state_lock:
        if getattr(state, "policy_cache", None) is None:
            state.policy_cache = PolicyCache()
        return state.policy_cache


_state_lock = threading.Lock()


def _read_config(run: Path) -> dict[str, Any]:
    try:
        config = json.loads((run / "config.json").read_bytes())
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


def _llm_runs(root: Path) -> list[dict[str, Any]]:
    from pickaxe.runs.choices import NO_POLICY_ALGOS, available_checkpoints

    out = []
    for run in find_run_dirs(root):
        config = _read_config(run)
        if config.get("kind") != "llm" or config.get("algo_name") in NO_POLICY_ALGOS:
            continue
        checkpoints = available_checkpoints(run)
        if not checkpoints:
            continue
        out.append(
            {
                "run": run.relative_to(root).as_posix() if run != root else ".",
                "recipe": config.get("recipe"),
                "algo": config.get("algo_name"),
                "checkpoints": checkpoints,
                "max_new_tokens": (config.get("engine") or {}).get("max_new_tokens"),
            }
        )
    return out


@router.get("/playground", include_in_schema=False)
async def playground_page() -> FileResponse:
    """The playground page."""
    return FileResponse(STATIC_DIR / "playground.html", media_type="text/html", headers={"Cache-Control": "no-store"})


@router.get("/api/playground/runs")
def playground_runs(request: Request) -> dict[str, Any]:
    """The LLM runs with a policy under RUNS_DIR and the checkpoints each can load."""
    return {"runs": _llm_runs(request.app.state.runs_dir)}


def _number(body: dict[str, Any], key: str, default: Any, kind: type, low: float, high: float) -> Any:
    value = body.get(key, default)
    if value is None:
        return None
    ok = isinstance(value, kind) or (kind is float and isinstance(value, int))
    if isinstance(value, bool) or not ok or not low <= value <= high:
        raise HTTPException(422, f"{key} must be a{'n integer' if kind is int else ' number'} in [{low}, {high}]")
    return value


def _run_dir(root: Path, run: Any) -> Path:
    if not isinstance(run, str) or not run or len(run) > 1000:
        raise HTTPException(422, "run must be a run folder from /api/playground/runs")
    path = (root / run).resolve()
    if not path.is_relative_to(root) or not (path / "config.json").is_file():
        raise HTTPException(404, f"no run {run!r} under {root}")
    return path


@router.post("/api/playground/generate")
async def playground_generate(request: Request) -> dict[str, Any]:
    """One response of a run's checkpoint to a prompt (greedy unless ``temperature`` > 0)."""
    body = await json_body(request, ("run", "checkpoint", "prompt"), MAX_BODY_BYTES)
    root: Path = request.app.state.runs_dir
    run_dir = _run_dir(root, body["run"])
    try:
        from pickaxe.runs.model import checkpoint_choice  # torch: imported on the first generation, not at start

        checkpoint = checkpoint_choice(body["checkpoint"]) if isinstance(body["checkpoint"], str | int) else None
    except PickaxeError as e:
        raise HTTPException(422, str(e)) from None
    if checkpoint is None:
        raise HTTPException(422, "checkpoint must be final or an env step")
    prompt = body["prompt"]
    if not isinstance(prompt, str) or not prompt.strip() or len(prompt) > MAX_PROMPT_CHARS:
        raise HTTPException(422, f"prompt must be non-empty text of at most {MAX_PROMPT_CHARS} characters")
    max_new = _number(body, "max_new_tokens", None, int, 1, MAX_NEW_TOKENS)
    temperature = _number(body, "temperature", 0.0, float, 0.0, 5.0)
    seed = _number(body, "seed", 0, int, 0, 2**31 - 1)
    logprobs = body.get("logprobs", False)
    if not isinstance(logprobs, bool):
        raise HTTPException(422, "logprobs must be true or false")

    def work() -> dict[str, Any]:
        from pickaxe.train.generate import NO_POLICY_ALGOS, available_checkpoints, generate

        config = _read_config(run_dir)
        if config.get("kind") != "llm" or config.get("algo_name") in NO_POLICY_ALGOS:
            raise HTTPException(
                409,
                f"{body['run']} is not an LLM run with a policy (a classic, reward-model or best-of-n run trains "
                "no policy of its own to talk to); pick a run the page lists",
            )
        if checkpoint not in available_checkpoints(run_dir):
            raise HTTPException(404, f"{body['run']} has no checkpoint {checkpoint!r}; pick one the page lists")
        start = time.perf_counter()
        try:
            policy, cached = _cache(request).get(run_dir, checkpoint)
            loaded = time.perf_counter()
            (g,) = generate(policy, [prompt], max_new, temperature, seed, logprobs)
        except PickaxeError as e:
            raise HTTPException(409, str(e)) from None
        except ValueError as e:
            raise HTTPException(422, str(e)) from None
        done = time.perf_counter()
        tokens = None
        if g.logprobs is not None:
            tokens = [
                {"token": t, "id": i, "logprob": lp} for t, i, lp in zip(g.tokens, g.token_ids, g.logprobs, strict=True)
            ]
        return {
            "run": body["run"],
            "checkpoint": checkpoint,
            "label": policy.label,
            "text": g.text,
            "finished": g.finished,
            "tokens": tokens,
            "cached": cached,
            "load_ms": round(1000 * (loaded - start), 1),
            "generate_ms": round(1000 * (done - loaded), 1),
        }

    slots: GenerationSlots = request.app.state.generation_slots
    with slots.take():  # taken before a server thread is: a refused request holds none
        return await run_in_threadpool(work)
