#!/usr/bin/env bash
# Lab test of playbooks/status.yml against the running docker lab (make lab):
#   1. status exits 0 and prints a GREEN table (units, health, transfer matrix);
#   2. one unit stopped (default: the last decode instance of the lab inventory): status exits non-zero
#      and that unit's row is RED;
#   3. the unit started again and serving (/v1/models) again; status green again.
# The unit is started again on any exit. Usage: scripts/lab/status-test.sh [HOST UNIT PORT]
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV=${PD_LAB_VENV:-$PWD/.venv}
last_decode=$("$VENV/bin/python" scripts/lab/labinv.py instances vllm_decode | tail -n1)  # host:instance:port
IFS=: read -r d_host d_name d_port <<<"$last_decode"
HOST=${1:-$d_host}
UNIT=${2:-vllm@$d_name}
PORT=${3:-$d_port}
INV=${PD_LAB_INVENTORY:-molecule/default/inventory}
# Plain tables to grep, also under molecule (which forces colour).
export ANSIBLE_CONFIG=$PWD/ansible.cfg ANSIBLE_NOCOLOR=1 ANSIBLE_FORCE_COLOR=0
# LAB ONLY: the lab inventory's vault (router API key) is encrypted with this password file.
if [[ -f molecule/default/vault-pass-LAB-ONLY && -z "${ANSIBLE_VAULT_PASSWORD_FILE:-}" ]]; then
  export ANSIBLE_VAULT_PASSWORD_FILE=$PWD/molecule/default/vault-pass-LAB-ONLY
fi
LOG=$(mktemp -d /tmp/status-test.XXXXXX)
say() { printf '[status-test] %s\n' "$*" >&2; }
fail() { say "FAIL: $*"; exit 1; }

status() {  # status NAME [ansible-playbook args...]; sets RC, prints the table
  local name=$1; shift
  set +e
  "$VENV/bin/ansible-playbook" -i "$INV" playbooks/status.yml "$@" >"$LOG/$name.log" 2>&1
  RC=$?
  set -e
  sed -n '/TASK \[Status | Cluster table\]/,/TASK \[Status | Nothing is red\]/p' "$LOG/$name.log" \
    | sed -e '1,3d' -e '$d' >"$LOG/$name.table"
  cat "$LOG/$name.table" >&2
  say "$name: rc=$RC (log $LOG/$name.log)"
}

# /v1/models with the key the instance demands (VLLM_API_KEY of the vllm role's key file, read on the host;
# curl takes the header from stdin, so the key is on no command line). No key file there: no header. The
# address is the one the instance binds (SERVE_BIND_HOST of its env file: its cluster address, not loopback).
KEY_FILE=$("$VENV/bin/python" scripts/lab/labinv.py role-var vllm _vllm_api_key_file)
serving() {
  docker exec "$HOST" sh -c 'k=$(sed -n "s/^VLLM_API_KEY=//p" "$2" 2>/dev/null)
    ip=$(sed -n "s/^SERVE_BIND_HOST=//p" "/etc/vllm/$3.env")
    url=http://${ip:-127.0.0.1}:$1/v1/models
    if [ -n "$k" ]; then printf "Authorization: Bearer %s\n" "$k" | curl -sf -m 10 -H @- "$url"; else curl -sf -m 10 "$url"; fi' \
    _ "$PORT" "$KEY_FILE" "${UNIT#vllm@}" >/dev/null 2>&1
}

restore() {
  docker exec "$HOST" systemctl start "$UNIT" >/dev/null 2>&1 || true
}
trap restore EXIT

say "1. green: status with the transfer matrix"
status green
[[ $RC -eq 0 ]] || fail "status exited $RC on the lab before any change"
grep -q 'CLUSTER .*: GREEN' "$LOG/green.table" || fail "no GREEN table"
grep -Eq 'GB/s / link' "$LOG/green.table" || fail "no transfer matrix in the table"

say "2. stop $UNIT on $HOST"
docker exec "$HOST" systemctl stop "$UNIT"
status red -e status_transfer_check=false
[[ $RC -ne 0 ]] || fail "status exited 0 with $UNIT stopped"
grep -Eq "^ *RED +$HOST +$UNIT +(stopped|absent)" "$LOG/red.table" || fail "the $HOST $UNIT row is not RED"
[[ $(grep -Ec '^ *RED ' "$LOG/red.table") -eq 1 ]] || fail "other rows are red too (another drill running?)"
grep -q "CLUSTER .*: RED" "$LOG/red.table" || fail "the table's headline is not RED"

say "3. start $UNIT again and wait until it serves"
docker exec "$HOST" systemctl start "$UNIT"
deadline=$((SECONDS + 600))
until serving; do
  (( SECONDS < deadline )) || fail "$UNIT on $HOST does not serve /v1/models 600 s after the start"
  sleep 5
done
say "$UNIT on $HOST serves /v1/models again"
status again -e status_transfer_check=false
[[ $RC -eq 0 ]] || fail "status exited $RC after $UNIT came back"
say "PASS"
