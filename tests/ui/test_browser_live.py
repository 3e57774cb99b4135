"""The web app as the place to watch and steer runs, in headless Chromium: metrics appear while a run's
metrics.jsonl grows, a live change from the Run page lands where ``pickaxe set`` writes it and is applied, a
sweep's queue is listed and a run queued, identical arena answers never reach a voter and a vote that got no
answer is retried or marked not stored, a group evaluated once is drawn, and the playground says when it is
loading and when the server is unreachable. Screenshots go to the artifacts folder (see conftest)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pickaxe.exp.queue_store import JobQueue
from pickaxe.runs.status import write_status
from pickaxe.ui.app import create_app


def _clean(page: Any) -> None:
    assert page.outside_requests == [] and page.js_errors == []


def _append(run: Path, *records: dict[str, Any]) -> None:
    with open(run / "metrics.jsonl", "a") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")


def test_live_metrics_appear_while_the_run_writes_them(
    runs_root: Path, make_run: Callable[..., Path], ui_server: Callable, page: Any, screenshot: Callable
) -> None:
    run = make_run(runs_root / "live", evals={1000: 10.0}, state="running", real_config=True)
    write_status(run, "running", phase="loading", step=0)
    base = ui_server(create_app(runs_root, queue_db=runs_root / "q.db"))
    page.goto(f"{base}/run?run=live")
    page.wait_for_selector('.metric-chart[data-metric="loss/policy"] canvas')
    state = page.locator("#state")
    assert state.text_content() == "warming up (loading)" and not page.locator("#phase-note").is_hidden()
    groups = page.locator("details.metric-group summary .group-name").all_text_contents()
    assert groups[:3] == ["eval", "rollout", "loss"] and groups[-1] == "time"
    write_status(run, "running", phase="training", step=2000)
    _append(run, {"step": 2000, "loss/policy": 0.05, "loss/kl": 0.01, "rollout/return_mean": 30.0})
    page.wait_for_selector('.metric-chart[data-metric="loss/kl"] canvas')  # a new metric, no reload
    page.wait_for_function(
        "() => document.querySelector('.metric-chart[data-metric=\"loss/policy\"]').dataset.points === '2'"
    )
    page.wait_for_function("() => document.querySelector('#state').textContent === 'running (training)'")
    page.fill("#search", "kl")
    assert page.locator(".metric-chart:visible").count() == 1
    assert page.locator(".metric-chart:visible").get_attribute("data-metric") == "loss/kl"
    page.fill("#search", "")
    screenshot(page, "run-live")
    _clean(page)


def test_a_live_change_from_the_page_is_written_like_pickaxe_set_and_applied(
    runs_root: Path, make_run: Callable[..., Path], ui_server: Callable, page: Any
) -> None:
    from pickaxe.recipes.args import load_run_config
    from pickaxe.train.overrides import Override, OverrideLog, mutable_keys

    run = make_run(runs_root / "live", evals={1000: 10.0}, state="running", real_config=True)
    base = ui_server(create_app(runs_root, queue_db=runs_root / "q.db"))
    page.goto(f"{base}/run?run=live")
    page.wait_for_selector('#set-key option[value="algo.lr"]', state="attached")
    page.select_option("#set-key", "algo.lr")
    assert page.input_value("#set-value") == "0.0003" and "> 0 and <= 10" in page.text_content("#set-range")
    page.fill("#set-value", "-1")
    page.click("#set-apply")
    page.wait_for_function("() => document.querySelector('#error').textContent.includes('algo.lr must be > 0')")
    assert not (run / "control").exists()
    page.fill("#set-value", "1e-4")
    page.click("#set-apply")
    page.wait_for_function("() => document.querySelector('#set-message').textContent.includes('queued')")
    (request,) = (run / "control").iterdir()
    assert json.loads(request.read_text()) == {"algo.lr": 1e-4}
    page.wait_for_selector(".pending")
    # the Trainer's side at its next update boundary, then a resume replaying it
    allowed = mutable_keys(load_run_config(run).algo)
    assert OverrideLog(run, allowed).take(1500) == [Override(1500, "algo.lr", 1e-4)]
    assert OverrideLog(run, allowed).take(1500) == [Override(1500, "algo.lr", 1e-4)]
    page.wait_for_selector("table.overrides-table tbody tr")  # the page follows the run's history
    assert page.locator("table.overrides-table tbody td").all_text_contents() == ["1,500", "algo.lr", "0.0001"]
    _clean(page)


def test_a_sweeps_queue_is_listed_and_a_run_queued(
    runs_root: Path, tmp_path: Path, ui_server: Callable, page: Any, screenshot: Callable
) -> None:
    sweep = runs_root / "sweep-cartpole-ppo-1a2b"
    sweep.mkdir()
    (sweep / "sweep.json").write_text("{}\n")
    with JobQueue(sweep / "queue.db") as q:
        first = q.add(["pickaxe", "train", "cartpole-ppo"], name="lr=3e-4 seed 0", priority=2)
        q.add(["pickaxe", "train", "cartpole-ppo"], name="lr=3e-4 seed 1", depends_on=[first])
    base = ui_server(create_app(runs_root, queue_db=tmp_path / "default.db"))
    page.goto(f"{base}/queue")
    option = page.locator('#queue option[value="sweep-cartpole-ppo-1a2b"]')
    option.wait_for(state="attached")
    assert option.text_content() == "sweep sweep-cartpole-ppo-1a2b (2 queued)"
    page.select_option("#queue", "sweep-cartpole-ppo-1a2b")
    page.wait_for_selector('table.jobs-table tr[data-job="2"]')
    assert page.locator('tr[data-job="2"] td.job-after').text_content() == "1"
    assert page.locator('tr[data-job="1"] td').nth(3).text_content() == "2"  # priority
    assert "queue=sweep-cartpole-ppo-1a2b" in page.url
    screenshot(page, "queue-sweep")
    page.select_option("#queue", "default")
    page.fill("#add-recipe", "cartpole-ppo")
    page.fill("#add-flags", "--algo.lrr 1e-4")
    page.click("#add")
    page.wait_for_function("() => document.querySelector('#error').textContent.includes('did you mean --algo.lr')")
    assert not (tmp_path / "default.db").exists()  # refused before the queue was even created
    page.fill("#add-flags", "--algo.lr 1e-4")
    page.fill("#add-priority", "4")
    page.click("#add")
    page.wait_for_selector('table.jobs-table tr[data-job="1"]')
    with JobQueue(tmp_path / "default.db", create=False) as q:
        (job,) = q.list()
    assert job.priority == 4 and job.argv[5:7] == ["--algo.lr", "1e-4"]
    _clean(page)


def test_identical_answers_never_reach_a_voter_and_counts_follow_votes(
    runs_root: Path, identical_arena: Callable, ui_server: Callable, page: Any, screenshot: Callable
) -> None:
    identical_arena(runs_root / "llm" / "arena.sqlite")
    base = ui_server(create_app(runs_root, queue_db=runs_root / "q.db"))
    page.goto(f"{base}/arena")
    page.wait_for_selector("#match:not([hidden])")
    assert page.locator("#identical").get_attribute("data-count") == "13"
    for n in range(1, 4):
        assert page.text_content("#left") != page.text_content("#right")
        page.click('button[data-choice="left"]')
        page.wait_for_function(f"() => document.querySelector('#status').dataset.votes === '{n}'")
        page.wait_for_function(f"() => document.querySelector('#board').dataset.votes === '{n}'")
        assert f"{n} votes" in page.locator("#arena option").first.text_content()
    screenshot(page, "arena-identical")
    # a vote whose first try gets no answer is sent again and stored once
    tries: list[str] = []

    def flaky(route: Any) -> None:
        tries.append(route.request.url)
        route.abort() if len(tries) == 1 else route.continue_()

    page.route("**/api/arena/vote", flaky)
    page.click('button[data-choice="tie"]')
    page.wait_for_function("() => document.querySelector('#status').dataset.votes === '4'")
    assert len(tries) == 2
    page.unroute("**/api/arena/vote")
    _clean(page)


def test_a_vote_that_cannot_be_sent_is_marked_not_stored(
    runs_root: Path, identical_arena: Callable, ui_server: Callable, page: Any
) -> None:
    identical_arena(runs_root / "llm" / "arena.sqlite")
    base = ui_server(create_app(runs_root, queue_db=runs_root / "q.db"))
    page.goto(f"{base}/arena")
    page.wait_for_selector("#match:not([hidden])")
    page.route("**/api/arena/vote", lambda route: route.abort())
    page.click('button[data-choice="right"]')
    page.wait_for_function("() => document.querySelector('#error').textContent.includes('NOT stored')", timeout=20000)
    assert "cannot reach the pickaxe ui server" in page.text_content("#error")
    assert page.locator("#match").get_attribute("data-unsent") == "right"
    assert page.locator('button[data-choice="right"]').is_enabled()  # voting again retries
    _clean(page)


def test_a_group_evaluated_once_is_drawn(
    runs_root: Path, make_run: Callable[..., Path], ui_server: Callable, page: Any, screenshot: Callable
) -> None:
    for seed, value in ((0, 40.0), (1, 50.0)):
        make_run(runs_root / "once" / f"seed-{seed}", seed=seed, lr=1e-2, evals={2000: value})
    base = ui_server(create_app(runs_root, queue_db=runs_root / "q.db"))
    runs = ["once/seed-0", "once/seed-1", "sweep/lr=0.0003/seed-0", "sweep/lr=0.0003/seed-1"]
    page.goto(f"{base}/runs?" + "&".join(f"run={r}" for r in runs))
    page.wait_for_function("() => { const c = document.querySelector('#chart'); return c && c._uplot; }")
    # the IQM of the group evaluated once is a single point (45 at step 2000, amid the other group's curves from 1000
    # to 3000, which pass through 60-80 there): its marker is on the canvas
    marked = page.evaluate(
        """() => {
        const u = document.querySelector('#chart')._uplot;
        const i = u.series.findIndex((s) => s.label && s.label.startsWith('algo.lr=0.01') && s.label.includes('IQM'));
        if (i < 0) return -1;
        const x = Math.round(u.valToPos(2000, 'x', true)), y = Math.round(u.valToPos(45, u.series[i].scale, true));
        const d = u.ctx.getImageData(x - 4, y - 4, 9, 9).data;
        let n = 0;  // pixels of the group's colour (#2f6fdb) around the point
        for (let k = 0; k < d.length; k += 4) {
            if (d[k + 3] > 200 && Math.abs(d[k] - 47) < 40 && Math.abs(d[k + 1] - 111) < 40 && d[k + 2] > 180) n++;
        }
        return n;
    }"""
    )
    assert marked >= 20  # a visible marker (a lone point without one leaves at most a few pixels)
    screenshot(page, "runs-single-point-group")
    _clean(page)


def test_playground_shows_loading_and_an_unreachable_server(runs_root: Path, ui_server: Callable, page: Any) -> None:
    base = ui_server(create_app(runs_root, queue_db=runs_root / "q.db"))
    held: list[Any] = []
    page.route("**/api/playground/runs", lambda route: held.append(route))
    page.goto(f"{base}/playground")
    page.wait_for_function("() => document.querySelector('#status').textContent.startsWith('loading')")
    assert page.locator("#run option").text_content() == "loading…" and page.locator("#go").is_disabled()
    held[0].continue_()
    page.wait_for_function("() => !document.querySelector('#status').dataset.busy")
    page.unroute("**/api/playground/runs")
    page.route("**/api/playground/runs", lambda route: route.abort())
    page.reload()
    page.wait_for_function("() => document.querySelector('#error').textContent.length > 0")
    text = page.text_content("#error")
    assert "cannot reach the pickaxe ui server" in text and "Failed to fetch" not in text
    _clean(page)
