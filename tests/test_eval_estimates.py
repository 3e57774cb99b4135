"""The CIs of sampled held-out metrics resample prompts, not completions (several completions of one prompt are not
independent samples)."""

from __future__ import annotations

import numpy as np
import pytest

from pickaxe.train.evaluate import mean_estimate, ratio_estimate


def test_a_prompts_completions_are_resampled_together() -> None:
    rng = np.random.default_rng(3)
    per_prompt = rng.random(256)
    # 4 completions per prompt that always agree: 1024 numbers, but only 256 independent ones
    values = np.repeat(per_prompt, 4)
    naive, clustered = mean_estimate(values), mean_estimate(values, per_prompt=4)
    assert clustered.mean == naive.mean == pytest.approx(per_prompt.mean())
    assert clustered.low < clustered.mean < clustered.high
    # the clustered CI is the CI of 256 prompt means: about sqrt(4) = 2x the naive width
    ratio = (clustered.high - clustered.low) / (naive.high - naive.low)
    assert 1.7 < ratio < 2.3
    # completions that vary independently within a prompt: resampling prompts or completions agree
    independent = rng.random(1024)
    a, b = mean_estimate(independent), mean_estimate(independent, per_prompt=4)
    assert (b.high - b.low) / (a.high - a.low) == pytest.approx(1.0, abs=0.15)


def test_nan_samples_are_skipped_and_ratios_resample_prompts() -> None:
    values = np.array([1.0, np.nan, 0.0, 0.0, 1.0, 1.0, np.nan, np.nan])
    est = mean_estimate(values, per_prompt=2)
    assert est.mean == pytest.approx(3 / 5) and est.n == 5 and est.low <= est.mean <= est.high
    num, den = np.array([2.0, 2.0, 1.0, 1.0]), np.array([4.0, 4.0, 1.0, 1.0])
    ratio = ratio_estimate(num, den, per_prompt=2)
    assert ratio.mean == pytest.approx(6 / 10) and ratio.n == 4
    # two prompts: a resample holds prompt 0 twice (0.5), prompt 1 twice (1.0) or both (0.6)
    assert ratio.low == pytest.approx(0.5) and ratio.high == pytest.approx(1.0)
