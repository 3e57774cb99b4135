"""Agent tool-call latency and the python tool's throughput under concurrency.

Latency: ``ToolBox.call`` timed end to end, p50 / p95 per tool: ``calculator`` (``987654321*123456789``), ``lookup``
(a hit in a 10,000-key corpus) and ``python`` (``print(1)`` in a fresh ``ProcessSandbox`` process), plus the same
``print(1)`` as a bare ``python -I -S -c`` subprocess (no sandbox layers) to show what the layers cost.
Throughput: ``--calls`` python calls (``print(sum(range(10**5)))``) issued as ``ToolBox.call_many`` batches of 1, 2,
4 and 8 (``max_workers`` = the batch size), in calls/s.

    python benchmarks/tools.py [--quick] [--python-calls 60] [--calls 48] [--concurrency 1,2,4,8]

Prints a report and, as its last line, one JSON object: ``<tool>_ms_p50`` / ``<tool>_ms_p95`` for ``calculator``,
``lookup``, ``python`` and ``bare_python``; ``python_calls_per_s_<k>`` per concurrency ``k``; ``isolation`` (the
sandbox layers active on this machine); ``load_average``; ``cpus``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable

import numpy as np

from pickaxe.envs.agents.sandbox import ProcessSandbox, SandboxLimits
from pickaxe.envs.agents.tools import Calculator, Lookup, PythonTool, ToolBox


def _percentiles(seconds: list[float]) -> tuple[float, float]:
    ms = np.asarray(seconds) * 1000
    return float(np.percentile(ms, 50)), float(np.percentile(ms, 95))


def _time_calls(fn: Callable[[], object], n: int) -> list[float]:
    out = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer calls (smoke run)")
    parser.add_argument("--fast-calls", type=int, default=5000, help="timed calls of calculator and lookup")
    parser.add_argument("--python-calls", type=int, default=60, help="timed single python calls")
    parser.add_argument("--calls", type=int, default=48, help="python calls per throughput measurement")
    parser.add_argument("--concurrency", default="1,2,4,8")
    args = parser.parse_args(argv)
    if args.quick:
        args.fast_calls, args.python_calls, args.calls = 500, 12, 16
    levels = [int(k) for k in args.concurrency.split(",")]
    print(f"load average at start: {os.getloadavg()[0]:.2f} ({os.cpu_count()} cpus)")

    sandbox = ProcessSandbox()
    limits = SandboxLimits()
    isolation = sandbox.isolation  # probes once, outside the timings
    print("sandbox layers: " + ", ".join(k for k, v in isolation.items() if v))
    print("not active: " + (", ".join(k for k, v in isolation.items() if not v) or "none"))

    corpus = {f"key-{i}": f"value number {i}" for i in range(10_000)}
    box = ToolBox([Calculator(), Lookup(corpus), PythonTool(sandbox, limits)])
    result: dict[str, object] = {}
    cases: list[tuple[str, Callable[[], object], int]] = [
        ("calculator", lambda: box.call("calculator", {"expression": "987654321*123456789"}), args.fast_calls),
        ("lookup", lambda: box.call("lookup", {"key": "key-4242"}), args.fast_calls),
        ("python", lambda: box.call("python", {"code": "print(1)"}), args.python_calls),
        (
            "bare_python",
            lambda: subprocess.run([sys.executable, "-I", "-S", "-c", "print(1)"], capture_output=True, check=True),
            args.python_calls,
        ),
    ]
    print(f"\n{'tool':<12} {'calls':>6} {'p50 ms':>9} {'p95 ms':>9}")
    for name, fn, n in cases:
        fn()  # warm-up
        p50, p95 = _percentiles(_time_calls(fn, n))
        result[f"{name}_ms_p50"], result[f"{name}_ms_p95"] = round(p50, 4), round(p95, 4)
        print(f"{name:<12} {n:>6} {p50:>9.3f} {p95:>9.3f}")
    ok = box.call("python", {"code": "print(1)"})
    assert ok.ok and ok.text == "1", ok
    box.close()

    print(f"\npython tool throughput, {args.calls} calls of print(sum(range(10**5))) as call_many batches")
    print(f"{'concurrent':>10} {'seconds':>9} {'calls/s':>9} {'x of 1':>7}")
    base = None
    code = {"code": "print(sum(range(10**5)))"}
    for k in levels:
        with ToolBox([PythonTool(sandbox, limits)], max_workers=k) as pbox:
            pbox.call_many([("python", code)] * k)  # warm the pool
            start = time.perf_counter()
            results = []
            for i in range(0, args.calls, k):
                results += pbox.call_many([("python", code)] * min(k, args.calls - i))
            elapsed = time.perf_counter() - start
        assert all(r.ok for r in results), [r for r in results if not r.ok][:1]
        rate = len(results) / elapsed
        base = base or rate
        result[f"python_calls_per_s_{k}"] = round(rate, 2)
        print(f"{k:>10} {elapsed:>9.2f} {rate:>9.1f} {rate / base:>7.2f}")

    result["isolation"] = isolation
    result["load_average"] = round(os.getloadavg()[0], 2)
    result["cpus"] = os.cpu_count()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
