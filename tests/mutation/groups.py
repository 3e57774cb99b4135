"""Module groups for mutation testing: what mutmut mutates in each, and the fastest tests that exercise it.

``python tests/mutation/groups.py PYPROJECT GROUP...`` rewrites the ``[tool.mutmut]`` section of a scratch
copy's ``pyproject.toml`` for those groups (``tests/mutation/run.sh`` calls it; the repository's own
pyproject keeps the all-groups default).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

GROUPS: dict[str, tuple[list[str], list[str]]] = {
    "algos": (
        [
            "src/pickaxe/algos/ppo.py",
            "src/pickaxe/algos/dqn.py",
            "src/pickaxe/algos/core.py",
            "src/pickaxe/algos/base.py",
        ],
        ["tests/test_losses.py", "tests/test_options_ppo.py", "tests/test_options_dqn.py", "tests/test_dqn_family.py"],
    ),
    "data": (
        ["src/pickaxe/data/*"],
        [
            "tests/test_buffers.py",
            "tests/test_returns.py",
            "tests/test_options_ppo.py",
            "tests/test_options_dqn.py",
            "tests/test_dqn_family.py",
        ],
    ),
    "rollout": (
        ["src/pickaxe/rollout/collector.py"],
        ["tests/test_collector.py", "tests/test_collector_options.py", "tests/test_twin_mlp.py"],
    ),
    "runs": (
        ["src/pickaxe/runs/*"],
        [
            "tests/test_checkpoint.py",
            "tests/test_checkpoint_messages.py",
            "tests/test_runs_records.py",
            "tests/test_runs_tracking.py",
            "tests/test_runs_folder.py",
            "tests/test_run_status.py",
            "tests/test_run_dir.py",
            "tests/test_monitoring.py",
        ],
    ),
    # The newer modules (issue 26). Their named-mutant sample (tests/mutation/named_mutants.py --area ...) is the
    # measurement on the shared 2-core machine; these groups are for a full mutmut run where there is time for it.
    "offpolicy": (
        ["src/pickaxe/algos/sac.py", "src/pickaxe/algos/td3.py", "src/pickaxe/models/continuous.py"],
        [
            "tests/test_td3.py",
            "tests/test_sac.py",
            "--deselect=tests/test_td3.py::test_pendulum_td3_recipe_solves_pendulum",
            "--deselect=tests/test_sac.py::test_pendulum_sac_recipe_solves_pendulum",
            "--deselect=tests/test_sac.py::test_killed_and_resumed_sac_run_equals_uninterrupted_run",
        ],
    ),
    "llm-algos": (
        [
            "src/pickaxe/algos/llm_ppo.py",
            "src/pickaxe/algos/grpo.py",
            "src/pickaxe/algos/dpo.py",
            "src/pickaxe/algos/reward_model.py",
            "src/pickaxe/algos/rlhf_core.py",
        ],
        [
            "tests/test_llm_core.py",
            "tests/test_rlhf_core.py",
            "tests/test_critic_free.py",
            "tests/test_llm_ppo.py",
            "tests/test_dpo.py",
            "tests/test_reward_model.py",
            "tests/test_llm_training.py::test_grpo_gradient_accumulation_invariance",
            "tests/test_llm_training.py::test_grpo_variants_update",
            "tests/test_llm_training.py::test_grpo_logs_checks_and_stays_quiet_on_policy",
        ],
    ),
    "eval": (
        ["src/pickaxe/eval/*"],
        [
            "tests/test_arena.py",
            "tests/test_alarms.py",
            "tests/test_selection.py",
            "tests/test_stats.py",
            "tests/test_eval_estimates.py",
            "tests/test_llm_core.py::test_pass_at_k_and_wilson",
        ],
    ),
    # The Ray paths (EngineGroup, RayVectorEnv, RayJobs, spawned learners) run in tests/test_dist_*.py with a local
    # Ray; these in-process tests cover the rest.
    "dist": (
        ["src/pickaxe/dist/*"],
        [
            "tests/test_dist_config.py",
            "tests/test_dist_llm.py::test_an_engine_worker_reloads_its_weights_after_a_state_restore",
        ],
    ),
    "agent": (
        ["src/pickaxe/rollout/agent.py", "src/pickaxe/rollout/pipelined.py"],
        [
            "tests/test_agents.py",
            "tests/test_dist_llm.py::test_async_drops_and_regenerates_a_batch_behind_the_bound",
            "tests/test_dist_llm.py::test_async_keeps_a_batch_exactly_at_the_staleness_bound",
            "tests/test_dist_llm.py::test_pipelined_batch_k_is_generated_by_version_k_minus_the_staleness",
            "tests/test_dist_llm.py::test_scheduler_state_holds_the_batches_in_flight_and_their_prompts",
            "tests/test_dist_llm.py::test_only_async_lets_workers_take_newer_weights",
        ],
    ),
    "exp": (
        ["src/pickaxe/exp/pipeline.py", "src/pickaxe/exp/checkpoint_eval.py"],
        [
            "tests/test_pipeline.py",
            "tests/test_checkpoint_eval.py",
            "--deselect=tests/test_pipeline.py::test_pipeline_resumes_a_killed_stage",
        ],
    ),
    # Run it last. Code reached only from worker subprocesses is not traced by mutmut ("no tests"); the
    # in-process tests (queue_store, queue_cli, processes) trace it. The real-training recovery test (12 s,
    # run for every surviving mutant of add/claim/finish...) is left to the plain test suite.
    "queue": (
        ["src/pickaxe/exp/queue*", "src/pickaxe/exp/processes.py"],
        [
            "tests/test_queue_store.py",
            "tests/test_queue_cli.py",
            "tests/test_processes.py",
            "tests/test_queue.py",
            "--deselect=tests/test_queue.py::test_worker_sigkill_loses_nothing_and_resumes_training",
        ],
    ),
}


def section(groups: list[str]) -> str:
    """The ``[tool.mutmut]`` TOML section for ``groups``."""
    mutate = [p for g in groups for p in GROUPS[g][0]]
    tests = list(dict.fromkeys(t for g in groups for t in GROUPS[g][1]))
    return (
        "[tool.mutmut]\n"
        'source_paths = ["src/"]\n'
        f"only_mutate = {mutate!r}\n"
        'pytest_add_cli_args = ["-p", "no:cacheprovider", "-m", "not slow"]\n'
        f"pytest_add_cli_args_test_selection = {tests!r}\n"
    ).replace("'", '"')


def main() -> int:
    """Rewrite the ``[tool.mutmut]`` section of the given pyproject for the given groups."""
    path, groups = Path(sys.argv[1]), sys.argv[2:]
    unknown = [g for g in groups if g not in GROUPS]
    if unknown or not groups:
        print(f"unknown or no groups {unknown}; choose from {sorted(GROUPS)}", file=sys.stderr)
        return 2
    text = re.sub(r"\n\[tool\.mutmut\]\n(?:(?!\n\[).)*", "\n", path.read_text(), flags=re.S)
    path.write_text(text.rstrip("\n") + "\n\n" + section(groups))
    return 0


if __name__ == "__main__":
    sys.exit(main())
