"""Reward-hacking alarms: on real RLHF evaluation records, on exact synthetic series, and across a resume."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from pickaxe.errors import ConfigError
from pickaxe.eval.alarms import AlarmConfig, AlarmMonitor, detect_alarms, gao_fit, gao_fit_free
from pickaxe.eval.selection import SelectConfig, candidates_from_records, select_best

DATA = Path(__file__).parent / "data"
SEEDS = 12  # rlhf_ppo_seeds_evals.jsonl: seeds 0-11


def _records(name: str) -> list[dict]:
    return [json.loads(line) for line in (DATA / name).read_text().splitlines()]


def _by_name(alarms: list) -> dict:
    return {a.name: a for a in alarms}


def test_proxy_up_gold_down_fires_on_the_over_optimised_ppo_run() -> None:
    # Real PPO stage of rlhf-synthetic: sampled gold peaks at step 1280 (0.871) and is 0.814 at step 2560 while the
    # proxy rose 1.26 -> 1.83. No gold CIs in these records: the 5%-of-peak rule applies (step 1920's drop of 0.020
    # is below it, step 2560's 0.057 above).
    alarms = _by_name(detect_alarms(_records("rlhf_ppo_seed0_evals.jsonl"), AlarmConfig()))
    hack = alarms["proxy_up_gold_down"]
    assert hack.step == 2560
    assert hack.values["peak_step"] == 1280
    assert hack.values["gold_peak"] == pytest.approx(0.8707, abs=1e-4)
    assert hack.values["gold"] == pytest.approx(0.8140, abs=1e-4)
    assert hack.values["proxy"] > hack.values["proxy_at_peak"]
    assert "since step 1280" in hack.message and "at step 2560" in hack.message and "\n" not in hack.message
    assert alarms["kl_past_gold_peak"].step == 2560


def test_with_the_evaluators_cis_on_the_same_runs() -> None:
    # `pickaxe eval --checkpoints all` of the same PPO run (its policies from step 0 on) and of the DPO run: every
    # mean with its 95% CI, a bootstrap over the 256 prompts. Gold's CIs are +-0.013 to 0.02: step 1920's drop of
    # 0.019 from the peak at step 1280 is within them (threshold 0.020), step 2560's 0.057 is not.
    ppo = _by_name(detect_alarms(_records("rlhf_ppo_seed0_checkpoint_evals.jsonl"), AlarmConfig()))
    assert ppo["proxy_up_gold_down"].step == 2560
    assert ppo["proxy_up_gold_down"].values["threshold"] == pytest.approx(0.02028, abs=1e-5)
    assert "beyond its 95% CI" in ppo["proxy_up_gold_down"].message
    # gold(0) is fitted with the KL-0 evaluation as one more point: peak at KL 0.41 (gold observed highest at 0.99)
    assert ppo["kl_past_gold_peak"].step == 2560
    assert ppo["kl_past_gold_peak"].values["peak_kl"] == pytest.approx(0.41, abs=0.01)
    assert detect_alarms(_records("rlhf_dpo_seed0_checkpoint_evals.jsonl"), AlarmConfig()) == []


def test_no_hacking_alarm_when_gold_and_proxy_both_rise() -> None:
    # Real DPO stage of the same pipeline: gold 0.818 -> 0.879 and proxy 0.03 -> 1.15.
    alarms = _by_name(detect_alarms(_records("rlhf_dpo_seed0_evals.jsonl"), AlarmConfig()))
    assert "proxy_up_gold_down" not in alarms
    # ... and the early, healthy part of the PPO run (gold and proxy still rising) raises nothing at all.
    early = [r for r in _records("rlhf_ppo_seed0_evals.jsonl") if r["step"] <= 1280]
    assert detect_alarms(early, AlarmConfig()) == []


def _series(gold: list[float], proxy: list[float], half_width: float | None = None) -> list[dict]:
    out = []
    for i, (g, p) in enumerate(zip(gold, proxy, strict=True)):
        r = {"step": 100 * i, "eval/sampled/gold": g, "eval/sampled/proxy": p}
        if half_width is not None:
            r["eval/sampled/gold_ci_low"], r["eval/sampled/gold_ci_high"] = g - half_width, g + half_width
        out.append(r)
    return out


def test_gold_ci_decides_when_logged() -> None:
    gold, proxy = [0.5, 0.8, 0.75, 0.7, 0.6], [0.0, 1.0, 1.5, 2.0, 2.5]
    # CIs of +-0.05: the difference must exceed sqrt(0.05^2 + 0.05^2) = 0.0707; 0.1 at step 300 is the first.
    alarms = _by_name(detect_alarms(_series(gold, proxy, 0.05), AlarmConfig()))
    assert alarms["proxy_up_gold_down"].step == 300
    assert alarms["proxy_up_gold_down"].values["threshold"] == pytest.approx(math.sqrt(2) * 0.05)
    assert "beyond its 95% CI" in alarms["proxy_up_gold_down"].message
    # Wide CIs (+-0.1: 0.141) hold until step 400's drop of 0.2.
    assert _by_name(detect_alarms(_series(gold, proxy, 0.1), AlarmConfig()))["proxy_up_gold_down"].step == 400
    # Without CIs: more than 5% of the peak (0.04); step 200's drop of 0.05 is enough.
    no_ci = _by_name(detect_alarms(_series(gold, proxy), AlarmConfig()))["proxy_up_gold_down"]
    assert no_ci.step == 200 and "no CI logged" in no_ci.message
    # Gold falling while the proxy falls too is not reward hacking.
    falling = _series(gold, [0.0, 1.0, 0.9, 0.8, 0.7], 0.01)
    assert "proxy_up_gold_down" not in _by_name(detect_alarms(falling, AlarmConfig()))


def test_gao_fit_recovers_alpha_beta_and_the_alarm_fires_past_the_peak() -> None:
    alpha, beta, g0 = 0.3, 0.2, 0.1
    kl = np.array([0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0])
    d = np.sqrt(kl)
    gold = g0 + d * (alpha - beta * np.log(d))
    assert gao_fit(kl, gold - g0) == pytest.approx((alpha, beta), abs=1e-9)
    # The peak: d* = exp(alpha / beta - 1) = exp(0.5), so KL* = e = 2.718; gold there g0 + beta d* = 0.4297.
    records = [{"step": 0, "eval/sampled/gold": g0, "eval/kl": 0.0}]
    records += [
        {"step": 100 * (i + 1), "eval/sampled/gold": g, "eval/kl": k}
        for i, (k, g) in enumerate(zip(kl, gold, strict=True))
    ]
    assert gao_fit_free(kl, gold) == pytest.approx((g0, alpha, beta), abs=1e-9)
    alarm = _by_name(detect_alarms(records, AlarmConfig(fit_points=4)))["kl_past_gold_peak"]
    assert alarm.step == 400  # KL 4 is the first past KL* = e (and the 4th point, enough for fit_points=4)
    assert alarm.values["peak_kl"] == pytest.approx(math.e)
    assert alarm.values["peak_gold"] == pytest.approx(g0 + beta * math.exp(0.5))
    # Without the KL-0 evaluation, gold(0) is fitted with alpha and beta: the same peak, the same step.
    free = _by_name(detect_alarms(records[1:], AlarmConfig(fit_points=4)))["kl_past_gold_peak"]
    assert free.step == 400 and free.values["peak_kl"] == pytest.approx(math.e)
    # Gold still rising at every point (all KLs before the peak): quiet.
    rising = [r for r in records if r["eval/kl"] < math.e]
    assert "kl_past_gold_peak" not in _by_name(detect_alarms(rising, AlarmConfig(fit_points=3)))


def test_length_entropy_drift_and_saturation() -> None:
    lengths = [20.0, 22.0, 28.0, 31.0, 40.0]
    entropy = [1.0, 0.9, 0.6, 0.45, 0.4]
    proxy = [0.0, 1.0, 1.95, 2.0, 1.98]
    records = [
        {
            "step": 10 * i,
            "eval/sampled_length": n,
            "eval/completion_length": 99.0,
            "eval/entropy": h,
            "eval/sampled/proxy": p,
        }
        for i, (n, h, p) in enumerate(zip(lengths, entropy, proxy, strict=True))
    ]
    alarms = _by_name(detect_alarms(records, AlarmConfig(saturation_window=3)))
    assert alarms["length_drift"].step == 30  # 31 / 20 = +55% > 50% (sampled length preferred over greedy)
    assert alarms["length_drift"].values["relative"] == pytest.approx(0.55)
    assert alarms["entropy_drift"].step == 30  # 0.45 = -55%
    # Flat over steps 20..40 (range 0.05 <= 0.1 * its rise 1.977): saturated at 40, not at 30 (window 1..2.0).
    assert alarms["reward_saturated"].step == 40
    # A run without a proxy (a verifier reward) saturates on eval/return_mean.
    plain = [{"step": r["step"], "eval/return_mean": r["eval/sampled/proxy"]} for r in records]
    assert [a.name for a in detect_alarms(plain, AlarmConfig(saturation_window=3))] == ["reward_saturated"]
    bounded = _by_name(detect_alarms(records, AlarmConfig(length_max=25.0, entropy_drift=0, saturation_tol=0)))
    assert bounded["length_drift"].step == 20 and "left its bounds" in bounded["length_drift"].message
    assert set(bounded) == {"length_drift"}


def test_each_alarm_fires_once_and_resume_gives_the_same_alarms() -> None:
    records = _records("rlhf_ppo_seed0_evals.jsonl")
    cfg = AlarmConfig()
    one_pass = detect_alarms(records, cfg)
    assert len({a.name for a in one_pass}) == len(one_pass)
    first = AlarmMonitor(cfg)
    got = [a for r in records[:3] for a in first.observe(r["step"], r)]
    state = json.loads(json.dumps(first.state_dict()))  # what a checkpoint stores
    resumed = AlarmMonitor(cfg)
    resumed.load_state_dict(state)
    got += [a for r in records[3:] for a in resumed.observe(r["step"], r)]
    assert got == one_pass
    # Resuming from an older checkpoint and re-evaluating a step forgets what fired from that step on.
    again = resumed.observe(records[4]["step"], records[4])
    assert [a.name for a in again] == ["proxy_up_gold_down", "kl_past_gold_peak"]


def test_disabled_and_bad_config() -> None:
    assert detect_alarms(_records("rlhf_ppo_seed0_evals.jsonl"), AlarmConfig(enabled=False)) == []
    with pytest.raises(ConfigError, match="length_drift must be >= 0"):
        AlarmConfig(length_drift=-1)
    with pytest.raises(ConfigError, match=r"--alarms\.length-min \(10\) must be below --alarms\.length-max \(5\)"):
        AlarmConfig(length_min=10, length_max=5)


@pytest.mark.parametrize("resumed_at", [20, 30])
def test_a_monitor_resumed_from_an_older_checkpoint_forgets_the_evaluations_from_that_step_on(resumed_at: int) -> None:
    """Evaluations at steps 0..30 were observed, then the run resumed from an older checkpoint and evaluates
    ``resumed_at`` again (30: the last step seen, 20: an earlier one): the monitor keeps the evaluations before it
    and the new one, never the stale evaluation of the same step, so the saturation window counts the new
    numbers: a flat tail of stale values must not make the reward look saturated."""
    cfg = AlarmConfig(saturation_window=2, length_drift=0, entropy_drift=0)
    monitor = AlarmMonitor(cfg)
    for step, proxy in ((0, 0.0), (10, 1.0), (20, 2.0), (30, 2.01)):
        monitor.observe(step, {"eval/sampled/proxy": proxy})
    assert monitor.fired == {"reward_saturated": 30}
    resumed = AlarmMonitor(cfg)
    resumed.load_state_dict(json.loads(json.dumps(monitor.state_dict())))
    assert resumed.observe(resumed_at, {"eval/sampled/proxy": 5.0}) == []  # 2.0/2.01 then 5.0: still climbing
    history = resumed.state_dict()["history"]
    assert [h["step"] for h in history] == [s for s in (0, 10, 20) if s < resumed_at] + [resumed_at]
    assert history[-1]["reward"] == 5.0 and resumed.fired == {}


def test_a_reward_flat_from_the_start_is_not_saturated() -> None:
    """Saturation means a reward that rose and stopped: one that never moved (a broken reward, or a verifier the
    policy never passes) stays quiet, however flat its window."""
    records = [{"step": 10 * i, "eval/return_mean": 0.0} for i in range(6)]
    assert detect_alarms(records, AlarmConfig(saturation_window=3)) == []


def _seed_runs() -> dict[int, tuple[list[dict], dict]]:
    """Per seed: the PPO stage's evaluation records and what the training run itself recorded (selection, alarms)."""
    runs: dict[int, tuple[list[dict], dict]] = {}
    for r in _records("rlhf_ppo_seeds_evals.jsonl"):
        evals, live = runs.setdefault(r.pop("seed"), ([], {}))
        if "live_selection" in r:
            live.update(r)
        else:
            evals.append(r)
    return runs


def test_over_seeds_the_hacking_alarm_follows_the_best_step_or_gold_recovers_past_it() -> None:
    # The PPO stage of rlhf-synthetic for seeds 0-11, as one CPU ran it. Which evaluation is best moves with the
    # CPU's rounding (seed 0: step 1280 here, 640 elsewhere), so this asserts what docs/checkpoints.md claims over
    # seeds rather than any seed's step: where proxy_up_gold_down fires after the selected step, the proxy is still
    # rising and the end is below the pick; where it fires first (seed 9: gold dipped 0.743 -> 0.710 and recovered),
    # the pick is above the peak the alarm measured from; where it never fires, gold ends inside the pick's CI.
    # Replaying the records gives what each training run recorded.
    runs = _seed_runs()
    assert sorted(runs) == list(range(SEEDS))
    metric, after, early, quiet = "eval/sampled/gold", [], [], []
    for seed, (evals, live) in runs.items():
        best = select_best(candidates_from_records(evals, metric), SelectConfig(), metric)
        alarms = _by_name(detect_alarms(evals, AlarmConfig()))
        last = evals[-1]
        hack = alarms.get("proxy_up_gold_down")
        if hack is None:
            quiet.append(seed)
            assert last[f"{metric}_ci_high"] >= best.low, seed
        elif hack.step > best.step:
            after.append(seed)
            assert hack.step <= last["step"] and hack.values["proxy"] > hack.values["proxy_at_peak"], seed
            assert last[metric] < best.mean, seed
        else:
            early.append(seed)
            assert best.mean > hack.values["gold_peak"], seed
        assert best.step == live["live_selection"], seed
        assert {a.name: a.step for a in alarms.values()} == live["live_alarms"], seed
    assert (len(after), early, quiet) == (9, [9], [7, 11])
