"""Evaluation: the deterministic policy on separate eval envs, the 95% CIs of evaluation means, and the held-out
metrics of an LLM policy from its per-sample values (``text_estimates``, without importing transformers)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import AutoresetMode

from pickaxe.envs.make import SeededVectorEnv
from pickaxe.eval.stats import mean as stats_mean
from pickaxe.eval.stats import stratified_bootstrap_ci, wilson_interval
from pickaxe.models.policy import Policy, rollout_act
from pickaxe.models.recurrent import is_recurrent

SUCCESS_KEYS = ("is_success", "success")
"""The info keys that report an episode's success (gymnasium-robotics: Fetch's ``is_success``, the mazes'
``success``), read at the episode's last step."""


def step_success(info: dict, done: np.ndarray, same_step: bool) -> np.ndarray | None:
    """Each sub-env's success flag at its last step where ``done`` (NaN where the env reported none), from the
    vector env's ``info`` (with ``SAME_STEP`` autoreset the last step's info is ``final_info``); None when no sub-env
    reports one."""
    source = info.get("final_info", {}) if same_step else info
    for key in SUCCESS_KEYS:
        if key in source:
            values = np.asarray(source[key], dtype=np.float64).reshape(-1)
            reported = np.asarray(source.get("_" + key, np.ones_like(done)), dtype=bool).reshape(-1)
            return np.where(reported & done, values, np.nan)
    return None


def evaluate(
    policy: Policy,
    envs: gym.vector.VectorEnv,
    episodes: int = 10,
    device: str | torch.device = "cpu",
    deterministic: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
    """Run ``episodes`` full episodes and return their ``(returns, lengths)`` (:func:`evaluate_episodes`)."""
    out = evaluate_episodes(policy, envs, episodes, device, deterministic)
    return out["return"], out["length"]


def evaluate_episodes(
    policy: Policy,
    envs: gym.vector.VectorEnv,
    episodes: int = 10,
    device: str | torch.device = "cpu",
    deterministic: bool = True,
) -> dict[str, np.ndarray]:
    """Run ``episodes`` full episodes: their ``return`` and ``length``, and ``success`` (1.0 or 0.0, from
    ``info["is_success"]`` or ``info["success"]`` at the last step) when the env reports it.

    Episodes are split evenly over the sub-envs and each sub-env runs exactly its share, so short
    episodes are not over-represented. A ``SeededVectorEnv`` is re-seeded every call, which makes an
    evaluation a pure function of the policy's weights (and of the eval seed).
    """
    n = envs.num_envs
    quota = np.array([(episodes + i) // n for i in range(n)])
    seed = envs.seed if isinstance(envs, SeededVectorEnv) else None
    obs, _ = envs.reset(seed=seed)
    act_space = envs.single_action_space
    clip = (act_space.low, act_space.high) if isinstance(act_space, gym.spaces.Box) else None
    same_step = envs.metadata.get("autoreset_mode") == AutoresetMode.SAME_STEP
    ep_ret, ep_len = np.zeros(n), np.zeros(n, dtype=np.int64)
    done_count = np.zeros(n, dtype=np.int64)
    returns: list[float] = []
    lengths: list[int] = []
    successes: list[float] = []
    device = torch.device(device)
    state = policy.initial_state(n, device) if is_recurrent(policy) else None  # its own, not the collector's
    with torch.no_grad():
        act = rollout_act(policy) if state is None else None  # the weights are fixed for the evaluation
        while np.count_nonzero(done_count < quota):
            obs_t = torch.as_tensor(np.asarray(obs, dtype=np.float32), device=device)
            if act is not None:
                action, _ = act(obs_t, deterministic=deterministic)
            else:
                action, _, state = policy.act_recurrent(obs_t, state, deterministic=deterministic)
            act_np = action.cpu().numpy()
            if clip is not None:
                act_np = np.clip(act_np, *clip)
            obs, reward, term, trunc, info = envs.step(act_np)
            ep_ret += reward
            ep_len += 1
            done = term | trunc
            success = step_success(info, done, same_step) if np.count_nonzero(done) else None
            for i in np.flatnonzero(done):
                if done_count[i] < quota[i]:
                    returns.append(float(ep_ret[i]))
                    lengths.append(int(ep_len[i]))
                    successes.append(float("nan") if success is None else float(success[i]))
                done_count[i] += 1
            ep_ret[done], ep_len[done] = 0.0, 0
            if state is not None and np.count_nonzero(done):
                state = policy.reset_state(state, torch.from_numpy(done))
            if not same_step and np.count_nonzero(done):
                reset_obs, _ = envs.reset(options={"reset_mask": done})
                obs = np.where(done.reshape(-1, *[1] * (np.ndim(obs) - 1)), reset_obs, obs)
    out = {"return": np.array(returns), "length": np.array(lengths)}
    if successes and not np.isnan(successes).all():
        out["success"] = np.nan_to_num(np.array(successes), nan=0.0)  # an episode that reports none did not succeed
    return out


BOOTSTRAP_REPS = 2000
"""Bootstrap resamples of the evaluation CIs (seed 0: a CI is a pure function of the values)."""


@dataclass(frozen=True)
class Estimate:
    """A mean over ``n`` samples with its 95% CI (``low``, ``high``; NaN when no sample is finite)."""

    mean: float
    low: float
    high: float
    n: int


def mean_ci(values: np.ndarray) -> tuple[float, float]:
    """95% percentile-bootstrap CI of the mean of ``values`` (non-finite ones dropped), ``BOOTSTRAP_REPS``
    resamples with seed 0, so it is a pure function of the values; ``(nan, nan)`` when none is finite."""
    finite = np.asarray(values, dtype=np.float64)
    finite = finite[np.isfinite(finite)]
    if finite.size == 0:
        return float("nan"), float("nan")
    return stratified_bootstrap_ci(finite, statistic=stats_mean, reps=BOOTSTRAP_REPS, seed=0)


def mean_estimate(values: np.ndarray, per_prompt: int = 1) -> Estimate:
    """The mean of ``values`` ignoring NaNs (``np.nanmean``; NaN when all are) with its 95% CI: :func:`mean_ci`, or
    with ``per_prompt`` > 1 (``values`` prompt-major, ``per_prompt`` completions of each prompt) a bootstrap that
    resamples prompts, not completions: the samples of one prompt are not independent, and treating them as such
    made the CIs of the sampled metrics 1.5-1.7x too narrow on the synthetic RLHF task."""
    a = np.asarray(values, dtype=np.float64)
    finite = int(np.isfinite(a).sum())
    mean = float(np.nanmean(a)) if finite else float("nan")
    if per_prompt <= 1:
        low, high = mean_ci(a)
        return Estimate(mean, low, high, finite)
    ok = np.isfinite(a).reshape(-1, per_prompt)
    sums = np.where(ok, a.reshape(-1, per_prompt), 0.0).sum(1)
    low, high = _block_ratio_ci(sums, ok.sum(1).astype(np.float64))
    return Estimate(mean, low, high, finite)


def _block_ratio_ci(num: np.ndarray, den: np.ndarray) -> tuple[float, float]:
    """95% percentile-bootstrap CI of ``sum(num) / sum(den)`` resampling the (num, den) pairs, seed 0."""
    n = len(num)
    if n == 0 or den.sum() <= 0:
        return float("nan"), float("nan")
    idx = np.random.default_rng(0).integers(0, n, size=(BOOTSTRAP_REPS, n))
    totals = den[idx].sum(1)
    ratios = num[idx].sum(1) / np.where(totals > 0, totals, np.nan)
    low, high = np.nanquantile(ratios, [0.025, 0.975])
    return float(low), float(high)


def ratio_estimate(numerator: np.ndarray, denominator: np.ndarray, per_prompt: int = 1) -> Estimate:
    """``sum(numerator) / sum(denominator)`` (e.g. a per-token mean from per-completion sums and token counts) with
    a 95% percentile-bootstrap CI (seed 0) that resamples the pairs, or with ``per_prompt`` > 1 whole prompts (see
    :func:`mean_estimate`)."""
    num, den = np.asarray(numerator, dtype=np.float64), np.asarray(denominator, dtype=np.float64)
    n = len(num)
    if n == 0 or den.sum() <= 0:
        return Estimate(float("nan"), float("nan"), float("nan"), n)
    if per_prompt > 1:
        num, den = num.reshape(-1, per_prompt).sum(1), den.reshape(-1, per_prompt).sum(1)
    low, high = _block_ratio_ci(num, den)
    return Estimate(float(np.asarray(numerator, dtype=np.float64).sum() / den.sum()), low, high, n)


def text_estimates(values: dict[str, np.ndarray]) -> dict[str, Estimate]:
    """The held-out metrics of ``TextEvaluator.samples`` output (:mod:`pickaxe.train.llm`), each with its 95% CI and
    sample count: ``eval/accuracy`` (Wilson), ``eval/return_mean``, ``eval/completion_length``, ``eval/reward/<term>``
    (with more than one term), and from the samples ``eval/pass@<k>``, ``eval/sampled_return_mean`` and
    ``eval/sampled/<term>`` (more than one term), ``eval/sampled_length``, ``eval/entropy`` and ``eval/kl`` (every CI
    a bootstrap over prompts with a fixed seed; a prompt's completions are resampled together)."""
    correct = values["greedy/correct"]
    n, hits = len(correct), int(correct.sum())
    low, high = wilson_interval(hits, n)
    out = {
        "eval/accuracy": Estimate(hits / max(n, 1), low, high, n),
        "eval/return_mean": mean_estimate(values["greedy/reward"]),
        "eval/completion_length": mean_estimate(values["greedy/length"]),
    }
    terms = [k.removeprefix("greedy/term/") for k in values if k.startswith("greedy/term/")]
    if len(terms) > 1:
        out.update({f"eval/reward/{k}": mean_estimate(values[f"greedy/term/{k}"]) for k in terms})
    if "sampled/correct" in values:
        per = len(values["sampled/correct"]) // max(n, 1)  # completions per prompt, prompt-major
        passes = sorted((k for k in values if k.startswith("sampled/pass@")), key=lambda k: int(k.split("@")[1]))
        out.update({f"eval/{k.removeprefix('sampled/')}": mean_estimate(values[k]) for k in passes})
        if len(terms) > 1:
            out["eval/sampled_return_mean"] = mean_estimate(values["sampled/reward"], per)
            out.update({f"eval/sampled/{k}": mean_estimate(values[f"sampled/term/{k}"], per) for k in terms})
        out["eval/sampled_length"] = mean_estimate(values["sampled/length"], per)
        if "sampled/neg_logp" in values:
            out["eval/entropy"] = ratio_estimate(values["sampled/neg_logp"], values["sampled/tokens"], per)
        if "sampled/kl" in values:
            kl = values["sampled/kl"]
            # averaged in float32 by torch, as the KL always was: the logged numbers stay what they were
            kl_mean = float(torch.from_numpy(np.ascontiguousarray(kl)).mean())
            out["eval/kl"] = replace(mean_estimate(kl, per), mean=kl_mean)
    return out
