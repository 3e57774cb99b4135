"""benchmarks/results.py's table builder, run-folder reader and marker replacement (no training)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "results.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_results", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_results"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def _seed(bench: ModuleType, seed: int, solved: int | None, final: float, best: float, wall: float = 10.0) -> object:
    return bench.SeedRecord(
        seed=seed, steps=solved or 20_000, final_return=final, best_return=best, untrained_return=-1200.0 - seed,
        solved_step=solved, wall_s=wall,
    )  # fmt: skip


def test_medians_count_not_reached_as_infinitely_slow(bench: ModuleType) -> None:
    result = bench.RecipeResult("pendulum-sac", 20_000, -250.0, "pickaxe train pendulum-sac")
    result.seeds = [
        _seed(bench, 0, 2_016, -180.0, -150.0, wall=9.0),
        _seed(bench, 1, None, -700.0, -400.0, wall=30.0),
        _seed(bench, 2, 3_008, -200.0, -170.0, wall=12.0),
    ]
    s = bench.summarize(result)
    assert s["solved_median"] == 3_008  # (2,016, 3,008, inf) -> the middle one
    assert s["reached"] == 2
    assert (s["final_median"], s["final_min"], s["final_max"]) == (-200.0, -700.0, -180.0)
    assert s["best_median"] == -170.0
    assert s["untrained_median"] == -1201.0
    assert s["wall_median_s"] == 12.0
    row = bench.build_table([result]).splitlines()[2]
    assert "3,008 (2,016 / not reached / 3,008; 2/3 reached)" in row
    assert "-200 [-700 to -180]" in row

    result.seeds[2] = _seed(bench, 2, None, -900.0, -600.0)
    s = bench.summarize(result)
    assert s["solved_median"] is None and s["reached"] == 1  # two of three never reached: the median is inf
    assert "| not reached (2,016 / not reached / not reached; 1/3 reached) |" in bench.build_table([result])


def test_no_target_and_random_level_note(bench: ModuleType) -> None:
    result = bench.RecipeResult("pong-dqn", 24_000, None, "pickaxe train pong-dqn --device cuda")
    result.seeds = [_seed(bench, i, None, -21.0 + i * 0.5, -20.0) for i in range(3)]
    row = bench.build_table([result]).splitlines()[2]
    assert "| no target |" in row
    assert "random level at this budget" in row and "above" not in row
    assert bench.summarize(result)["solved_steps"] is None


def test_read_run_takes_eval_records_from_metrics_and_state_from_status(bench: ModuleType, tmp_path: Path) -> None:
    records = [
        {"step": 1_024, "eval/return_mean": -900.0, "time/elapsed_s": 5.0},
        {"step": 1_536, "loss/critic": 0.3, "time/elapsed_s": 6.0},  # not an evaluation
        {"step": 2_048, "eval/return_mean": -240.0, "time/elapsed_s": 9.5},
        {"step": 3_072, "eval/return_mean": -260.0, "time/elapsed_s": 14.0},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (tmp_path / "status.json").write_text(json.dumps({"state": "finished", "step": 3_072}))
    rec = bench.read_run(tmp_path, 0, -250.0, -1100.0)
    assert (rec.steps, rec.solved_step, rec.final_return, rec.best_return) == (3_072, 2_048, -260.0, -240.0)
    assert (rec.wall_s, rec.untrained_return, rec.state) == (14.0, -1100.0, "finished")
    empty = bench.read_run(tmp_path / "missing", 1, -250.0, None)
    assert empty.final_return is None and empty.state == "missing"

    # a run killed mid-write leaves a torn last line: the records before it are read, not an exception raised
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write('{"step": 4096, "eval/retu')
    torn = bench.read_run(tmp_path, 0, -250.0, -1100.0)
    assert (torn.steps, torn.solved_step, torn.final_return) == (3_072, 2_048, -260.0)


def test_marker_replacement_keeps_the_rest_and_a_missing_marker_is_an_error(bench: ModuleType, tmp_path: Path) -> None:
    text = f"# Title\n\nprose before\n\n{bench.BEGIN}\nold table\n{bench.END}\n\nprose after\n"
    out = bench.replace_block(text, "| new |\n")
    assert out == f"# Title\n\nprose before\n\n{bench.BEGIN}\n| new |\n{bench.END}\n\nprose after\n"
    assert bench.replace_block(out, "| newer |") == out.replace("| new |", "| newer |")  # idempotent shape
    with pytest.raises(bench.MarkerError, match="results:begin"):
        bench.replace_block("no markers here\n", "| new |")
    with pytest.raises(bench.MarkerError):
        bench.replace_block(f"{bench.END}\n{bench.BEGIN}\n", "| new |")  # wrong order

    doc = tmp_path / "doc.md"
    doc.write_text("no markers\n")
    assert bench.main(["--recipes", "pendulum-sac", "--write", str(doc)]) == 2  # before any training
    assert doc.read_text() == "no markers\n"


def test_merge_replaces_only_the_measured_rows_and_keeps_the_older_lines(bench: ModuleType) -> None:
    head = "| recipe | budget |\n|---|---|"
    old = f"\n{head}\n| `a` | 1 |\n| `b` | 2 |\n\nGenerated by `x`; runs started then.\n"
    new = bench.merge_block(old, f"{head}\n| `b` | 20 |\n| `c` | 30 |", "Generated by `y`.")
    assert new == (
        f"{head}\n| `a` | 1 |\n| `b` | 20 |\n| `c` | 30 |\n\nGenerated by `x`; runs started then.\n\n"
        "Rows `b`, `c`: Generated by `y`."
    )
    again = bench.merge_block(new, f"{head}\n| `a` | 10 |", "Generated by `z`.")
    assert again.splitlines()[2] == "| `a` | 10 |" and again.endswith("Rows `a`: Generated by `z`.")
    assert "Rows `b`, `c`: Generated by `y`." in again  # earlier lines stay
    third = bench.merge_block(again, f"{head}\n| `b` | 200 |\n| `c` | 300 |", "Generated by `w`.")
    assert "Rows `b`, `c`: Generated by `y`." not in third  # ... unless every row they name was measured again
    assert "Rows `a`: Generated by `z`." in third and third.endswith("Rows `b`, `c`: Generated by `w`.")


@pytest.mark.parametrize(
    ("args", "message"),
    [(["--seeds", "0"], "--seeds takes a whole number >= 1"), (["--write", "missing.md"], "is not a file")],
)
def test_bad_seeds_or_write_file_is_one_line_and_exit_2_before_any_training(
    bench: ModuleType, args: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if args[0] == "--write":
        args = ["--write", str(tmp_path / args[1])]
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--recipes", "pendulum-sac", *args])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err.strip().splitlines()[-1]


def test_budget_option_is_checked(bench: ModuleType) -> None:
    assert bench.parse_budgets(["hopper-ppo=4096"], ["hopper-ppo"])["hopper-ppo"] == 4096
    with pytest.raises(ValueError, match="RECIPE=STEPS"):
        bench.parse_budgets(["hopper-ppo"], ["hopper-ppo"])
    with pytest.raises(ValueError, match="not among the recipes"):
        bench.parse_budgets(["pong-dqn=10"], ["hopper-ppo"])


def test_machine_line_names_the_command_times_and_loads_without_storage_options(bench: ModuleType) -> None:
    result = bench.RecipeResult("pendulum-sac", 20_000, -250.0, "pickaxe train pendulum-sac")
    result.seeds = [_seed(bench, 0, 2_016, -180.0, -150.0), _seed(bench, 1, 3_008, -190.0, -160.0)]
    result.seeds[0].started, result.seeds[0].load_average = 1_796_180_000.0, 1.5  # 2026-12-02 02:53 UTC
    result.seeds[1].started, result.seeds[1].load_average = 1_796_183_600.0, 3.25
    argv = ["--recipes", "pendulum-sac", "--root", "/tmp/x", "--reuse", "--write", "docs/algorithms.md"]
    line = bench.machine_line(argv, 1, [result])
    assert "`python benchmarks/results.py --recipes pendulum-sac`" in line
    assert "2026-12-02 02:53 to 03:53 UTC" in line
    assert "load average (1 min) 1.50 to 3.25" in line and "torch 1 thread per run" in line
