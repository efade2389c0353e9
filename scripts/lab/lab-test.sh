#!/usr/bin/env bash
# Full test sequence of one molecule scenario, each step timed, with the peak memory of the
# machine sampled meanwhile. Same steps as `molecule test`; prints a timing table and the
# idempotent re-run / first converge ratio. Always destroys the lab at the end.
#   scripts/lab/lab-test.sh default|rdma
set -uo pipefail
scenario=${1:-default}
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
lab() { local step=$1; shift; "$here/molecule.sh" "$step" -s "$scenario" "$@"; }

# Prepare caches once (docker, image, wheelhouse, model), then skip it for each step.
"$here/molecule.sh" --version >/dev/null || exit 1
export PD_LAB_SKIP_PREPARE=1

peak_file=$(mktemp)
( peak=0; while :; do
    used=$(free -m | awk '/^Mem:/ {print $3}'); ((used > peak)) && peak=$used && echo "$peak" > "$peak_file"
    sleep 5; done ) &
sampler=$!
trap 'kill $sampler 2>/dev/null' EXIT

steps=(destroy syntax create)
[[ -f "$repo/molecule/$scenario/prepare.yml" ]] && steps+=(prepare)
steps+=(converge idempotence verify)
# The docker lab then switches to store mode (MooncakeStoreConnector) with a rolling re-converge
# and runs verify again: the same checks, with what store mode can show.
[[ "$scenario" == default ]] && steps+=(converge-store verify-store)
declare -A took
rc=0
for step in "${steps[@]}"; do
  start=$(date +%s)
  case $step in
    converge-store) lab converge -- -e vllm_kv_connector=MooncakeStoreConnector ;;
    verify-store) lab verify ;;
    *) lab "$step" ;;
  esac || { rc=1; echo "[lab-test] $scenario: $step FAILED" >&2; }
  took[$step]=$(( $(date +%s) - start ))
  ((rc)) && break
done
start=$(date +%s); lab destroy || rc=1; took[destroy-end]=$(( $(date +%s) - start ))

echo
echo "[lab-test] scenario $scenario: $( ((rc)) && echo FAILED || echo passed)"
for step in "${steps[@]}" destroy-end; do [[ -n "${took[$step]:-}" ]] && printf '  %-12s %5s s\n' "$step" "${took[$step]}"; done
if [[ -n "${took[converge]:-}" && -n "${took[idempotence]:-}" ]]; then
  awk -v a="${took[idempotence]}" -v b="${took[converge]}" 'BEGIN {printf "  re-run / first converge = %d s / %d s = %.2f\n", a, b, a / b}'
fi
echo "  peak memory used on this machine: $(cat "$peak_file" 2>/dev/null || echo 0) MiB"
exit $rc
