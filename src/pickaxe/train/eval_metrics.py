"""The evaluation metrics a run will log, known from its config before it starts (torch-free).

``--select.metric`` must name one of them: the best-checkpoint rule reads it from the evaluation records, and a
metric the run never logs would leave it without a ``selection.json``. The names follow the run's evaluator:
``EnvEvaluator`` (classic runs), ``TextEvaluator`` through ``text_estimates`` (SFT, GRPO, PPO and DPO runs, which
add their held-out pair metrics), ``PairAccuracyEvaluator`` (reward models) and the best-of-n records;
``tests/test_eval_metrics.py`` trains each kind of run and checks that it logs exactly these.
"""

from __future__ import annotations

from typing import Any

from pickaxe.errors import ConfigError

CLASSIC = ("eval/return_mean", "eval/return_std", "eval/length_mean")
"""``EnvEvaluator``'s metrics."""
TEXT = ("eval/accuracy", "eval/return_mean", "eval/completion_length", "eval/prompts")
"""``TextEvaluator``'s greedy metrics (every policy run)."""
TEXT_SAMPLED = ("eval/sampled_length", "eval/entropy")
"""``TextEvaluator``'s metrics of sampled completions (``eval.samples`` > 0), besides pass@k."""
DPO_PAIRS = ("eval/dpo_eval", "eval/eval_accuracy", "eval/eval_margin", "eval/eval_chosen_reward",
             "eval/eval_rejected_reward")  # fmt: skip
"""A DPO run's held-out pair metrics (``DPO.evaluate``'s, under ``eval/``)."""
REWARD_MODEL = ("eval/accuracy", "eval/return_mean", "eval/pairs")
"""A reward-model run's held-out pairwise accuracy."""
BEST_OF_N = ("eval/kl", "eval/reward/proxy", "eval/return_mean", "eval/picks")
"""A best-of-n run's records (with ``data.gold``: ``eval/reward/gold`` and its standard error too)."""


def reward_terms(cfg: Any) -> list[str] | None:
    """The names of an LLM run's reward terms as its ``PromptEnv`` gets them (``build_env``): the reward spec's terms,
    ``proxy`` for a reward model, the gold score(s); None for an agent run (its tool env adds terms of its own)."""
    if cfg.agent.enabled:
        return None
    from pickaxe.envs.text.rewards import parse_reward_spec
    from pickaxe.envs.text.synthetic_preferences import GOLD_SCORES

    d = cfg.data
    python = dict.fromkeys(d.python_reward_names(), len)
    named = {} if d.path else {"verify": len}  # a task's check is the name verify; only names are used here
    spec = d.reward or ("verify" if "verify" in named else "exact")
    names = [name for name, _, _ in parse_reward_spec(spec, {**GOLD_SCORES, **named, **python})]
    names += ["proxy"] if d.reward_model else []
    if d.gold:
        gold = parse_reward_spec(d.gold, {**GOLD_SCORES, **python})
        names += ["gold"] if len(gold) == 1 else [name for name, _, _ in gold]
    return names


def offline_metrics(cfg: Any) -> set[str]:
    """An offline run's extra eval metric: ``eval/normalized_score`` when its dataset records random and expert
    references (read from the dataset's metadata; a dataset that cannot be read adds nothing here, its own check
    reports it)."""
    dataset = getattr(getattr(cfg, "data", None), "dataset", None)
    if dataset is None:
        return set()
    from pickaxe.offline.dataset import DatasetError, read_metadata
    from pickaxe.offline.scores import references

    try:
        return {"eval/normalized_score"} if references(read_metadata(dataset)) is not None else set()
    except DatasetError:
        return set()


GOALS = ("eval/success_rate",)
"""``EnvEvaluator``'s metric on envs that report ``info["is_success"]`` (goal envs)."""


def goal_metrics(cfg: Any) -> set[str]:
    """A hindsight-replay run's success rate (``--algo.her``: its env is a goal env, whose episodes report success).
    Other classic runs on goal envs log it too: ``check_logged_metric`` makes the env to see, when asked for it."""
    return set(GOALS) if getattr(cfg.algo, "her", "none") != "none" else set()


def on_goal_env(cfg: Any) -> bool:
    """Whether a classic run's env gives goal observations (its episodes report success); made here and closed."""
    from pickaxe.envs.make import spaces_of
    from pickaxe.envs.spaces import GoalBox

    return cfg.KIND == "classic" and isinstance(spaces_of(cfg.env.id, cfg.env.kwargs)[0], GoalBox)


def eval_metric_names(cfg: Any) -> tuple[set[str], tuple[str, ...]]:
    """The ``eval/`` metrics the run of ``cfg`` logs at every evaluation: exact names, and prefixes any name under
    which is logged (an agent run's per-term metrics, whose names its tools decide)."""
    if cfg.KIND == "classic":
        if getattr(type(cfg.algo), "multiagent", False):  # MultiAgentEvaluator: the total and each agent's return
            return set(CLASSIC), ("eval/agent/",)
        return set(CLASSIC) | offline_metrics(cfg) | goal_metrics(cfg), ()
    algo, name = cfg.algo, cfg.algo_name()
    if name == "rm":
        return set(REWARD_MODEL), ()
    if name == "bon":
        return set(BEST_OF_N) | ({"eval/reward/gold", "eval/reward/gold_se"} if cfg.data.gold else set()), ()
    names = set(TEXT)
    terms = reward_terms(cfg)
    per_term = terms is None or len(terms) > 1  # text_estimates logs each term when there is more than one
    prefixes = ("eval/reward/", "eval/sampled/") if terms is None else ()
    if per_term and terms is not None:
        names |= {f"eval/reward/{t}" for t in terms}
    e = cfg.eval
    if e.samples > 0:
        names |= set(TEXT_SAMPLED) | {f"eval/pass@{k}" for k in {1, min(e.pass_k, e.samples)}}
        if per_term:
            names |= {"eval/sampled_return_mean"} | {f"eval/sampled/{t}" for t in terms or ()}
        reference = name == "dpo" or (name in ("grpo", "ppo") and algo.kl_coef > 0)  # the KL's frozen reference
        names |= {"eval/kl"} if reference else set()
    if name == "dpo":
        names |= set(DPO_PAIRS)
    return names, prefixes


def check_select_metric(cfg: Any) -> None:
    """``--select.metric`` and (with a target) ``--trainer.target-metric`` name metrics the run logs at its
    evaluations (``ConfigError`` listing them otherwise)."""
    check_logged_metric(cfg, cfg.select.metric, "--select.metric")
    trainer = getattr(cfg, "trainer", None)
    if trainer is not None and trainer.target_return is not None:
        check_logged_metric(cfg, trainer.target_metric, "--trainer.target-metric")


def check_logged_metric(cfg: Any, metric: str | None, flag: str) -> None:
    """``metric`` (given by ``flag``) is one the run logs at its evaluations (``ConfigError`` listing them
    otherwise)."""
    if metric is None:
        return
    names, prefixes = eval_metric_names(cfg)
    if metric in names or any(metric.startswith(p) for p in prefixes):
        return
    if metric in GOALS and on_goal_env(cfg):
        return
    import difflib

    close = difflib.get_close_matches(metric, sorted(names), n=1, cutoff=0.5)
    hint = f"did you mean {close[0]!r}? " if close else ""
    shown = ", ".join(sorted(names)) + "".join(f", {p}*" for p in prefixes)
    raise ConfigError(
        f"{flag} {metric!r} is not a metric this run logs at its evaluations; {hint}this run logs: {shown}"
    )
