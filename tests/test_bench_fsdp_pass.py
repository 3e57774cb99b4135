"""benchmarks/fsdp_pass.py end to end at the tiny shape: one process and two sharded learners each run their
passes and the last line is one JSON object with each token count's CPU seconds and page faults."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "fsdp_pass.py"


def test_the_pass_benchmark_measures_one_process_and_two_sharded_learners_per_token_count() -> None:
    done = subprocess.run([sys.executable, str(BENCH), "--quick"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    last = json.loads(done.stdout.strip().splitlines()[-1])
    assert [r["tokens"] for r in last["rows"]] == [8, 64] and last["shape"] == "tiny-qwen2"
    for row in last["rows"]:
        assert row["sharded_cpu_s_per_learner"] >= 0 and row["one_faults"] > 0 and row["sharded_faults_per_learner"] > 0
        assert row["overhead_s"] == row["sharded_cpu_s_per_learner"] - row["one_cpu_s"]


def test_a_bad_token_count_is_refused() -> None:
    done = subprocess.run([sys.executable, str(BENCH), "--tokens", "0"], capture_output=True, text=True)
    assert done.returncode == 2 and "--tokens and --passes must be 1 or more" in done.stderr
