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

# Facts cached by an earlier lab of this scenario must not leak into a new one.
rm -rf "$repo/.cache/lab-facts/$scenario"
steps=(destroy syntax create)
[[ -f "$repo/molecule/$scenario/prepare.yml" ]] && steps+=(prepare)
steps+=(converge idempotence verify)
# The docker lab then runs, on the same converged lab (created once):
#   rerun     site.yml again without its verify plays: the fast re-run (changed=0), timed
#   proof     bad inventories refused before any host changes; --check --diff reports no change
#   status    playbooks/status.yml green, then red with one unit stopped
#   drills    kill -9 of every service kind, an etcd member down, master failover (recovery times)
#   rolling   a vLLM argument changed under load: rolling restart, 0 failed requests
#   bench     benchmark.yml (PD vs colocated, CSV + PNG) and the router overhead (p50/p99)
# and finally switches to store mode (MooncakeStoreConnector) with a rolling re-converge and runs
# verify again: the same checks, with what store mode can show.
# CI runs all of them but bench (a few minutes, numbers that say nothing about GPUs; `make lab-bench`
# on a lab from `make lab`, like make lab-status, lab-drills and lab-rolling).
# PD_LAB_EXTRA_STEPS adds steps, e.g. "bench".
# shellcheck disable=SC2206
[[ "$scenario" == default ]] && steps+=(rerun proof status drills rolling converge-store verify-store ${PD_LAB_EXTRA_STEPS:-})
results=${PD_LAB_RESULTS:-$repo/lab-results}
mkdir -p "$results"
inv=$repo/molecule/default/inventory
py=$repo/.venv/bin/python
[[ -f "$repo/molecule/$scenario/vault-pass-LAB-ONLY" ]] && export ANSIBLE_VAULT_PASSWORD_FILE="$repo/molecule/$scenario/vault-pass-LAB-ONLY"
play() { (cd "$repo" && "$repo/.venv/bin/ansible-playbook" -i "$inv" "$@"); }
rerun() {
  local log=$results/rerun.log
  play site.yml --skip-tags verify > "$log" 2>&1 || { tail -40 "$log"; return 1; }
  grep -A12 "PLAY RECAP" "$log" | grep -E "changed=[1-9]" && { echo "[lab-test] re-run changed something" >&2; return 1; }
  return 0
}
declare -A took
rc=0
# Each step's output goes to the terminal and to $results/step-<name>.log; the tail of a failed
# step is printed again after the timing table, because CI keeps only the end of the output.
failed_step=
for step in "${steps[@]}"; do
  start=$(date +%s)
  {
  case $step in
    converge-store) lab converge -- -e vllm_kv_connector=MooncakeStoreConnector ;;
    rerun) rerun ;;
    proof) (cd "$repo" && "$py" scripts/lab/bad-input-proof.py --inventory "$inv" --out "$results/bad-input-proof.json") ;;
    status) PD_LAB_VENV=$repo/.venv "$here/status-test.sh" ;;
    drills) (cd "$repo" && "$py" scripts/lab/drills.py --inventory "$inv" --out "$results/drills.json") ;;
    rolling) "$here/rolling-test.sh" "$results" ;;
    bench) (cd "$repo" && make --no-print-directory lab-bench) ;;
    verify-store) lab verify ;;
    *) lab "$step" ;;
  esac
  } > >(tee "$results/step-$step.log") 2>&1 || { rc=1; failed_step=$step; echo "[lab-test] $scenario: $step FAILED" >&2; }
  took[$step]=$(( $(date +%s) - start ))
  ((rc)) && break
done
start=$(date +%s); lab destroy || rc=1; took[destroy-end]=$(( $(date +%s) - start ))

echo
echo "[lab-test] scenario $scenario: $( ((rc)) && echo FAILED || echo passed)"
for step in "${steps[@]}" destroy-end; do [[ -n "${took[$step]:-}" ]] && printf '  %-12s %5s s\n' "$step" "${took[$step]}"; done
if [[ -n "${took[converge]:-}" && -n "${took[idempotence]:-}" ]]; then
  awk -v a="${took[idempotence]}" -v b="${took[converge]}" 'BEGIN {printf "  re-run with verify (molecule idempotence) / first converge = %d s / %d s = %.2f\n", a, b, a / b}'
fi
if [[ -n "${took[converge]:-}" && -n "${took[rerun]:-}" ]]; then
  awk -v a="${took[rerun]}" -v b="${took[converge]}" 'BEGIN {printf "  re-run without verify (site.yml --skip-tags verify) / first converge = %d s / %d s = %.2f\n", a, b, a / b}'
fi
echo "  peak memory used on this machine: $(cat "$peak_file" 2>/dev/null || echo 0) MiB"
if [[ -n "$failed_step" ]]; then
  echo "[lab-test] $failed_step FAILED; the end of its output ($results/step-$failed_step.log):"
  grep -v '^\s*$' "$results/step-$failed_step.log" | tail -15 | cut -c1-300 | sed 's/^/  | /'
fi
exit $rc
