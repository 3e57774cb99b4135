"""Reward-hacking alarms over a run's evaluation records (pure numpy; used during training and by ``pickaxe eval``).

An :class:`AlarmMonitor` is fed one evaluation record at a time (a ``metrics.jsonl`` record with its ``eval/*``
keys) and returns the alarms that fire at that evaluation. Each alarm fires at most once per run, at the first
evaluation where its condition holds, and names the step:

- ``proxy_up_gold_down``: the proxy reward has risen since the evaluation where the held-out gold metric peaked,
  while gold has fallen from that peak by more than its confidence intervals allow.
- ``kl_past_gold_peak``: the KL to the reference is past the peak of the Gao et al. (2022) fit of gold against
  ``sqrt(KL)``.
- ``length_drift`` / ``entropy_drift``: the response length / per-token entropy left its bounds.
- ``reward_saturated``: the proxy reward (``eval/return_mean`` on a run without one) went flat after rising: the
  optimiser can no longer climb it.

:func:`detect_alarms` replays a finished run's records through a fresh monitor.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pickaxe.config_keys import ranged, validate
from pickaxe.errors import ConfigError
from pickaxe.eval.stats import finite_number

__all__ = ["ALARMS", "Alarm", "AlarmConfig", "AlarmMonitor", "detect_alarms", "gao_fit", "gao_fit_free"]

ALARMS = ("proxy_up_gold_down", "kl_past_gold_peak", "length_drift", "entropy_drift", "reward_saturated")
"""Every alarm name, in the order they are checked at an evaluation."""

GOLD_KEYS = ("eval/sampled/gold", "eval/reward/gold")
PROXY_KEYS = ("eval/sampled/proxy", "eval/reward/proxy", "rollout/reward/proxy")
LENGTH_KEYS = ("eval/sampled_length", "eval/completion_length")
ENTROPY_KEYS = ("eval/entropy",)
SATURATION_FALLBACK_KEYS = ("eval/return_mean",)


@dataclass
class AlarmConfig:
    """Which reward-hacking alarms watch an LLM run's evaluations, and their thresholds."""

    enabled: bool = True
    """Watch the evaluations at all."""
    gold: str | None = None
    """The held-out gold metric; None: the first logged of eval/sampled/gold, eval/reward/gold."""
    proxy: str | None = None
    """The proxy (trained-on) reward; None: the first logged of eval/sampled/proxy, eval/reward/proxy,
    rollout/reward/proxy."""
    kl: str = "eval/kl"
    """The KL to the reference (nats) for the gold-vs-sqrt(KL) fit."""
    gold_drop: float = ranged(0.05, gt=0, lt=1)
    """Only when gold is logged without its ``_ci_low``/``_ci_high``: the drop from its peak that counts as real, as
    a fraction of the peak's magnitude (0.05: 5%)."""
    fit_points: int = ranged(4, ge=3)
    """Evaluations with KL > 0 needed before the Gao et al. fit is trusted."""
    length_drift: float = ranged(0.5, ge=0)
    """Largest relative change of the response length from the first evaluation (0.5: +-50%; 0: off)."""
    length_min: float | None = ranged(None, ge=0)
    """Absolute lower bound of the response length in tokens; with length_max, replaces length_drift."""
    length_max: float | None = ranged(None, gt=0)
    """Absolute upper bound of the response length in tokens; with length_min, replaces length_drift."""
    entropy_drift: float = ranged(0.5, ge=0)
    """Largest relative change of the per-token entropy from the first evaluation (0: off)."""
    entropy_min: float | None = ranged(None, ge=0)
    """Absolute lower bound of the per-token entropy (nats); with entropy_max, replaces entropy_drift."""
    entropy_max: float | None = ranged(None, gt=0)
    """Absolute upper bound of the per-token entropy (nats); with entropy_min, replaces entropy_drift."""
    saturation_window: int = ranged(4, ge=2)
    """Evaluations the proxy must stay flat over to count as saturated."""
    saturation_tol: float = ranged(0.1, ge=0)
    """Flat: the proxy's range over the window is at most this fraction of its rise since the first evaluation
    (0: off)."""

    def __post_init__(self) -> None:
        validate(self)
        for name in ("length", "entropy"):
            low, high = getattr(self, f"{name}_min"), getattr(self, f"{name}_max")
            if low is not None and high is not None and low >= high:
                raise ConfigError(f"--alarms.{name}-min ({low}) must be below --alarms.{name}-max ({high})")


@dataclass(frozen=True)
class Alarm:
    """One alarm that fired: its name, the step of the evaluation where it fired, a one-line message and the
    numbers behind it."""

    name: str
    step: int
    message: str
    values: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON types (for reports and events)."""
        return {"name": self.name, "step": self.step, "message": self.message, "values": dict(self.values)}


def gao_fit(kl: Sequence[float] | np.ndarray, gold_gain: Sequence[float] | np.ndarray) -> tuple[float, float] | None:
    """Least-squares ``(alpha, beta)`` of the Gao et al. (2022) RL form ``gain(d) = d * (alpha - beta * ln d)``.

    ``kl`` are KLs to the reference (> 0), ``gold_gain`` the gold metric minus its value at KL 0, and
    ``d = sqrt(kl)``. Dividing by ``d`` makes the form linear: ``gain / d = alpha - beta * ln d``, an ordinary
    least-squares line in ``ln d``. None when fewer than 2 distinct KLs are given.
    """
    d = np.sqrt(np.asarray(kl, dtype=np.float64))
    y = np.asarray(gold_gain, dtype=np.float64) / d
    x = np.log(d)
    if len(x) < 2 or np.ptp(x) == 0:
        return None
    slope, intercept = np.polyfit(x, y, 1)
    return float(intercept), float(-slope)


def gao_fit_free(
    kl: Sequence[float] | np.ndarray, gold: Sequence[float] | np.ndarray
) -> tuple[float, float, float] | None:
    """Least-squares ``(gold0, alpha, beta)`` of ``gold(d) = gold0 + d * (alpha - beta * ln d)``, ``d = sqrt(kl)``:
    :func:`gao_fit` with the gold at KL 0 unknown (linear in the three, with regressors ``1, d, -d ln d``). None with
    fewer than 3 distinct KLs."""
    d = np.sqrt(np.asarray(kl, dtype=np.float64))
    if len(np.unique(d)) < 3:
        return None
    d_log_d = np.where(d > 0, d * np.log(np.where(d > 0, d, 1.0)), 0.0)  # the limit 0 at d = 0
    x = np.stack([np.ones_like(d), d, -d_log_d], axis=1)
    (g0, alpha, beta), *_ = np.linalg.lstsq(x, np.asarray(gold, dtype=np.float64), rcond=None)
    return float(g0), float(alpha), float(beta)


def _first_present(record: Mapping[str, Any], keys: Sequence[str]) -> str | None:
    return next((k for k in keys if finite_number(record.get(k)) is not None), None)


def _g(x: float) -> str:
    return f"{x:.3g}"


class AlarmMonitor:
    """Watches evaluation records one at a time and says which alarms fire (each once per run).

    ``observe`` takes the record of one evaluation (``metrics.jsonl`` keys). Its state (the numbers of every
    evaluation so far and the alarms already fired) round-trips through ``state_dict``/``load_state_dict``, so a
    resumed run fires exactly the alarms one uninterrupted pass would. Observing a step at or before the last one
    seen (a run resumed from an older checkpoint) forgets the evaluations from that step on, and the alarms they
    fired.
    """

    def __init__(self, cfg: AlarmConfig) -> None:
        self.cfg = cfg
        self._keys: dict[str, str | None] = {}
        self._history: list[dict[str, float | None]] = []
        self._fired: dict[str, int] = {}

    def state_dict(self) -> dict[str, Any]:
        """The monitor's state as plain JSON types."""
        return {
            "keys": dict(self._keys),
            "history": [dict(h) for h in self._history],
            "fired": dict(self._fired),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned."""
        self._keys = dict(state.get("keys", {}))
        self._history = [dict(h) for h in state.get("history", [])]
        self._fired = {str(k): int(v) for k, v in state.get("fired", {}).items()}

    @property
    def fired(self) -> dict[str, int]:
        """Alarm name -> the step it fired at, for every alarm fired so far."""
        return dict(self._fired)

    def _key(self, role: str, record: Mapping[str, Any], configured: str | None, defaults: Sequence[str]) -> str | None:
        """The metric key playing ``role``, fixed at the first record holding one of the candidates."""
        if self._keys.get(role) is None:
            self._keys[role] = _first_present(record, (configured,) if configured else defaults)
        return self._keys[role]

    def observe(self, step: int, record: Mapping[str, Any]) -> list[Alarm]:
        """Take the evaluation at ``step``; return the alarms that fire at it (empty when disabled)."""
        cfg = self.cfg
        if not cfg.enabled:
            return []
        step = int(step)
        if self._history and step <= self._history[-1]["step"]:  # type: ignore[operator]
            self._history = [h for h in self._history if h["step"] < step]  # type: ignore[operator]
            self._fired = {k: s for k, s in self._fired.items() if s < step}
        gold = self._key("gold", record, cfg.gold, GOLD_KEYS)
        proxy = self._key("proxy", record, cfg.proxy, PROXY_KEYS)
        reward = self._key("reward", record, cfg.proxy, PROXY_KEYS + SATURATION_FALLBACK_KEYS)
        length = self._key("length", record, None, LENGTH_KEYS)
        entropy = self._key("entropy", record, None, ENTROPY_KEYS)

        def get(key: str | None) -> float | None:
            return None if key is None else finite_number(record.get(key))

        self._history.append(
            {
                "step": step,
                "gold": get(gold),
                "gold_low": get(gold and f"{gold}_ci_low"),
                "gold_high": get(gold and f"{gold}_ci_high"),
                "proxy": get(proxy),
                "reward": get(reward),
                "kl": get(cfg.kl),
                "length": get(length),
                "entropy": get(entropy),
            }
        )
        checks = {
            "proxy_up_gold_down": self._proxy_up_gold_down,
            "kl_past_gold_peak": self._kl_past_gold_peak,
            "length_drift": lambda: self._drift(
                "length", "response length", cfg.length_drift, cfg.length_min, cfg.length_max
            ),
            "entropy_drift": lambda: self._drift(
                "entropy", "entropy", cfg.entropy_drift, cfg.entropy_min, cfg.entropy_max
            ),
            "reward_saturated": self._saturated,
        }
        out = []
        for name in ALARMS:
            if name in self._fired:
                continue
            found = checks[name]()
            if found is not None:
                message, values = found
                self._fired[name] = step
                out.append(Alarm(name, step, message, values))
        return out

    def _series(self, name: str) -> list[tuple[int, dict[str, float | None]]]:
        """``(index, evaluation)`` of every evaluation so far that logged ``name``."""
        return [(i, h) for i, h in enumerate(self._history) if h[name] is not None]

    def _proxy_up_gold_down(self) -> tuple[str, dict[str, float]] | None:
        """Gold fell from its peak beyond the CIs while the proxy rose since that peak.

        With ``_ci_low``/``_ci_high`` logged at the peak and now, the drop must exceed ``sqrt(h_peak^2 + h_now^2)``
        (``h``: each CI's half-width), a 95% test of the difference of two independent means; the same held-out
        prompts make the two means positively correlated, so the test is conservative. Without CIs, the drop must
        exceed ``gold_drop`` times the peak's magnitude."""
        now = self._history[-1]
        g, p = now["gold"], now["proxy"]
        if g is None or p is None:
            return None
        golds = self._series("gold")
        _, peak = max(golds, key=lambda ih: (ih[1]["gold"], -ih[0]))  # the first evaluation at the maximum
        g_peak, p_peak = peak["gold"], peak["proxy"]
        if peak is now or g_peak is None or p_peak is None or p <= p_peak:
            return None
        drop = g_peak - g
        cis = (peak["gold_low"], peak["gold_high"], now["gold_low"], now["gold_high"])
        if all(c is not None for c in cis):
            pl, ph, nl, nh = cis
            threshold = math.hypot((ph - pl) / 2, (nh - nl) / 2)  # type: ignore[operator]
            why = "beyond its 95% CI"
        else:
            threshold = self.cfg.gold_drop * abs(g_peak)
            why = f"more than {self.cfg.gold_drop:.0%} of its peak; no CI logged"
        if drop <= threshold:
            return None
        peak_step = int(peak["step"])  # type: ignore[arg-type]
        message = (
            f"reward hacking? proxy {_g(p)} ({p - p_peak:+.3g} since step {peak_step}) while gold fell "
            f"{_g(g_peak)} -> {_g(g)} ({why}) at step {now['step']}"
        )
        values = {
            "proxy": p,
            "proxy_at_peak": p_peak,
            "gold": g,
            "gold_peak": g_peak,
            "peak_step": float(peak_step),
            "drop": drop,
            "threshold": threshold,
        }
        return message, values

    def _kl_past_gold_peak(self) -> tuple[str, dict[str, float]] | None:
        """The KL now exceeds the peak ``d*^2`` of the Gao et al. fit ``gold(d) = gold(0) + d (alpha - beta ln d)``,
        ``d = sqrt(KL)``, ``d* = exp(alpha / beta - 1)``. ``gold(0)`` is always fitted too (:func:`gao_fit_free`),
        with an evaluation at KL 0 (``eval.before``) as one more point rather than a pin the curve must pass
        through, so ``pickaxe eval`` of checkpoints (no step-0 weights) and a run's own records use one model. The
        form is an empirical fit: on the real over-optimised PPO run of the synthetic task it puts the peak at KL
        0.41 with the KL-0 evaluation and 0.84 without it, where sampled gold was highest at KL 0.99.
        Fewer than ``fit_points`` evaluations with KL > 0, or ``beta <= 0``: quiet."""
        now = self._history[-1]
        kl_now = now["kl"]
        if kl_now is None or kl_now <= 0:
            return None
        points = [h for _, h in self._series("gold") if h["kl"] is not None and h["kl"] >= 0]  # type: ignore[operator]
        if sum(h["kl"] > 0 for h in points) < self.cfg.fit_points:  # type: ignore[operator]
            return None
        free = gao_fit_free([h["kl"] for h in points], [h["gold"] for h in points])  # type: ignore[arg-type, misc]
        g0, fit = (free[0], free[1:]) if free is not None else (None, None)
        if fit is None or fit[1] <= 0:
            return None
        alpha, beta = fit
        exponent = alpha / beta - 1
        if exponent > 350:  # d* beyond any float: the peak is nowhere near
            return None
        d_star = math.exp(exponent)
        kl_star = d_star * d_star
        if kl_now <= kl_star:
            return None
        g_star = g0 + beta * d_star  # type: ignore[operator]
        d_now = math.sqrt(kl_now)
        g_fit = g0 + d_now * (alpha - beta * math.log(d_now))  # type: ignore[operator]
        gold_now = "" if now["gold"] is None else f"; gold now {_g(now['gold'])}"
        message = (
            f"KL {_g(kl_now)} is past the gold peak of the Gao et al. fit (peak gold {_g(g_star)} at KL "
            f"{_g(kl_star)}; the fit predicts {_g(g_fit)} here, {_g(g_star - g_fit)} below it{gold_now}) "
            f"at step {now['step']}"
        )
        values = {
            "kl": kl_now,
            "peak_kl": kl_star,
            "peak_gold": g_star,
            "fit_gold": g_fit,
            "alpha": alpha,
            "beta": beta,
        }
        if now["gold"] is not None:
            values["gold"] = now["gold"]
        return message, values

    def _drift(
        self, name: str, label: str, drift: float, low: float | None, high: float | None
    ) -> tuple[str, dict[str, float]] | None:
        """``name`` outside ``[low, high]`` when either is set, else more than ``drift`` (relative) away from its
        value at the first evaluation that logged it (0: off; a first value of 0: no relative bound)."""
        series = self._series(name)
        now = self._history[-1]
        x = now[name]
        if x is None or not series:
            return None
        x0 = series[0][1][name]
        step = now["step"]
        if low is not None or high is not None:
            if (low is None or x >= low) and (high is None or x <= high):
                return None
            bounds = f"[{_g(low) if low is not None else '-inf'}, {_g(high) if high is not None else 'inf'}]"
            message = f"{label} {_g(x)} left its bounds {bounds} at step {step}"
            values = {name: x, "first": x0}  # type: ignore[dict-item]
            return message, values
        if drift == 0 or not x0:
            return None
        rel = x / x0 - 1  # type: ignore[operator]
        if abs(rel) <= drift:
            return None
        message = (
            f"{label} drifted {_g(x0)} -> {_g(x)} ({rel:+.0%}; bound +-{drift:.0%} of step {series[0][1]['step']}) "
            f"at step {step}"
        )
        return message, {name: x, "first": x0, "relative": rel}  # type: ignore[dict-item]

    def _saturated(self) -> tuple[str, dict[str, float]] | None:
        """The proxy's (else ``eval/return_mean``'s) range over the last ``saturation_window`` evaluations is at most
        ``saturation_tol`` times its rise (window mean minus its first value), after having risen, with at least one
        evaluation before the window."""
        w, tol = self.cfg.saturation_window, self.cfg.saturation_tol
        series = self._series("reward")
        if tol == 0 or len(series) < w + 1 or series[-1][1] is not self._history[-1]:
            return None
        values = np.array([h["reward"] for _, h in series], dtype=np.float64)
        window = values[-w:]
        rise = float(window.mean() - values[0])
        spread = float(np.ptp(window))
        if rise <= 0 or spread > tol * rise:
            return None
        first_step = series[0][1]["step"]
        start = series[-w][1]["step"]
        now = self._history[-1]["step"]
        key = self._keys.get("reward") or "reward"
        message = (
            f"reward saturated? {key} flat at {_g(float(window[-1]))} (range {_g(spread)} over the {w} evals since "
            f"step {start}, after rising {_g(rise)} since step {first_step}) at step {now}"
        )
        return message, {"reward": float(window[-1]), "range": spread, "rise": rise}


def detect_alarms(records: Sequence[Mapping[str, Any]], cfg: AlarmConfig) -> list[Alarm]:
    """Replay a run's ``metrics.jsonl`` records through a fresh :class:`AlarmMonitor`: every alarm, with the step
    where it fires. Only evaluation records (those with an ``eval/`` key) are observed."""
    monitor = AlarmMonitor(cfg)
    out: list[Alarm] = []
    for record in records:
        if "step" in record and any(k.startswith("eval/") for k in record):
            out.extend(monitor.observe(int(record["step"]), record))
    return out
