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
