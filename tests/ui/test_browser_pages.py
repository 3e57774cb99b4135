"""``pickaxe ui`` in a real browser (Playwright driving Debian's headless Chromium): the runs page draws the
selected runs' curves, the queue page cancels a job, the checkpoints page shows the table and the best; every
page works offline and shows names as text. A screenshot of each page lands in test-artifacts/screenshots/."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pickaxe.exp.queue_store import JobQueue
from pickaxe.ui.app import create_app

SWEEP = ["sweep/lr=0.0003/seed-0", "sweep/lr=0.0003/seed-1", "sweep/lr=0.001/seed-0"]


def _check_clean(page: Any) -> None:
    assert page.outside_requests == []  # nothing fetched from outside 127.0.0.1
    assert page.js_errors == []


def test_runs_page_overlays_selected_runs(
    runs_root: Path, tmp_path: Path, make_run: Callable[..., Path], ui_server: Callable, page: Any, screenshot: Callable
) -> None:
    hostile = "<img src=x onerror=window.pwned=1>"
    make_run(runs_root / hostile, evals={1000: 5.0})
    base = ui_server(create_app(runs_root, queue_db=tmp_path / "q.db"))
    page.goto(f"{base}/runs")
    page.wait_for_selector("table.runs-table tbody tr")
    rows = page.locator("table.runs-table tbody tr")
    assert rows.count() == 5
    assert page.locator(f'tr[data-run="{hostile}"] a.run-link').text_content() == hostile  # text, not markup
    assert page.evaluate("window.pwned") is None and page.locator("img").count() == 0
    for run in SWEEP:
        page.locator(f'input[data-run="{run}"]').check()
    chart = page.locator("#chart")
    page.wait_for_function(
        "() => { const c = document.querySelector('#chart'); return c && c.dataset.series === '4' && c._uplot; }"
    )
    assert chart.locator("canvas").count() >= 1
    # 3 run lines + the IQM of the two-seed group; uPlot also holds x and the band's two bounds
    assert page.evaluate("document.querySelector('#chart')._uplot.series.length") == 1 + 4 + 2
    assert page.evaluate("document.querySelector('#chart')._uplot.data[0]") == [1000, 2000, 3000]
    groups = page.locator("table.groups-table tbody tr")
    assert groups.count() == 2
    api = json.loads(
        page.evaluate(f"fetch('/api/runs/compare?run={SWEEP[0]}&run={SWEEP[1]}&run={SWEEP[2]}').then(r => r.text())")
    )
    first = api["groups"][0]["final"]["iqm"]
    assert groups.nth(0).locator("td").nth(0).text_content() == "algo.lr=0.0003 *"
    assert (
        groups.nth(0).locator("td").nth(2).text_content()
        == f"{first['value']:.4g} [{first['low']:.4g}, {first['high']:.4g}]"
    )
    assert page.locator("#verdict").text_content() == api["verdict"]
    varying = page.locator("table.varying-table")
    assert varying.locator("th").all_text_contents() == ["key", *SWEEP]
    assert varying.locator("tbody tr td:first-child").all_text_contents() == ["group", "seed", "algo.lr"]
    assert varying.locator("tbody tr").nth(2).locator("td").all_text_contents() == [
        "algo.lr",
        "0.0003",
        "0.0003",
        "0.001",
    ]
    assert "run=sweep" in page.url  # the selection is in the URL, so the view can be shared
    screenshot(page, "runs")
    _check_clean(page)


def test_queue_page_cancels_a_job(
    runs_root: Path, tmp_path: Path, ui_server: Callable, page: Any, screenshot: Callable
) -> None:
    db = tmp_path / "queue.db"
    with JobQueue(db) as q:
        first = q.add(["pickaxe", "train", "cartpole-ppo"], name="<b>first</b>", priority=1)
        q.add(["pickaxe", "train", "cartpole-dqn"], name="second", depends_on=[first])
    base = ui_server(create_app(runs_root, queue_db=db))
    page.goto(f"{base}/queue")
    row = page.locator('table.jobs-table tr[data-job="1"]')
    row.wait_for()
    assert row.locator("td").nth(1).text_content() == "<b>first</b>"
    assert row.locator("td.job-state").text_content() == "queued"
    row.locator("button.cancel").click()
    page.wait_for_function(
        "() => document.querySelector('tr[data-job=\"1\"] td.job-state').textContent === 'cancelled'"
    )
    assert page.locator("#message").text_content() == "job 1 cancelled"
    assert page.locator('tr[data-job="2"] td.job-state').text_content() == "blocked"
    with JobQueue(db, create=False) as q:
        assert (q.get(1).state, q.get(2).state) == ("cancelled", "blocked")
    row.locator("button.retry").wait_for()
    screenshot(page, "queue")
    _check_clean(page)


def test_queue_page_without_a_database(runs_root: Path, tmp_path: Path, ui_server: Callable, page: Any) -> None:
    base = ui_server(create_app(runs_root, queue_db=tmp_path / "none.db"))
    page.goto(f"{base}/queue")
    page.wait_for_selector(".px-empty")
    assert "there is no job queue at" in page.locator(".px-empty").text_content()
    assert page.locator("nav.px-nav a.active").text_content() == "Queue"
    _check_clean(page)


def test_checkpoints_page_shows_the_table_and_the_best(
    runs_root: Path, tmp_path: Path, checkpoint_eval: dict, ui_server: Callable, page: Any, screenshot: Callable
) -> None:
    run = runs_root / "llm"
    (run / "eval").mkdir()
    (run / "eval" / "checkpoints.json").write_text(json.dumps(checkpoint_eval))
    base = ui_server(create_app(runs_root, queue_db=tmp_path / "q.db"))
    page.goto(f"{base}/checkpoints?run=llm")
    table = page.locator("table.checkpoints-table")
    table.wait_for()
    assert table.locator("tbody tr").count() == 2
    best = table.locator("tbody tr.best")
    assert best.count() == 1 and best.get_attribute("data-step") == "64"
    assert best.locator("td").nth(3).text_content() == "0.8 [0.75, 0.85]"
    assert (
        page.locator(".best-summary").text_content().startswith("Best: step 64 by rule undominated on eval/reward/gold")
    )
    # "which checkpoint?" first: the selected metric (gold) at the top, the other metrics below
    key = page.locator("#key-charts .chart")
    assert key.count() == 1 and key.nth(0).locator("canvas").count() >= 1
    assert key.nth(0).locator(".px-chart-title").text_content() == "eval/reward/gold (checkpoints)"
    assert key.nth(0).locator(".px-marker-key").text_content() == "alarm proxy_up_gold_down @ 128 · best @ 64"
    assert page.locator("#eval-charts .chart").count() == 1
    top = page.evaluate("(s) => document.querySelector(s).getBoundingClientRect().top", "#key-charts")
    assert top < page.evaluate("document.querySelector('#evaluation').getBoundingClientRect().top")
    assert page.evaluate("document.documentElement.scrollWidth") <= 1280  # nothing wider than the window
    assert page.locator("table.alarms-table tbody tr").count() == 1
    assert page.locator("#training-charts .chart canvas").count() >= 1
    screenshot(page, "checkpoints")
    page.select_option("#run", SWEEP[0])  # a run never evaluated: the command that evaluates it
    page.wait_for_selector("#missing code")
    assert page.locator("#missing code").text_content() == f"pickaxe eval {runs_root / SWEEP[0]} --checkpoints all"
    assert page.locator("#evaluation").is_hidden()
    _check_clean(page)
