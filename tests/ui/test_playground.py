"""The playground of ``pickaxe ui`` on a tiny LLM run trained for the test: its runs and checkpoints are listed,
a prompt gets the checkpoint's own greedy answer (the one ``generate`` gives), the model is cached after the first
request, bad requests are one-line 4xx; in Chromium: type a prompt, see the answers of two checkpoints side by
side and the per-token log-probs."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from pickaxe.recipes.llm import LLM_RECIPES
from pickaxe.train.build import train
from pickaxe.train.config import TrainerConfig
from pickaxe.train.generate import generate, load_run_policy
from pickaxe.train.llm_config import LLMEvalConfig, LMConfig, TextCollectorConfig
from pickaxe.ui.app import create_app


@pytest.fixture(scope="module")
def llm_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A runs folder holding one finished tiny SFT run (``sft``: weights at env steps 32, 64 and final) and a
    reward-model-like run the playground must not offer."""
    root = tmp_path_factory.mktemp("pg")
    cfg = LLM_RECIPES["arith-sft"].make()
    cfg.model = LMConfig(hidden=32, layers=1, heads=4, kv_heads=2, intermediate=64)
    cfg.collector = TextCollectorConfig(prompts=16)
    cfg.eval = LLMEvalConfig(prompts=4, samples=0, before=False)
    cfg.trainer = TrainerConfig(total_steps=64, eval_every=32)
    cfg.algo.lr = 3e-3
    cfg.device = "cpu"
    train(cfg, run_dir=root / "sft")
    (root / "rm").mkdir()
    (root / "rm" / "config.json").write_text('{"kind": "llm", "algo_name": "rm"}')
    return root


@pytest.fixture
def client(llm_root: Path) -> TestClient:
    return TestClient(create_app(llm_root, queue_db=llm_root / "queue.db"))


def test_playground_answers_with_the_chosen_checkpoint(client: TestClient, llm_root: Path) -> None:
    runs = client.get("/api/playground/runs").json()["runs"]
    assert [(r["run"], r["checkpoints"]) for r in runs] == [("sft", [32, 64, "final"])]
    first = client.post("/api/playground/generate", json={"run": "sft", "checkpoint": 32, "prompt": "12+34="})
    assert first.status_code == 200, first.text
    body = first.json()
    expected = generate(load_run_policy(llm_root / "sft", 32), ["12+34="])[0]
    assert body["text"] == expected.text and body["label"] == "step 32" and body["tokens"] is None
    assert body["cached"] is False
    again = client.post(
        "/api/playground/generate", json={"run": "sft", "checkpoint": 32, "prompt": "7+8=", "logprobs": True}
    ).json()
    assert again["cached"] is True
    ref = generate(load_run_policy(llm_root / "sft", 32), ["7+8="], logprobs=True)[0]
    assert [t["logprob"] for t in again["tokens"]] == pytest.approx(ref.logprobs, abs=1e-6)
    assert [t["token"] for t in again["tokens"]] == ref.tokens


def test_playground_bad_requests_are_one_line_4xx(client: TestClient) -> None:
    good = {"run": "sft", "checkpoint": "final", "prompt": "1+1="}
    cases: list[tuple[dict[str, Any], int, str]] = [
        ({"run": "sft", "prompt": "1+1="}, 422, "missing field: checkpoint"),
        (good | {"run": "../.."}, 404, "no run"),
        (good | {"run": "rm"}, 409, "not an LLM run with a policy"),
        (good | {"checkpoint": 999}, 404, "no checkpoint 999"),
        (good | {"checkpoint": "yesterday"}, 422, "env step"),
        (good | {"prompt": ""}, 422, "prompt must be"),
        (good | {"prompt": "9" * 300}, 422, "positions"),
        (good | {"max_new_tokens": 0}, 422, "max_new_tokens must be"),
        (good | {"temperature": "hot"}, 422, "temperature must be"),
        (good | {"logprobs": "yes"}, 422, "logprobs must be"),
    ]
    for body, status, message in cases:
        r = client.post("/api/playground/generate", json=body)
        assert r.status_code == status, (body, r.text)
        detail = r.json()["detail"]
        assert isinstance(detail, str) and "\n" not in detail and message in detail, (body, detail)
    r = client.post("/api/playground/generate", content=b"{", headers={"Content-Type": "application/json"})
    assert r.status_code == 400


def test_playground_page_shows_two_checkpoints_side_by_side(
    llm_root: Path, ui_server: Callable[[Any], str], page: Any, screenshot: Callable[[Any, str], Path]
) -> None:
    base = ui_server(create_app(llm_root, queue_db=llm_root / "queue.db"))
    page.goto(f"{base}/playground")
    page.wait_for_selector("#ckpt-a option[value='32']", state="attached")
    assert page.locator("#run option").count() == 1
    page.select_option("#ckpt-a", "32")
    page.select_option("#ckpt-b", "final")
    page.check("#logprobs")
    page.fill("#prompt", "12+34=")
    page.click("#go")
    page.wait_for_selector("#side-b:not([hidden])")
    a = generate(load_run_policy(llm_root / "sft", 32), ["12+34="])[0].text
    b = generate(load_run_policy(llm_root / "sft", "final"), ["12+34="])[0].text
    assert page.inner_text("#side-a .pg-text") == a and page.inner_text("#side-b .pg-text") == b
    assert page.inner_text("#side-a .pg-title") == "step 32" and page.inner_text("#side-b .pg-title") == "final"
    assert page.locator("#side-a table.pg-logprobs tbody tr").count() >= 1
    assert page.js_errors == [] and page.outside_requests == []
    screenshot(page, "playground")


class _StubPolicy:
    label = "final"


class _StubCache:
    """A policy cache that loads nothing."""

    def get(self, run_dir: Path, checkpoint: str | int) -> tuple[Any, bool]:
        return _StubPolicy(), True


def test_generations_beyond_the_cap_are_refused_at_once_and_pages_stay_served(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading

    from pickaxe.train import generate as generate_module
    from pickaxe.train.generate import Generation

    (tmp_path / "sft").mkdir()
    (tmp_path / "sft" / "config.json").write_text('{"kind": "llm", "algo_name": "sft"}')
    entered, release = threading.Event(), threading.Event()
    calls: list[str] = []

    def engine(policy: Any, prompts: list[str], *args: Any) -> list[Generation]:
        """Blocks the first generation until the test releases it; any other answers at once."""
        calls.append(prompts[0])
        if len(calls) == 1:
            entered.set()
            assert release.wait(timeout=60)
        return [Generation(prompts[0], "ok", [1], ["ok"], None, True)]

    monkeypatch.setattr(generate_module, "generate", engine)
    monkeypatch.setattr(generate_module, "available_checkpoints", lambda run_dir: ["final"])
    app = create_app(tmp_path, queue_db=tmp_path / "queue.db", max_generations=1)
    app.state.policy_cache = _StubCache()
    ask = {"run": "sft", "checkpoint": "final"}
    answers: list[Any] = []
    first = threading.Thread(
        target=lambda: answers.append(TestClient(app).post("/api/playground/generate", json=ask | {"prompt": "a"}))
    )
    first.start()
    try:
        assert entered.wait(timeout=60)
        busy = TestClient(app).post("/api/playground/generate", json=ask | {"prompt": "b"})
        assert busy.status_code == 429 and busy.headers["retry-after"] == "1"
        assert "busy: 1 generation already running" in busy.json()["detail"]
        assert "--max-generations" in busy.json()["detail"]
        assert TestClient(app).get("/api/runs").status_code == 200  # other pages are served meanwhile
    finally:
        release.set()
        first.join(timeout=60)
    assert answers[0].status_code == 200 and answers[0].json()["text"] == "ok"
    assert calls == ["a"]  # the refused request never reached the engine
    again = TestClient(app).post("/api/playground/generate", json=ask | {"prompt": "c"})
    assert again.status_code == 200 and calls == ["a", "c"]  # the slot is free again


def test_max_generations_must_be_positive(tmp_path: Path) -> None:
    from pickaxe.errors import PickaxeError

    with pytest.raises(PickaxeError, match="--max-generations must be an integer >= 1, got 0"):
        create_app(tmp_path, max_generations=0)
