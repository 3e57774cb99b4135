"""Fixtures of the ``pickaxe ui`` tests: fake run folders shaped like real ones, the app served by uvicorn in a
thread, and a Playwright page on Debian's Chromium (headless, nothing downloaded; the browser tests are skipped
with one line when Chromium or Playwright is missing). Screenshots go to :data:`SCREENSHOTS`.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="pickaxe ui needs the web extra: pip install 'pickaxe[web]'")

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
SCREENSHOTS = (
    Path(os.environ.get("PICKAXE_TEST_ARTIFACTS") or Path(__file__).resolve().parents[2] / "test-artifacts")
    / "screenshots"
)
"""Where the browser tests' screenshots go (a folder CI keeps): ``$PICKAXE_TEST_ARTIFACTS/screenshots``, by default
``test-artifacts/screenshots`` at the repository's root (ignored by git)."""


CHECKPOINT_EVAL: dict[str, Any] = {
    "run": "runs/llm",
    "kind": "llm",
    "settings": {"prompts": 64, "samples": 4, "seed": 0},
    "metrics": ["eval/accuracy", "eval/reward/gold"],
    "rows": [
        {
            "step": 64,
            "source": "policy",
            "sha256": "a" * 64,
            "metrics": {
                "eval/accuracy": {"mean": 0.25, "low": 0.16, "high": 0.37, "n": 64},
                "eval/reward/gold": {"mean": 0.8, "low": 0.75, "high": 0.85, "n": 64},
            },
        },
        {
            "step": 128,
            "source": "final",
            "sha256": "b" * 64,
            "metrics": {
                "eval/accuracy": {"mean": 0.5, "low": 0.38, "high": 0.62, "n": 64},
                "eval/reward/gold": {"mean": 0.7, "low": 0.64, "high": 0.76, "n": 64},
            },
        },
    ],
    "best": {
        "step": 64,
        "metric": "eval/reward/gold",
        "rule": "undominated",
        "mean": 0.8,
        "low": 0.75,
        "high": 0.85,
        "reason": "no later checkpoint's CI lies above it",
    },
    "alarms": [
        {
            "name": "proxy_up_gold_down",
            "step": 128,
            "message": "proxy reward up while gold fell below its CI",
            "values": {"gold": 0.7},
        }
    ],
    "pairs": [{"a": 64, "b": 128, "metric": "eval/reward/gold", "difference": 0.1, "more_samples": 0}],
}
"""An ``eval/checkpoints.json`` in the schema ``pickaxe eval RUN --checkpoints`` writes (two checkpoints of an LLM
run, the best by the default rule, one alarm and one pair)."""


def write_run(
    path: Path,
    *,
    recipe: str = "cartpole-ppo",
    seed: int = 0,
    evals: dict[int, float] | None = None,
    kind: str = "classic",
    lr: float = 3e-4,
    state: str = "finished",
    total_steps: int = 4000,
    extra: list[dict[str, Any]] | None = None,
    real_config: bool = False,
) -> Path:
    """A run folder as ``pickaxe train`` writes it: ``config.json`` (nested sections), ``metrics.jsonl`` (a training
    record and an eval record with its CI per eval step) and ``status.json``. ``evals`` maps step -> eval value;
    ``extra`` records come first (e.g. an LLM run's "before training" evaluation). ``real_config`` writes the
    recipe's full config (what ``pickaxe set`` and ``load_run_config`` read) instead of a sketch of it."""
    from pickaxe.runs.status import write_status

    path.mkdir(parents=True, exist_ok=True)
    metric = "eval/accuracy" if kind == "llm" else "eval/return_mean"
    config = {
        "recipe": recipe,
        "kind": kind,
        "seed": seed,
        "device": "cpu",
        "env": {"id": "CartPole-v1", "num_envs": 4},
        "algo": {"lr": lr, "gamma": 0.99, "clip": 0.2},
        "trainer": {"total_steps": total_steps, "eval_every": 1000, "log_every": 500, "keep_last": 2},
    }
    if real_config:
        from pickaxe.recipes.args import parse_train

        cfg, _ = parse_train(recipe, ["--seed", str(seed), "--algo.lr", str(lr)])
        config = cfg.to_dict()
    (path / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    records: list[dict[str, Any]] = list(extra or [])
    for i, (step, value) in enumerate(sorted((evals or {}).items())):
        records.append(
            {"step": step, "loss/policy": 0.1, "rollout/return_mean": value * 0.9, "time/elapsed_s": i + 0.5}
        )
        records.append({"step": step, metric: value, f"{metric}_ci_low": value - 1.0, f"{metric}_ci_high": value + 1.0})
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    last = max(evals) if evals else 0
    write_status(path, state, step=last, total_steps=total_steps)
    return path


def write_identical_arena(path: Path) -> Any:
    """Arena ``same``: three checkpoints on five prompts; on prompts 0-3 all three answered alike, on prompt 4 only
    ``a`` and ``b`` agree (so the one playable pairs are a-c and b-c of prompt 4)."""
    from pickaxe.eval.arena import ArenaStore

    store = ArenaStore(path)
    store.add_arena("same", {})
    rows = [(i, f"q{i}", lab, f"answer {i}") for i in range(4) for lab in ("a", "b", "c")]
    rows += [(4, "q4", "a", "4"), (4, "q4", "b", "4"), (4, "q4", "c", "five")]
    store.add_responses("same", rows)
    return store


@pytest.fixture
def identical_arena() -> Callable[[Path], Any]:
    """:func:`write_identical_arena`."""
    return write_identical_arena


@pytest.fixture
def checkpoint_eval() -> dict[str, Any]:
    """A fresh copy of :data:`CHECKPOINT_EVAL`."""
    return json.loads(json.dumps(CHECKPOINT_EVAL))


@pytest.fixture
def make_run() -> Callable[..., Path]:
    """:func:`write_run`, for tests that need runs of their own."""
    return write_run


@pytest.fixture
def runs_root(tmp_path: Path) -> Path:
    """A runs folder with a sweep of two seeds of one config (lr 3e-4), one run of lr 1e-3, and an LLM run."""
    root = tmp_path / "runs"
    write_run(root / "sweep" / "lr=0.0003" / "seed-0", seed=0, evals={1000: 20.0, 2000: 60.0, 3000: 100.0})
    write_run(root / "sweep" / "lr=0.0003" / "seed-1", seed=1, evals={1000: 30.0, 2000: 80.0, 3000: 140.0})
    write_run(root / "sweep" / "lr=0.001" / "seed-0", seed=0, lr=1e-3, evals={1000: 10.0, 2000: 15.0, 3000: 12.0})
    write_run(
        root / "llm",
        recipe="arith-grpo",
        kind="llm",
        evals={64: 0.25, 128: 0.5},
        total_steps=128,
        extra=[{"step": 0, "eval/accuracy": 0.9, "eval/phase_before": 1.0}],
    )
    return root


@pytest.fixture
def ui_server() -> Iterator[Callable[[Any], str]]:
    """``ui_server(app) -> base_url``: serve ``app`` with uvicorn in a thread on a free 127.0.0.1 port (the socket
    is bound before uvicorn starts, so no other process can take it); every server is shut down after the test."""
    import uvicorn

    servers: list[tuple[uvicorn.Server, threading.Thread, socket.socket]] = []

    def start(app: Any) -> str:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
        thread.start()
        deadline = time.monotonic() + 120
        while not server.started:
            if time.monotonic() > deadline or not thread.is_alive():
                raise RuntimeError("the test server did not start within 120 s")
            time.sleep(0.01)
        servers.append((server, thread, sock))
        return f"http://127.0.0.1:{port}"

    yield start
    for server, thread, sock in servers:
        server.should_exit = True
        thread.join(timeout=120)
        sock.close()


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    """Headless Debian Chromium through Playwright, one per session; skipped when either is missing."""
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is missing; .ci/run installs Debian's chromium for the browser tests")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("playwright is missing; pip install playwright (the browser itself comes from Debian)")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A fresh browser page (1280x900); any request leaving 127.0.0.1 is aborted and listed in
    ``page.outside_requests`` (the app must work offline); uncaught script errors are in ``page.js_errors``."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    pg = context.new_page()
    pg.outside_requests = []
    pg.js_errors = []

    def route(r: Any) -> None:
        url = r.request.url
        if url.startswith(("http://127.0.0.1:", "data:", "about:")):
            r.continue_()
        else:
            pg.outside_requests.append(url)
            r.abort()

    pg.route("**/*", route)
    pg.on("pageerror", lambda e: pg.js_errors.append(str(e)))
    pg.set_default_timeout(60_000)  # a safety net only (a minute, as for every wait in the tests): waits end when met
    yield pg
    context.close()


@pytest.fixture
def screenshot() -> Callable[[Any, str], Path]:
    """``screenshot(page, name)`` saves the whole page to ``SCREENSHOTS/<name>.png``."""

    def save(pg: Any, name: str) -> Path:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        path = SCREENSHOTS / f"{name}.png"
        pg.screenshot(path=str(path), full_page=True)
        return path

    return save
