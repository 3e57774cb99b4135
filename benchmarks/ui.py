"""Page load time of ``pickaxe ui``'s Runs page with 200 runs (or ``--runs 1000``): the HTML, its scripts and
``/api/runs``.

Writes ``--runs`` fake run folders shaped like real ones (a sweep of configs x seeds, each with ``config.json``,
``status.json`` and a ``metrics.jsonl`` of ``--records`` training records of ~35 keys plus an eval record every 10),
serves the app with uvicorn on 127.0.0.1 and measures, median of ``--repeats``:

- ``cold_api_ms``: the first ``/api/runs`` (every run's summary read);
- ``page_ms``: a warm page load over HTTP (the HTML, style.css, common.js, runs.js, uPlot and ``/api/runs``);
- ``api_ms``: ``/api/runs`` alone, warm; ``api_one_changed_ms``: with one run's metrics.jsonl appended to;
- ``compare_ms``: ``/api/runs/compare`` of 10 runs (2 configs x 5 seeds, with the IQM bands);
- ``browser_ms`` (when Chromium and Playwright are there): headless Chromium from navigation to the 200-row
  table drawn; ``browser_tick_chart_ms`` from ticking 10 runs (2 configs x 5 seeds) to their chart drawn;
  ``browser_url_chart_ms`` from opening a shared ``/runs?run=...`` of 10 other runs to their chart drawn
  (``*_first_ms``: the first repeat, before the app had cached those runs' records).

Usage: ``python benchmarks/ui.py [--runs 200] [--records 300] [--repeats 9] [--no-browser] [--budget-ms MS]``; the
last line is one JSON object. ``--budget-ms`` makes it a check: it exits 1 when the warm page load over HTTP
(``page_ms``) or in Chromium (``browser_ms``) takes longer (the app's target: 1,000 runs in 1,000 ms,
``--runs 1000 --budget-ms 1000``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import socket
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from pickaxe.runs.status import write_status
from pickaxe.ui.app import create_app

CHROMIUM = "/usr/bin/chromium"
ASSETS = ["/static/style.css", "/static/common.js", "/static/runs.js", "/static/vendor/uPlot.iife.min.js",
          "/static/vendor/uPlot.min.css"]  # fmt: skip


def make_runs(root: Path, n: int, records: int) -> list[str]:
    """``n`` run folders under ``root/sweep/lr=X/seed-S`` (5 seeds per config); returns their ids."""
    rng = random.Random(0)
    ids = []
    for i in range(n):
        lr, seed = 1e-4 * (1 + i // 5), i % 5
        rel = f"sweep/lr={lr:.4g}/seed-{seed}"
        run = root / rel
        run.mkdir(parents=True)
        config = {"recipe": "cartpole-ppo", "kind": "classic", "seed": seed, "device": "cpu",
                  "algo": {"lr": lr, "gamma": 0.99, "clip": 0.2, "epochs": 10, "vf_coef": 0.5},
                  "env": {"id": "CartPole-v1", "num_envs": 8},
                  "trainer": {"total_steps": records * 512, "eval_every": 5120, "log_every": 512}}  # fmt: skip
        (run / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
        lines = []
        for r in range(records):
            step = (r + 1) * 512
            rec: dict[str, Any] = {"step": step, "time/elapsed_s": 0.05 * r}
            rec.update({f"train/k{k}": rng.random() for k in range(33)})
            lines.append(json.dumps(rec))
            if r % 10 == 9:
                v = 500 * (1 - 0.99**r) * rng.uniform(0.8, 1.0)
                ev = {"step": step, "eval/return_mean": v, "eval/return_mean_ci_low": v - 20,
                      "eval/return_mean_ci_high": v + 20, "eval/return_std": 10.0, "eval/length_mean": v}  # fmt: skip
                lines.append(json.dumps(ev))
        (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
        write_status(run, "finished", step=records * 512, total_steps=records * 512)
        ids.append(rel)
    return ids


def serve(app: Any) -> tuple[str, uvicorn.Server, threading.Thread]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    return f"http://127.0.0.1:{sock.getsockname()[1]}", server, thread


def timed(fn: Any, repeats: int) -> float:
    """Median wall milliseconds of ``fn()`` over ``repeats`` calls."""
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(1e3 * (time.perf_counter() - t))
    return statistics.median(times)


def browser_times(base: str, ids: list[str], repeats: int) -> dict[str, float]:
    """Headless Chromium: the Runs page drawn, ticking 10 runs until their chart is drawn, and a shared URL of
    10 other runs until their chart is drawn (``*_first_ms``: the first time, before the app cached those runs)."""
    from playwright.sync_api import sync_playwright

    args = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--no-first-run"]  # fmt: skip
    drawn = ("document.querySelector('#chart') && document.querySelector('#chart')._uplot "
             "&& document.querySelector('#chart').dataset.series === '12'")  # fmt: skip
    out: dict[str, list[float]] = {"browser_ms": [], "browser_tick_chart_ms": [], "browser_url_chart_ms": []}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=args)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        for _ in range(repeats):
            t = time.perf_counter()
            page.goto(f"{base}/runs")
            page.wait_for_function(f"document.querySelectorAll('table.runs-table tbody tr').length === {len(ids)}")
            out["browser_ms"].append(1e3 * (time.perf_counter() - t))
            t = time.perf_counter()
            for rid in ids[:10]:
                page.locator(f'input[data-run="{rid}"]').check()
            page.wait_for_function(drawn)
            out["browser_tick_chart_ms"].append(1e3 * (time.perf_counter() - t))
            t = time.perf_counter()
            page.goto(f"{base}/runs?" + "&".join(f"run={r}" for r in ids[10:20]))
            page.wait_for_function(drawn)
            out["browser_url_chart_ms"].append(1e3 * (time.perf_counter() - t))
        browser.close()
    result = {k: statistics.median(v) for k, v in out.items()}
    result.update({k.replace("_ms", "_first_ms"): v[0] for k, v in out.items() if k != "browser_ms"})
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--records", type=int, default=300, help="training records per run")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--no-browser", action="store_true")
    parser.add_argument("--budget-ms", type=float, default=None, help="exit 1 when a warm page load takes longer")
    args = parser.parse_args(argv)
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    tmp = Path(tempfile.mkdtemp(prefix="pickaxe-ui-bench-"))
    try:
        ids = make_runs(tmp / "runs", args.runs, args.records)
        size = sum(f.stat().st_size for f in (tmp / "runs").rglob("metrics.jsonl"))
        print(f"{args.runs} runs, {size / 1e6:.1f} MB of metrics.jsonl")
        app = create_app(tmp / "runs", queue_db=tmp / "none.db")
        base, server, thread = serve(app)
        with httpx.Client(base_url=base, timeout=60) as client:
            t = time.perf_counter()
            assert len(client.get("/api/runs").json()["runs"]) == args.runs
            cold = 1e3 * (time.perf_counter() - t)

            def page() -> None:
                assert client.get("/runs").status_code == 200
                for a in ASSETS:
                    assert client.get(a).status_code == 200
                assert client.get("/api/runs").status_code == 200

            page_ms = timed(page, args.repeats)
            api_ms = timed(lambda: client.get("/api/runs"), args.repeats)
            metrics = tmp / "runs" / ids[0] / "metrics.jsonl"

            def one_changed() -> None:
                with open(metrics, "a") as f:
                    f.write(json.dumps({"step": 10**9, "time/elapsed_s": 1.0}) + "\n")
                client.get("/api/runs")

            changed_ms = timed(one_changed, args.repeats)
            params = [("run", r) for r in ids[:10]]
            compare_ms = timed(lambda: client.get("/api/runs/compare", params=params).raise_for_status(), args.repeats)
        result = {"runs": args.runs, "metrics_mb": round(size / 1e6, 1), "cold_api_ms": round(cold, 1),
                  "page_ms": round(page_ms, 1), "api_ms": round(api_ms, 1),
                  "api_one_changed_ms": round(changed_ms, 1), "compare_ms": round(compare_ms, 1)}  # fmt: skip
        if not args.no_browser and Path(CHROMIUM).exists():
            try:
                result.update({k: round(v, 1) for k, v in browser_times(base, ids, args.repeats).items()})
            except ImportError:
                print("playwright is missing: no browser figures")
        server.should_exit = True
        thread.join(10)
        for k, v in result.items():
            print(f"{k:>20}: {v}")
        print(json.dumps(result))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if args.budget_ms is not None:
        over = {k: result[k] for k in ("page_ms", "browser_ms") if k in result and result[k] > args.budget_ms}
        verdict = f"OVER {over}" if over else "met"
        print(f"budget {args.budget_ms:g} ms for a warm page load of {args.runs} runs: {verdict}")
        if over:
            raise SystemExit(1)


if __name__ == "__main__":
    main()
