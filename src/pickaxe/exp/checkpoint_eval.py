"""``pickaxe eval RUN_DIR --checkpoints all|best|latest|final|STEP...``: evaluate a run's kept weights side by side.

The candidates are the run's kept policies (``RUN/policies``), full checkpoints and final model, one per env step
(a policy is preferred: the same weights, the smallest file). Each chosen checkpoint is evaluated with the run's
own evaluation code: classic runs on N episodes (mean and IQM of the return with 95% stratified-bootstrap CIs),
multi-agent runs likewise for the team's total return and each agent's (the table has a row for each),
LLM runs on the held-out prompts through the run's ``TextEvaluator`` (accuracy with its Wilson CI, pass@k, every
reward term greedy and sampled, KL to the reference, length, entropy, each with a 95% CI). The per-sample values
of a checkpoint are cached in ``RUN/eval/cache/<sha256[:16]>-<settings hash>.json``, keyed by the weights' digest
and the evaluation settings, so a rerun loads no model: a fully cached evaluation does not import torch.

Outputs: a table on stdout, ``RUN/eval/checkpoints.json`` (rows, the best checkpoint by the run's selection rule,
the reward-hacking alarms over the results, and for the top two checkpoints how many more samples would separate
them), ``RUN/eval/checkpoints.csv`` and ``RUN/eval/plots/<metric>.png`` (``/`` in the name as ``_``).
"""

from __future__ import annotations

import copy
import hashlib
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from pickaxe.algos.multiagent_configs import is_multiagent
from pickaxe.errors import PickaxeError
from pickaxe.eval.alarms import detect_alarms
from pickaxe.eval.selection import METRICS, SelectConfig, candidates_from_records, resolve_metric, select_best
from pickaxe.eval.stats import (
    finite_number,
    iqm,
    probability_of_improvement,
    samples_to_separate,
    stratified_bootstrap_ci,
)
from pickaxe.exp.checkpoint_fqe import FQE_METRIC, FQEScorer, env_problem, fqe_datasets, rank_agreement
from pickaxe.exp.checkpoint_report import Report, agent_names, format_report, write_outputs
from pickaxe.runs.checkpoint import MANIFEST, TENSORS, CheckpointManager
from pickaxe.runs.model import (
    MODEL_DIGEST_FILE,
    MODEL_FILE,
    SELECTION_FILE,
    _read_json,
    final_model_step,
    write_json_synced,
)
from pickaxe.runs.policies import list_policies
from pickaxe.runs.tracking import read_metrics

if TYPE_CHECKING:
    from pickaxe.offline.fqe_config import FQEConfig
    from pickaxe.train.evaluate import Estimate

CACHE_VERSION = 2
"""Bumped when the cached values or their summaries change meaning (old cache files are then ignored); 2: the CIs
of sampled metrics resample prompts, not completions."""
KEYWORDS = ("all", "best", "latest", "final")


@dataclass(frozen=True)
class CheckpointRef:
    """A candidate: the weights of one env step, where they are kept and their sha256."""

    step: int
    source: str  # "policy" | "checkpoint" | "final"
    sha256: str


def parse_choices(values: Sequence[str], flag: str = "--checkpoints") -> list[str | int]:
    """``all``/``best``/``latest``/``final`` or env steps (digits, optionally ``step-``-prefixed); anything else is a
    one-line ``PickaxeError``."""
    out: list[str | int] = []
    for v in values:
        text = str(v).strip()
        digits = text.removeprefix("step-")
        if text in KEYWORDS:
            out.append(text)
        elif digits.isdigit():
            out.append(int(digits))
        else:
            raise PickaxeError(f"{flag} must be final, best, latest or an env step (or all), got {text!r}")
    if not out:
        raise PickaxeError(f"{flag} needs at least one of all, best, latest, final or an env step")
    return out


def list_candidates(run_dir: Path) -> list[CheckpointRef]:
    """Every kept set of weights of the run, one per env step (policy, else final model, else checkpoint)."""
    refs: dict[int, CheckpointRef] = {}
    for info in CheckpointManager(run_dir).list():
        entry = _read_json(info.path / MANIFEST).get("files", {}).get(TENSORS, {})
        if isinstance(entry, dict) and isinstance(entry.get("sha256"), str):
            refs[info.step] = CheckpointRef(info.step, "checkpoint", entry["sha256"])
    final = _read_json(run_dir / MODEL_DIGEST_FILE)
    if (run_dir / MODEL_FILE).is_file() and isinstance(final.get("step"), int) and isinstance(final.get("sha256"), str):
        refs[final["step"]] = CheckpointRef(final["step"], "final", final["sha256"])
    for p in list_policies(run_dir):
        if p.sha256 is not None:
            refs[p.step] = CheckpointRef(p.step, "policy", p.sha256)
    return [refs[s] for s in sorted(refs)]


def select_config(run_dir: Path, cfg: Any) -> SelectConfig:
    """The run's selection rule: ``selection.json``'s metric, mode and rule, else the config's ``select``."""
    recorded = _read_json(run_dir / SELECTION_FILE)
    base = cfg.select
    if not recorded:
        return base
    try:
        return SelectConfig(
            metric=recorded.get("metric", base.metric),
            mode=recorded.get("mode", base.mode),
            rule=recorded.get("rule", base.rule),
        )
    except Exception:  # a hand-edited selection.json: the config's rule
        return base


def _eval_records(run_dir: Path) -> list[dict[str, Any]]:
    if not (run_dir / "metrics.jsonl").is_file():
        return []
    return [r for r in read_metrics(run_dir) if "step" in r and any(k.startswith("eval/") for k in r)]


def _results_records(run_dir: Path) -> list[dict[str, Any]]:
    """The rows of an earlier ``pickaxe eval --checkpoints`` as metric records (``M``, ``M_ci_low``, ...)."""
    doc = _read_json(run_dir / "eval" / "checkpoints.json")
    rows = doc.get("rows") if isinstance(doc.get("rows"), list) else []
    return [_row_record(r) for r in rows if isinstance(r, dict) and isinstance(r.get("metrics"), dict)]


def _row_record(row: dict[str, Any]) -> dict[str, Any]:
    record: dict[str, Any] = {"step": row["step"]}
    for name, e in row["metrics"].items():
        record.update({name: e.get("mean"), f"{name}_ci_low": e.get("low"), f"{name}_ci_high": e.get("high")})
    return record


def best_step(run_dir: Path, cfg: Any, refs: Sequence[CheckpointRef]) -> int:
    """The step ``best`` means: the run's selection rule over an earlier ``--checkpoints`` evaluation's results when
    there are some, else over the run's logged evaluations (steps with kept weights only)."""
    select = select_config(run_dir, cfg)
    kept = {r.step for r in refs}
    evaluated: set[int] = set()
    logged: set[str] = set()
    for records in (_results_records(run_dir), _eval_records(run_dir)):
        records = [r for r in records if r["step"] in kept]
        evaluated |= {r["step"] for r in records}
        logged |= {k for r in records for k in r if k.startswith("eval/") and not k.endswith(("_ci_low", "_ci_high"))}
        metric = resolve_metric(select, {k for r in records for k in r})
        if metric is None:
            continue
        chosen = select_best(candidates_from_records(records, metric), select, metric)
        if chosen is not None:
            return chosen.step
    if evaluated:  # steps with weights were evaluated, but not on the selection metric
        wanted = select.metric or " or ".join(METRICS)
        raise PickaxeError(
            f"{run_dir}: the selection metric {wanted} is logged at none of its {len(evaluated)} evaluated steps with "
            f"kept weights (they log {', '.join(sorted(logged)) or 'nothing'}), so none is best; name a step or use "
            "--checkpoints latest"
        )
    raise PickaxeError(
        f"{run_dir} has no evaluated step with kept weights, so none is best; name a step or use --checkpoints latest"
    )


def choose(run_dir: Path, cfg: Any, refs: Sequence[CheckpointRef], choices: Sequence[str | int]) -> list[CheckpointRef]:
    """The candidates ``choices`` name, by step, each once."""
    by_step = {r.step: r for r in refs}
    if not refs:
        raise PickaxeError(f"{run_dir} keeps no weights (no policies, checkpoints or final model); train it first")
    steps: list[int] = []
    for c in choices:
        if c == "all":
            steps += list(by_step)
        elif c == "latest":
            steps.append(refs[-1].step)
        elif c == "final":
            final = final_model_step(run_dir)
            if not (run_dir / MODEL_FILE).is_file() or final not in by_step:
                raise PickaxeError(f"{run_dir} has no final model (did the run finish?); use --checkpoints latest")
            steps.append(final)
        elif c == "best":
            steps.append(best_step(run_dir, cfg, refs))
        elif c not in by_step:
            kept = ", ".join(str(s) for s in by_step)
            raise PickaxeError(f"{run_dir} keeps no weights at env step {c}; kept steps: {kept}")
        else:
            steps.append(int(c))
    return [by_step[s] for s in sorted(set(steps))]


# ------------------------------------------------------------------------------------------- evaluation
class _Checkpoints:
    """Loads a run's weights and evaluates them; built on the first cache miss."""

    kind: str
    settings: dict[str, Any]

    def samples(self, ref: CheckpointRef) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def estimates(self, values: dict[str, np.ndarray]) -> dict[str, Estimate]:
        raise NotImplementedError

    def units(self, values: dict[str, np.ndarray], metric: str) -> np.ndarray | None:
        """One value per prompt or episode of ``metric`` (what a paired comparison pairs), or None."""
        raise NotImplementedError


def _load(run_dir: Path, networks: dict[str, Any], ref: CheckpointRef, device: Any) -> None:
    from pickaxe.runs.model import load_model
    from pickaxe.runs.policies import load_policy

    if ref.source == "policy":
        load_policy(run_dir, networks, ref.step, device)
    else:
        load_model(run_dir, networks, device, checkpoint="final" if ref.source == "final" else ref.step)


def _dataset_references(cfg: Any) -> tuple[float, float] | None:
    """The random and expert references of an offline run's dataset (None: an online run, or none recorded)."""
    dataset = getattr(getattr(cfg, "data", None), "dataset", None)
    if dataset is None:
        return None
    from pickaxe.offline.dataset import DatasetError, read_metadata
    from pickaxe.offline.scores import references

    try:
        return references(read_metadata(dataset))
    except DatasetError:
        return None


class _Classic(_Checkpoints):
    kind = "classic"

    def __init__(self, run_dir: Path, cfg: Any, episodes: int | None) -> None:
        self.run_dir, self.cfg = run_dir, cfg
        self.episodes = episodes or cfg.trainer.eval_episodes
        self.settings = {"episodes": self.episodes, "device": cfg.device}
        self._built: tuple[Any, Any, Any] | None = None
        self.refs = _dataset_references(cfg)

    def _scores(self, returns: np.ndarray) -> np.ndarray | None:
        """An offline run's normalised scores of ``returns`` (None without references)."""
        from pickaxe.offline.scores import normalized_score

        return None if self.refs is None else normalized_score(returns, *self.refs)

    def _build(self) -> tuple[Any, Any, Any]:
        if self._built is None:
            from pickaxe.train.build import run_evaluation_setup

            self._built = run_evaluation_setup(self.cfg)  # a multi-agent run's envs too
        return self._built

    def samples(self, ref: CheckpointRef) -> dict[str, np.ndarray]:
        from pickaxe.runs.policies import acting_networks
        from pickaxe.train.evaluate import evaluate

        envs, algo, device = self._build()
        _load(self.run_dir, acting_networks(algo.networks()), ref, device)
        returns, lengths = evaluate(algo.policy, envs, self.episodes, device)
        return {"return": returns.astype(np.float64), "length": lengths.astype(np.float64)}

    def estimates(self, values: dict[str, np.ndarray]) -> dict[str, Estimate]:
        from pickaxe.train.evaluate import BOOTSTRAP_REPS, Estimate, mean_ci

        r, length, n = values["return"], values["length"], len(values["return"])
        return {  # the mean and its CI as the run's EnvEvaluator logs them
            "eval/return_mean": Estimate(float(r.mean()), *mean_ci(r), n),
            "eval/return_iqm": Estimate(iqm(r), *stratified_bootstrap_ci(r, iqm, BOOTSTRAP_REPS, seed=0), n),
            "eval/length_mean": Estimate(float(length.mean()), *mean_ci(length), n),
            **(
                {}
                if (scores := self._scores(r)) is None
                else {"eval/normalized_score": Estimate(float(scores.mean()), *mean_ci(scores), n)}
            ),
        }

    def units(self, values: dict[str, np.ndarray], metric: str) -> np.ndarray | None:
        if metric == "eval/normalized_score":
            return self._scores(values["return"])
        return {"eval/return_mean": values["return"], "eval/length_mean": values["length"]}.get(metric)

    def close(self) -> None:
        if self._built is not None:
            self._built[0].close()


class _MultiAgent(_Classic):
    """A multi-agent run's weights on its own eval envs: the team's total return and each agent's, with CIs."""

    kind = "multiagent"

    def samples(self, ref: CheckpointRef) -> dict[str, np.ndarray]:
        from pickaxe.runs.policies import acting_networks
        from pickaxe.train.multiagent import MultiAgentEvaluator

        envs, algo, device = self._build()
        _load(self.run_dir, acting_networks(algo.networks()), ref, device)
        return MultiAgentEvaluator(envs, self.episodes, device).samples(algo)

    def estimates(self, values: dict[str, np.ndarray]) -> dict[str, Estimate]:
        from pickaxe.train.multiagent import multiagent_estimates

        return multiagent_estimates(values)

    def units(self, values: dict[str, np.ndarray], metric: str) -> np.ndarray | None:
        if not (metric.startswith("eval/") and metric.endswith("_mean")):  # means pair by episode; IQMs do not
            return None
        return values.get(metric.removeprefix("eval/").removesuffix("_mean"))


class _LLM(_Checkpoints):
    kind = "llm"

    def __init__(self, run_dir: Path, cfg: Any, prompts: int | None) -> None:
        from pickaxe.algos.configs import DPOConfig, GRPOConfig, LLMPPOConfig, SFTConfig

        if not isinstance(cfg.algo, GRPOConfig | LLMPPOConfig | SFTConfig | DPOConfig):
            raise PickaxeError(
                f"{run_dir} trains {type(cfg.algo).__name__}, which has no policy to evaluate on held-out prompts; "
                "pickaxe eval --checkpoints takes policy runs (SFT, GRPO, PPO, DPO)"
            )
        cfg = copy.deepcopy(cfg)  # the caller's config stays as it was
        self.run_dir, self.cfg = run_dir, cfg
        if prompts is not None:
            cfg.eval.prompts = prompts
        e = cfg.eval
        self.settings = {
            "prompts": e.prompts,
            "samples": e.samples,
            "pass_k": e.pass_k,
            "temperature": e.temperature,
            "max_new_tokens": cfg.engine.max_new_tokens,
            "seed": cfg.seed,
            "device": cfg.device,
        }
        self._built: tuple[Any, Any, Any, Any] | None = None

    def _build(self) -> tuple[Any, Any, Any, Any]:
        if self._built is None:
            from pickaxe.train.llm import run_evaluator

            self._built = run_evaluator(self.cfg, self.run_dir)
        return self._built

    def samples(self, ref: CheckpointRef) -> dict[str, np.ndarray]:
        model, algo, evaluator, device = self._build()
        _load(self.run_dir, {"policy": model}, ref, device)
        return evaluator.samples(algo)

    def estimates(self, values: dict[str, np.ndarray]) -> dict[str, Estimate]:
        from pickaxe.train.evaluate import text_estimates

        return text_estimates(values)

    def units(self, values: dict[str, np.ndarray], metric: str) -> np.ndarray | None:
        n = len(values["greedy/correct"])
        name = metric.removeprefix("eval/")
        greedy = {"accuracy": "greedy/correct", "return_mean": "greedy/reward", "completion_length": "greedy/length"}
        sampled = {"sampled_return_mean": "sampled/reward", "sampled_length": "sampled/length", "kl": "sampled/kl"}
        if name in greedy:
            return values[greedy[name]]
        if name.startswith("reward/"):
            return values.get(f"greedy/term/{name.removeprefix('reward/')}")
        if name.startswith("pass@"):
            return values.get(f"sampled/{name}")
        key = sampled.get(name) or (
            f"sampled/term/{name.removeprefix('sampled/')}" if name.startswith("sampled/") else ""
        )
        if key not in values:
            return None
        per = np.asarray(values[key], dtype=np.float64).reshape(n, -1)
        with np.errstate(all="ignore"):
            return np.nanmean(per, axis=1)  # one value per prompt: its samples averaged

    def close(self) -> None:
        return None


# ------------------------------------------------------------------------------------------------ cache
def settings_hash(kind: str, settings: dict[str, Any], config: dict[str, Any]) -> str:
    """The digest of what decides an evaluation's numbers besides the weights."""
    doc = {"version": CACHE_VERSION, "kind": kind, "settings": settings, "config": config}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()


def _cache_path(run_dir: Path, ref: CheckpointRef, digest: str) -> Path:
    return run_dir / "eval" / "cache" / f"{ref.sha256[:16]}-{digest[:16]}.json"


def _read_cache(path: Path, ref: CheckpointRef) -> tuple[dict[str, np.ndarray], dict[str, Any]] | None:
    """The cached per-sample values and metric summaries of ``ref``, or None (absent, other weights, damaged)."""
    doc = _read_json(path)
    values, metrics = doc.get("samples"), doc.get("metrics")
    if doc.get("sha256") != ref.sha256 or not isinstance(values, dict) or not isinstance(metrics, dict):
        return None
    try:
        arrays = {k: np.array([np.nan if x is None else x for x in v], dtype=np.float64) for k, v in values.items()}
    except (TypeError, ValueError):
        return None
    return arrays, metrics


def _write_cache(
    path: Path, ref: CheckpointRef, settings: dict[str, Any], values: dict[str, np.ndarray], metrics: dict[str, Any]
) -> None:
    """Keep a checkpoint's per-sample values and their summaries (a pure function of them: the bootstrap is seeded)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "sha256": ref.sha256,
        "step": ref.step,
        "source": ref.source,
        "settings": settings,
        "metrics": metrics,
        "samples": {k: [finite_number(x) for x in np.asarray(v, dtype=np.float64).tolist()] for k, v in values.items()},
    }
    write_json_synced(path, doc)


# ----------------------------------------------------------------------------------------------- report
def evaluate_checkpoints(
    run_dir: str | Path,
    cfg: Any,
    choices: Sequence[str | int],
    episodes: int | None = None,
    cache: bool = True,
    on_progress: Callable[[str], None] | None = None,
    fqe: FQEConfig | None = None,
    env: bool = True,
    select_metric: str | None = None,
) -> Report:
    """Evaluate the chosen checkpoints of the run in ``run_dir`` (config ``cfg``, as ``load_run_config`` reads it;
    ``episodes``: episodes or, for LLM runs, held-out prompts; default the run's own) and write
    ``RUN/eval/checkpoints.json``, ``.csv`` and the plots. ``cache=False`` re-evaluates (and rewrites the cache).
    ``fqe`` adds fitted Q evaluation on the run's dataset (``eval/fqe_value``) and its rank agreement with the online
    return; ``env=False`` (classic runs with ``fqe`` only) leaves the online evaluation out. ``select_metric`` picks
    the best checkpoint by that metric instead of the run's (one of the metrics evaluated)."""
    from pickaxe.train.config import TrainConfig

    run_dir = Path(run_dir)
    multiagent = isinstance(cfg, TrainConfig) and is_multiagent(cfg.algo)
    if multiagent and fqe is not None:
        raise PickaxeError(f"{run_dir} is a multi-agent run: FQE scores single-agent policies; leave --fqe out")
    if multiagent and select_metric is not None:
        _check_multiagent_metric(run_dir, select_metric)
    refs = list_candidates(run_dir)
    chosen = choose(run_dir, cfg, refs, choices)
    evaluators: list[tuple[Any, str]] = []
    settings: dict[str, Any] = {}
    if env or fqe is None:
        online: _Checkpoints = (
            _LLM(run_dir, cfg, episodes)
            if not isinstance(cfg, TrainConfig)
            else _MultiAgent(run_dir, cfg, episodes)
            if is_multiagent(cfg.algo)
            else _Classic(run_dir, cfg, episodes)
        )
        digest = settings_hash(online.kind, online.settings, cfg.to_dict())
        evaluators.append((online, digest))
        settings.update({**online.settings, "cache_key": digest[:16]})
    if fqe is not None:

        def load(ref: CheckpointRef, networks: dict[str, Any], device: Any) -> None:
            _load(run_dir, networks, ref, device)

        scorer = FQEScorer(run_dir, cfg, fqe, fqe_datasets(cfg, fqe, run_dir), load)
        digest = settings_hash("fqe", scorer.settings, cfg.to_dict())
        evaluators.append((scorer, digest))
        settings.update({**scorer.settings, "fqe_cache_key": digest[:16]})
    rows, units, cached = [], {}, 0
    try:
        for ref in chosen:
            values: dict[str, np.ndarray] = {}
            metrics: dict[str, Any] = {}
            hits = 0
            for evaluator, digest in evaluators:
                path = _cache_path(run_dir, ref, digest)
                hit = _read_cache(path, ref) if cache else None
                if hit is None:
                    if on_progress is not None:
                        what = "fitting FQE for" if isinstance(evaluator, FQEScorer) else "evaluating"
                        on_progress(f"{what} step {ref.step} ({ref.source})")
                    part = evaluator.samples(ref)
                    found = {
                        k: {"mean": finite_number(e.mean), "low": finite_number(e.low), "high": finite_number(e.high),
                            "n": e.n}
                        for k, e in evaluator.estimates(part).items()
                    }  # fmt: skip
                    _write_cache(path, ref, evaluator.settings, part, found)
                else:
                    part, found = hit
                    hits += 1
                values.update(part)
                metrics.update(found)
            cached += hits == len(evaluators)  # a row from the cache: every part of it
            rows.append({"step": ref.step, "source": ref.source, "sha256": ref.sha256, "metrics": metrics})
            units[ref.step] = values
    finally:
        for evaluator, _ in evaluators:
            close = getattr(evaluator, "close", None)
            if close is not None:
                close()
    kind = "llm" if not isinstance(cfg, TrainConfig) else "multiagent" if is_multiagent(cfg.algo) else "classic"
    names = list(dict.fromkeys(k for r in rows for k in r["metrics"]))
    records = [_row_record(r) for r in rows]
    select = select_config(run_dir, cfg)
    if select_metric is not None:
        if select_metric not in names:
            raise PickaxeError(f"--select-metric {select_metric} was not evaluated; evaluated: {', '.join(names)}")
        select = SelectConfig(metric=select_metric, mode=select.mode, rule=select.rule)
    metric = resolve_metric(select, names)
    if metric is None and FQE_METRIC in names:  # no online return here: FQE's estimate picks
        select = SelectConfig(metric=FQE_METRIC, mode="max", rule=select.rule)
        metric = FQE_METRIC
    best = None
    if metric is not None:
        chosen_best = select_best(candidates_from_records(records, metric), select, metric)
        best = {**asdict(chosen_best), "mode": select.mode} if chosen_best is not None else None
    alarms: list[dict[str, Any]] = []
    if kind == "llm":  # classic runs have no alarms section: no gold, proxy or length to watch
        alarms = [a.to_dict() for a in detect_alarms(records, cfg.alarms)]
    pairs = _pairs(records, units, [e for e, _ in evaluators], metric, select)
    agreement = rank_agreement(rows, "eval/return_mean") if fqe is not None else None
    report = Report(str(run_dir), kind, settings, names, rows, best, alarms, pairs, agreement=agreement,
                    cached=cached)  # fmt: skip
    write_outputs(run_dir, report)
    return report


def _check_multiagent_metric(run_dir: Path, metric: str) -> None:
    """``--select-metric`` of a multi-agent run names a metric its evaluation gives (the agents as its logged
    evaluations name them), checked before anything is evaluated."""
    agents = agent_names(list(dict.fromkeys(k for r in _eval_records(run_dir) for k in r)))
    if not agents:  # nothing logged yet to name the agents: checked against the results
        return
    names = [f"eval/return_{s}" for s in ("mean", "iqm")] + ["eval/length_mean"]
    names += [f"eval/agent/{a}/return_{s}" for a in agents for s in ("mean", "iqm")]
    if metric not in names:
        raise PickaxeError(f"--select-metric {metric} is not evaluated for this run; evaluated: {', '.join(names)}")


def _pairs(
    records: list[dict[str, Any]],
    values: dict[int, dict[str, np.ndarray]],
    evaluators: Sequence[Any],
    metric: str | None,
    select: SelectConfig,
) -> list[dict[str, Any]]:
    """The top two checkpoints by ``metric``: their difference, the probability that a sample of the first beats one
    of the second, and how many more samples (paired) would separate them."""
    if metric is None:
        return []
    sign = 1.0 if select.mode == "max" else -1.0
    ranked = sorted((c for c in candidates_from_records(records, metric)), key=lambda c: (-sign * c.mean, c.step))
    if len(ranked) < 2:
        return []
    a, b = ranked[0], ranked[1]
    ua = ub = None
    for evaluator in evaluators:  # the evaluator that measures ``metric``
        if (ua := evaluator.units(values[a.step], metric)) is not None:
            ub = evaluator.units(values[b.step], metric)
            break
    pair: dict[str, Any] = {"a": a.step, "b": b.step, "metric": metric, "difference": a.mean - b.mean}
    more = poi = None
    if ua is not None and ub is not None and len(ua) == len(ub):
        ok = np.isfinite(ua) & np.isfinite(ub)
        if ok.sum() >= 2:
            more = samples_to_separate(ua[ok], ub[ok], paired=True)
            poi = probability_of_improvement(sign * ua[ok], sign * ub[ok])
    pair.update({"more_samples": more, "probability_of_improvement": poi, "paired": True})
    return [pair]


def main(
    run_dir: str | Path,
    cfg: Any,
    choices: Sequence[str | int],
    episodes: int | None,
    cache: bool,
    fqe: FQEConfig | None = None,
    env: bool = True,
    select_metric: str | None = None,
) -> int:
    """What ``pickaxe eval RUN_DIR --checkpoints ... [--fqe] [--no-env]`` does: evaluate, write the files, print the
    table. With ``fqe`` and an env that cannot be built here, the FQE estimate alone (said on stderr)."""
    if fqe is not None and env:
        problem = env_problem(cfg)
        if problem is not None:
            print(f"pickaxe: env {cfg.env.id} cannot be built here ({problem}); FQE alone", file=sys.stderr)
            env = False
    report = evaluate_checkpoints(run_dir, cfg, choices, episodes, cache,
                                  on_progress=lambda m: print(f"pickaxe: {m}", file=sys.stderr), fqe=fqe,
                                  env=env, select_metric=select_metric)  # fmt: skip
    print(format_report(report))
    return 0


__all__ = ["CheckpointRef", "Report", "evaluate_checkpoints", "format_report", "list_candidates"]
