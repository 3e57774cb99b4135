"""benchmarks/sharding.py end to end at the tiny shape: one learner and two sharded ones train, each process's
peaks are sampled, and the last line is one JSON object with the figures, the planner's peaks and the ratios."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "sharding.py"


def test_the_sharding_benchmark_measures_one_and_two_sharded_learners_and_ends_with_one_json_line() -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--configs", "one", "fsdp2", "--checkpointing"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    last = json.loads(done.stdout.strip().splitlines()[-1])
    assert last["checkpointing"] is True and last["micro_batch"] == 4  # what the runs were given
    one, two = last["results"]["one"], last["results"]["fsdp2"]
    assert len(one["peak_train_mb"]) == 1 and len(two["peak_train_mb"]) == 2  # rank 0 and the learner it started
    assert all(mb > 0 for mb in two["peak_train_mb"]) and one["update_s"] > 0 and two["update_s"] > 0
    assert two["gather_share"] > 0 and 0 < two["gather_share_of_step"] < two["gather_share"]  # the step is longer
    assert set(two["plan"]) == {"rank 0", "rank 1"} and set(one["plan"]) == {"learner"}
    ratios = last["ratios"]["fsdp2"]
    assert {"peak_train_per_rank_vs_one", "cpu_s_per_token_vs_one", "step_cpu_s_per_token_vs_one"} <= set(ratios)
    assert "train_state_per_rank_vs_one" in ratios and two["step_cpu_s_per_token"] > 0
    assert one["update_cpu_s"] > 0 and two["update_cpu_s"] > 0  # rank 0's logged CPU, plus the other learner's
    assert 0.45 < ratios["train_state_per_rank_vs_one"] < 0.55  # each learner holds half of the training state
