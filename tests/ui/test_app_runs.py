"""The Runs API of ``pickaxe ui``: the same summaries as ``pickaxe runs``, the same group numbers as ``pickaxe
compare``, request validation, and pages that reference only packaged assets."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient
from rich.console import Console

from pickaxe.errors import PickaxeError
from pickaxe.exp.compare import compare, learning_curve, load_runs
from pickaxe.runs.listing import list_runs
from pickaxe.ui.app import STATIC_DIR, create_app

SWEEP = ["sweep/lr=0.0003/seed-0", "sweep/lr=0.0003/seed-1", "sweep/lr=0.001/seed-0"]


@pytest.fixture
def client(runs_root: Path, tmp_path: Path) -> TestClient:
    return TestClient(create_app(runs_root, queue_db=tmp_path / "no-queue.db"))


def test_runs_lists_what_pickaxe_runs_prints(client: TestClient, runs_root: Path) -> None:
    data = client.get("/api/runs").json()
    expected = list_runs(runs_root)
    assert [r["id"] for r in data["runs"]] == [str(s.path.relative_to(runs_root)) for s in expected]
    by_id = {r["id"]: r for r in data["runs"]}
    fast = by_id["sweep/lr=0.0003/seed-1"]
    assert (fast["recipe"], fast["state"], fast["step"], fast["total_steps"]) == (
        "cartpole-ppo",
        "finished",
        3000,
        4000,
    )
    assert (fast["final_eval"], fast["best_eval"], fast["metric"]) == (140.0, 140.0, "eval/return_mean")
    llm = by_id["llm"]  # the "before training" evaluation (0.9) is not the run's result
    assert (llm["kind"], llm["metric"], llm["final_eval"], llm["best_eval"]) == ("llm", "eval/accuracy", 0.5, 0.5)
    assert llm["checkpoints"] is False


def test_summaries_are_cached_until_a_file_changes(client: TestClient, runs_root: Path) -> None:
    client.get("/api/runs")
    cache = client.app.state.summary_cache
    assert cache.misses == 4
    client.get("/api/runs")
    assert cache.misses == 4  # nothing changed: nothing re-read
    metrics = runs_root / "llm" / "metrics.jsonl"
    with open(metrics, "a") as f:
        f.write(json.dumps({"step": 192, "eval/accuracy": 0.75}) + "\n")
    llm = next(r for r in client.get("/api/runs").json()["runs"] if r["id"] == "llm")
    assert cache.misses == 5
    assert (llm["final_eval"], llm["best_eval"], llm["step"]) == (0.75, 0.75, 128)


def test_a_running_run_shows_its_phase_and_its_wall_time_goes_on(client: TestClient, runs_root: Path) -> None:
    from pickaxe.runs.status import write_status

    write_status(runs_root / "llm", "running", phase="warm_start", wall_s=120.0)  # by this process: alive
    first = next(r for r in client.get("/api/runs").json()["runs"] if r["id"] == "llm")
    assert (first["state"], first["phase"]) == ("running", "warm_start") and first["wall_s"] >= 120.0
    misses = client.app.state.summary_cache.misses
    again = next(r for r in client.get("/api/runs").json()["runs"] if r["id"] == "llm")
    assert client.app.state.summary_cache.misses == misses  # served from the cache, its clock read again
    assert (again["state"], again["phase"]) == ("running", "warm_start") and again["wall_s"] >= first["wall_s"]
    finished = next(r for r in client.get("/api/runs").json()["runs"] if r["id"] != "llm")
    assert finished["phase"] is None


def test_warming_the_cache_reads_each_run_once(client: TestClient) -> None:
    from pickaxe.ui.runs import warm_cache

    assert warm_cache(client.app) == 4
    client.get("/api/runs")
    assert client.app.state.summary_cache.misses == 4  # the page load found every summary ready


def test_compare_gives_the_numbers_of_pickaxe_compare(client: TestClient, runs_root: Path) -> None:
    r = client.get("/api/runs/compare", params={"run": SWEEP})
    assert r.status_code == 200, r.text
    data = r.json()
    expected = compare([runs_root / s for s in SWEEP], console=Console(file=open("/dev/null", "w"))).to_dict()  # noqa: SIM115
    assert data["metric"] == "eval/return_mean"
    assert data["varying"] == ["algo.lr"]
    assert (
        [g["label"] for g in data["groups"]]
        == [g["label"] for g in expected["groups"]]
        == [
            "algo.lr=0.0003",
            "algo.lr=0.001",
        ]
    )
    for got, want in zip(data["groups"], expected["groups"], strict=True):
        assert got["final"] == want["final"] and got["best"] == want["best"] and got["n_runs"] == want["n_runs"]
    assert data["comparisons"] == expected["comparisons"]
    assert data["best"] == expected["best"] == "algo.lr=0.0003"
    assert data["verdict"].startswith("no verdict: 2 group(s) have fewer than the 4 seeds")
    seeds, single = data["groups"]
    assert seeds["run_ids"] == SWEEP[:2] and single["curve"] is None  # one run: its own line, no band
    band = learning_curve(load_runs([runs_root / s for s in SWEEP[:2]]), "eval/return_mean")
    assert seeds["curve"]["step"] == [1000.0, 2000.0, 3000.0]
    np.testing.assert_allclose(seeds["curve"]["iqm"], band["iqm"])
    np.testing.assert_allclose(seeds["curve"]["low"], band["low"])
    np.testing.assert_allclose(seeds["curve"]["iqm"], [25.0, 70.0, 120.0])  # two seeds: IQM = mean
    run0 = data["runs"][0]
    assert (run0["id"], run0["seed"], run0["group"]) == (SWEEP[0], 0, "algo.lr=0.0003")
    assert (run0["step"], run0["value"]) == ([1000, 2000, 3000], [20.0, 60.0, 100.0])
    assert "eval/return_mean" in data["metrics"] and not any(m.endswith("_ci_low") for m in data["metrics"])


def test_compared_runs_are_parsed_once_until_they_change(
    client: TestClient, runs_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pickaxe.ui.runs as ui_runs

    parsed: list[Path] = []
    monkeypatch.setattr(ui_runs, "load_runs", lambda paths: parsed.extend(paths) or load_runs(paths))
    client.get("/api/runs/compare", params={"run": SWEEP[:1]})
    client.get("/api/runs/compare", params={"run": SWEEP[:2]})  # ticking a second run parses only that one
    assert parsed == [runs_root / SWEEP[0], runs_root / SWEEP[1]]
    with open(runs_root / SWEEP[0] / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": 4000, "eval/return_mean": 7.0}) + "\n")
    data = client.get("/api/runs/compare", params={"run": SWEEP[:2]}).json()
    assert parsed[2:] == [runs_root / SWEEP[0]]
    assert data["runs"][0]["value"] == [20.0, 60.0, 100.0, 7.0]


def test_compare_of_an_llm_run_defaults_to_accuracy_and_falls_back_from_an_unlogged_metric(
    client: TestClient,
) -> None:
    data = client.get("/api/runs/compare", params={"run": "llm"}).json()
    assert data["metric"] == "eval/accuracy"
    assert data["runs"][0]["value"] == [0.9, 0.25, 0.5]
    data = client.get("/api/runs/compare", params={"run": "llm", "metric": "eval/nope"}).json()
    assert data["metric"] == "eval/accuracy"
    assert data["notes"] == ["no selected run logged eval/nope; showing the default metric instead"]


@pytest.mark.parametrize(
    ("params", "status", "detail"),
    [
        ({}, 422, "bad request: run: Field required"),
        ({"run": "../runs"}, 400, "must be a path relative to the runs folder, without '..'"),
        ({"run": "/etc"}, 400, "must be a path relative to the runs folder"),
        ({"run": "sweep/missing"}, 404, "no run 'sweep/missing' under"),
        ({"run": "sweep"}, 404, "no run 'sweep' under"),  # a folder of runs is not a run
    ],
)
def test_compare_rejects_bad_runs_with_one_line(client: TestClient, params: dict, status: int, detail: str) -> None:
    r = client.get("/api/runs/compare", params=params)
    assert r.status_code == status
    assert detail in r.json()["detail"] and "\n" not in r.json()["detail"]


def test_a_symlink_out_of_the_folder_is_refused(client: TestClient, runs_root: Path, tmp_path: Path, make_run) -> None:
    make_run(tmp_path / "elsewhere", evals={1: 1.0})
    (runs_root / "link").symlink_to(tmp_path / "elsewhere")
    r = client.get("/api/checkpoints", params={"run": "link"})
    assert (r.status_code, r.json()["detail"]) == (400, "run 'link' is outside the runs folder")


def test_a_run_without_metrics_is_a_note_not_an_error(client: TestClient, runs_root: Path) -> None:
    (runs_root / "empty").mkdir()
    (runs_root / "empty" / "config.json").write_text(json.dumps({"recipe": "cartpole-ppo"}))
    data = client.get("/api/runs/compare", params={"run": ["empty", SWEEP[0]]}).json()
    assert [r["id"] for r in data["runs"]] == [SWEEP[0]]
    assert data["notes"][0].startswith("empty: no run directories")
    r = client.get("/api/runs/compare", params={"run": "empty"})
    assert r.status_code == 400 and r.json()["detail"].startswith("empty: no run directories")


def test_create_app_needs_a_folder(tmp_path: Path) -> None:
    with pytest.raises(PickaxeError, match="is not a folder; `pickaxe ui RUNS_DIR`"):
        create_app(tmp_path / "missing")


@pytest.mark.parametrize("route", ["/", "/runs", "/run", "/queue", "/checkpoints"])
def test_pages_reference_only_packaged_assets(client: TestClient, route: str) -> None:
    r = client.get(route)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    refs = re.findall(r'(?:src|href)="([^"]*)"', r.text)
    assets = [u for u in refs if not u.startswith("data:")]
    assert assets and all(u.startswith("/static/") for u in assets), assets
    for u in assets:
        assert client.get(u).status_code == 200, u
    assert "http:" not in r.text and "https:" not in r.text


def test_scripts_fetch_only_the_app_and_never_insert_html() -> None:
    for name in ("common.js", "runs.js", "queue.js", "checkpoints.js"):
        js = STATIC_DIR / name
        text = js.read_text()
        assert not re.search(r"https?://", text), js.name
        assert "innerHTML" not in text and "insertAdjacentHTML" not in text and "document.write" not in text, js.name
