#!/usr/bin/env bash
# Mutation testing, slow tier: mutmut over the given module groups (default: algos data rollout runs; queue is
# configured, run it on its own), in a scratch copy of the committed tree (git archive of MUTATION_REF, default
# HEAD: uncommitted edits in a shared checkout never reach the run; commit new tests first) so that mutmut's
# mutants/ folder and its mutated imports never touch the working tree. One test process at a time, niced.
#
#   tests/mutation/run.sh                 # algos data rollout runs
#   tests/mutation/run.sh algos           # one group (see tests/mutation/groups.py)
#   MUTATION_WORKDIR=/tmp/m tests/mutation/run.sh data
#   MUTANTS='pickaxe.runs.folder.* pickaxe.runs.tracking.*' tests/mutation/run.sh runs   # only these mutants
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
REF=${MUTATION_REF:-HEAD}
git -C "$ROOT" archive --format=tar "$REF" src tests pyproject.toml | tar -x -C "$WORK"
echo "mutating $(git -C "$ROOT" rev-parse --short "$REF") ($REF); uncommitted changes are not included" >&2
"$PY" "$WORK/tests/mutation/groups.py" "$WORK/pyproject.toml" "${GROUP_LIST[@]}"
cd "$WORK"
start=$(date +%s)
# Subprocesses started by tests import the mutated copy too (mutmut itself only fixes sys.path in-process).
# The folder must exist before Python starts: a PYTHONPATH entry missing at startup is cached as absent.
mkdir -p "$WORK/mutants/src"
export PYTHONPATH="$WORK/mutants/src" OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
# MUTANTS: mutant names or globs (mutmut's own syntax, e.g. 'pickaxe.runs.folder.x_unique_path*'); unset: all.
read -r -a NAMES <<< "${MUTANTS:-}"
nice -n 10 "$MUTMUT" run --max-children 1 "${NAMES[@]}" > "$WORK/run.log" 2>&1 || echo "mutmut run exited with $? (see $WORK/run.log)"
"$MUTMUT" results --all true > "$WORK/results.txt" 2>&1 || true
"$PY" "$WORK/tests/mutation/summary.py" "$WORK/results.txt" "$(( $(date +%s) - start ))" | tee "$WORK/summary.txt"
