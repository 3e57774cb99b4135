"""benchmarks/llm.py: the memory and floor pieces on tiny shapes, the FLOP formula and the one-JSON-line contract."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "llm.py"


def load_bench():
    """The benchmark script as a module."""
    spec = importlib.util.spec_from_file_location("bench_llm", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_update_flops_match_hand_count() -> None:
    """Forward = 2 x layer weights x tokens + 2 x H x V x completion tokens + causal attention; update = 3 x."""
    from transformers import Qwen2Config

    bench = load_bench()
    cfg = Qwen2Config(
        vocab_size=10, hidden_size=8, intermediate_size=16, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1,
    )  # fmt: skip
    # one layer: q 8x8, k 8x4, v 8x4, o 8x8, gate/up 8x16, down 16x8 = 64+32+32+64+128+128+128 = 576
    lengths, completion = [3, 5], 4
    dense = 2 * (2 * 576) * 8
    head = 2 * 8 * 10 * 4
    attention = 2 * 2 * 8 * (3 * 4 + 5 * 6)
    f = bench.update_flops(cfg, lengths, completion)
    assert f["dense"] == dense and f["head"] == head and f["attention"] == attention
    assert f["update"] == 3 * (dense + head + attention)


def test_memory_cases_in_process_report_their_peak() -> None:
    """Each memory case (pickaxe log-probs, one GRPO update, the naive full logits) runs on a tiny shape and reports
    a peak at least its starting RSS, the rise over it and the time taken."""
    bench = load_bench()
    shape = {"hidden": 16, "layers": 1, "batch": 8, "prompt": 6, "new": 2, "vocab": 256}
    for case in ("pickaxe-logprobs", "pickaxe-update", "naive"):
        r = bench.memory_child({"case": case, **shape})
        assert r["peak"] >= r["base"] > 0 and r["rise"] >= 0 and r["seconds"] > 0, case
        copies = 3 if case == "pickaxe-update" else 1  # gradients (+ two AdamW moments)
        assert r["beyond_params"] == r["rise"] - copies * 4 * r["params"], case


def test_floor_in_process_on_a_small_batch() -> None:
    """The floor piece: an update of 2 prompts x 8 completions, its FLOPs and the bare-matmul floor of its shapes;
    utilisation is floor time / update time."""
    bench = load_bench()
    r = bench.floor_child({"repeats": 1, "prompts": 2})
    assert r["sequences"] == 16 and 0 < r["completion_tokens"] < r["tokens"] <= r["padded_slots"]
    assert r["floor_s"] == pytest.approx(r["flops"]["update"] / r["matmul_rate"])
    assert r["utilisation"] == pytest.approx(r["floor_s"] / r["update_s"])


def test_ppo_breakdown_phases_add_up_to_the_step() -> None:
    """The ppo piece on 4 prompts: each step's generate / reward / reference / values / update and the small rest
    add up to the step, the shares are those phases over the step, and every completion token is counted."""
    bench = load_bench()
    r = bench.ppo_breakdown(steps=2, warmup=0, prompts=4)
    rows = r["rows"]
    assert r["completions"] == 4  # 1 completion a prompt
    for i in range(2):
        phases = [rows[k][i] for k in bench.PPO_PHASES]
        assert min(phases) > 0 and 0 <= rows["other"][i] < 0.1 * rows["total"][i]
        assert sum(phases) + rows["other"][i] == pytest.approx(rows["total"][i])
        assert 4 <= rows["tokens"][i] <= 4 * 7  # 1 to 7 new tokens each
        assert rows["tokens_per_s"][i] == pytest.approx(rows["tokens"][i] / rows["total"][i])
    for k in bench.PPO_PHASES:
        shares = [x / t for x, t in zip(rows[k], rows["total"], strict=True)]
        assert r["share"][k]["median"] == pytest.approx(sorted(shares)[0] / 2 + sorted(shares)[1] / 2)


def test_unknown_part_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    """A misspelt part is refused with the list of valid ones."""
    bench = load_bench()
    with pytest.raises(SystemExit):
        bench.parse_args(["memroy"])
    assert "unknown part 'memroy'" in capsys.readouterr().err


def test_quick_keeps_explicit_options() -> None:
    """``--quick`` lowers the defaults but an option given on the command line wins."""
    bench = load_bench()
    args = bench.parse_args(["floor", "--quick", "--floor-prompts", "3"])
    assert args.parts == ["floor"] and args.floor_prompts == 3 and args.floor_repeats == bench.QUICK["floor_repeats"]


@pytest.mark.slow
def test_naive_case_fails_at_the_cap_in_a_child() -> None:
    """A case over the address-space cap is reported as failed at the cap, in its own process, instead of taking
    the machine down."""
    bench = load_bench()
    big = {"hidden": 16, "layers": 1, "batch": 64, "prompt": 256, "new": 2, "vocab": 32768}  # logits alone: 2 GiB
    r = bench.run_child({"kind": "memory", "case": "naive", **big}, cap_bytes=int(1.5 * (1 << 30)), timeout=120)
    assert r.get("at_cap") is True, r


@pytest.mark.slow
def test_floor_quick_prints_one_json_line() -> None:
    """``floor --quick`` (a fresh child process) ends with one JSON object holding the floor figures."""
    proc = subprocess.run(
        [sys.executable, str(BENCH), "floor", "--quick", "--floor-prompts", "2"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    floor = summary["floor"]
    assert summary["benchmark"] == "llm" and summary["quick"] is True
    assert floor["utilisation"] == pytest.approx(floor["floor_s"] / floor["update_s"], rel=1e-2)
    assert floor["sequences"] == 16 and floor["completion_tokens"] > 0


@pytest.mark.slow
def test_ppo_quick_prints_one_json_line() -> None:
    """``ppo`` (a fresh process, 4 prompts, 1 step) ends with one JSON object holding each phase's seconds and
    share of the step."""
    proc = subprocess.run(
        [sys.executable, str(BENCH), "ppo", "--quick", "--ppo-steps", "1", "--ppo-prompts", "4"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    ppo = json.loads(proc.stdout.strip().splitlines()[-1])["ppo"]
    assert ppo["steps"] == 1 and ppo["completions_per_step"] == 4
    for phase in ("generate", "reward", "reference", "values", "update"):
        seconds, share = ppo["step_s"][phase]["median"], ppo["share"][phase]["median"]
        assert seconds > 0 and share == pytest.approx(seconds / ppo["step_s"]["total"]["median"], abs=5e-4)
