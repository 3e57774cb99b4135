#!/usr/bin/env bash
# Mutation testing, slow tier: mutmut over the given module groups (default: algos data rollout runs; queue is
# configured, run it on its own), in a scratch copy of the tree so that mutmut's mutants/ folder and its
# mutated imports never touch the working tree. One test process at a time, niced (CPU is shared).
#
#   tests/mutation/run.sh                 # algos data rollout runs
#   tests/mutation/run.sh algos           # one group (see tests/mutation/groups.py)
#   MUTATION_WORKDIR=/tmp/m tests/mutation/run.sh data
#
# Writes $MUTATION_WORKDIR/summary.txt (kill ratio per module) and $MUTATION_WORKDIR/results.txt.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PY="$ROOT/.venv/bin/python"
MUTMUT="$ROOT/.venv/bin/mutmut"
[ -x "$MUTMUT" ] || { echo "mutmut is not installed: $ROOT/.venv/bin/pip install -e '.[mutation]'" >&2; exit 2; }
GROUP_LIST=("$@")
[ ${#GROUP_LIST[@]} -gt 0 ] || GROUP_LIST=(algos data rollout runs)
WORK=${MUTATION_WORKDIR:-/tmp/pickaxe-mutation}
rm -rf "$WORK" && mkdir -p "$WORK"
cp -r "$ROOT/src" "$ROOT/tests" "$ROOT/pyproject.toml" "$WORK/"
find "$WORK" -name __pycache__ -prune -exec rm -rf {} +
"$PY" "$ROOT/tests/mutation/groups.py" "$WORK/pyproject.toml" "${GROUP_LIST[@]}"
cd "$WORK"
start=$(date +%s)
# Subprocesses started by tests import the mutated copy too (mutmut itself only fixes sys.path in-process).
# The folder must exist before Python starts: a PYTHONPATH entry missing at startup is cached as absent.
mkdir -p "$WORK/mutants/src"
export PYTHONPATH="$WORK/mutants/src" OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
nice -n 10 "$MUTMUT" run --max-children 1 > "$WORK/run.log" 2>&1 || echo "mutmut run exited with $? (see $WORK/run.log)"
"$MUTMUT" results --all true > "$WORK/results.txt" 2>&1 || true
"$PY" "$ROOT/tests/mutation/summary.py" "$WORK/results.txt" "$(( $(date +%s) - start ))" | tee "$WORK/summary.txt"
