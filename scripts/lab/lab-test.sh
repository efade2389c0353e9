#!/usr/bin/env bash
# `molecule test` of one scenario, timed per step (scripts/lab/step_times.py), with the peak memory
# of the machine sampled meanwhile. The sequence itself is molecule.yml's test_sequence; the
# default scenario's extra steps (rerun, proof, status, drills, rolling, scale, pools, converge-store, then verify
# in store mode) hang on it as side_effect (molecule/default/lab-steps.yml). The lab is torn down
# before and after, passed or failed, by molecule.sh destroy, which also waits for a busy docker
# (molecule's own destroy steps are skipped with --destroy=never).
#   scripts/lab/lab-test.sh default|rdma
set -uo pipefail
scenario=${1:-default}
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
py=$repo/.venv/bin/python

# Prepare caches once (docker, image, wheelhouse, model), then skip it in molecule's steps.
"$here/molecule.sh" --version >/dev/null || exit 1
export PD_LAB_SKIP_PREPARE=1

peak_file=$(mktemp)
( peak=0; while :; do
    used=$(free -m | awk '/^Mem:/ {print $3}'); ((used > peak)) && peak=$used && echo "$peak" > "$peak_file"
    sleep 5; done ) &
sampler=$!
trap 'kill $sampler 2>/dev/null' EXIT

# Facts cached by an earlier lab of this scenario must not leak into a new one.
rm -rf "$repo/.cache/lab-facts/$scenario"
export PD_LAB_RESULTS=${PD_LAB_RESULTS:-$repo/lab-results/$scenario}
mkdir -p "$PD_LAB_RESULTS"

"$here/molecule.sh" destroy -s "$scenario" >/dev/null 2>&1 || true
# A no-change re-run fails the run above this fraction of the first converge (both timed in this run): issue 33's
# goal, 0.20 (the speed-ups gated on tested ansible-core versions). Issue 12's older 0.15 is printed as met or not on
# every run. A first re-run over the bound is sampled again and the faster counts (step_times.py; the machine's noise
# is in one sample).
# The lab steps read the same bound (the second re-run sample runs only when the first misses it).
export PD_LAB_RERUN_MAX_RATIO=${PD_LAB_RERUN_MAX_RATIO:-0.20}
rm -f "$PD_LAB_RESULTS/converge.seconds"
ratio_goal=()
[[ $scenario == default ]] && ratio_goal=(--rerun-max-ratio "$PD_LAB_RERUN_MAX_RATIO")
"$here/molecule.sh" test -s "$scenario" --destroy=never 2>&1 | "$py" "$here/step_times.py" --results "$PD_LAB_RESULTS" "${ratio_goal[@]}"
rc=$(( PIPESTATUS[0] | PIPESTATUS[1] ))
start=$(date +%s)
"$here/molecule.sh" destroy -s "$scenario" >"$PD_LAB_RESULTS/step-destroy-end.log" 2>&1 || { rc=1; tail -20 "$PD_LAB_RESULTS/step-destroy-end.log"; }
echo "  destroy        $(( $(date +%s) - start )) s"
echo "  peak memory used on this machine: $(cat "$peak_file" 2>/dev/null || echo 0) MiB"
echo "[lab-test] scenario $scenario: $( ((rc)) && echo FAILED || echo passed)"
exit $rc
