#!/usr/bin/env bash
# Lab test of playbooks/status.yml against the running docker lab (make lab):
#   1. status exits 0 and prints a GREEN table (units, health, transfer matrix);
#   2. one unit stopped (default: the last decode instance of the lab inventory): status exits non-zero
#      and that unit's row is RED;
#      In the same red run (one run for every fault: each status run costs 1-2 min on the lab) the front door and
#      the monitoring host go red, each line naming its fault: vllm-router stopped on the last router (its row, and
#      each entry host's routers: that router DOWN in HAProxy), keepalived stopped on the entry host without the VIP
#      and the VIP added there by hand (the VIP on two hosts; that host's keepalived stopped), every entry
#      certificate under -e entry_tls_warn_days (more days than the lab's certificates have), Alertmanager stopped
#      and Prometheus' target of the stopped unit down (the monitoring line). Nothing else is red.
#   3. everything started again (the VIP removed by hand first), the unit serving (/v1/models) again, the router
#      ready, Alertmanager healthy, every Prometheus target up; status green again.
# Everything is restored on any exit. Usage: scripts/lab/status-test.sh [HOST UNIT PORT]
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

# The front door and the monitoring host (group_vars/entry: the VIP and its interface; the lab's addresses).
read -r VIP VIP_DEV ROUTER ROUTER_URL MON PROM AM <<<"$("$VENV/bin/python" - <<'PY'
import sys
sys.path.insert(0, "scripts/lab")
from labinv import Lab
lab = Lab()
g, router, mon = lab.group_vars("entry"), lab.groups["vllm_router"][-1], lab.groups["monitoring"][0]
print(g["entry_vip"], g["entry_vip_interface"], router, "http://%s:%s" % (lab.ips[router], lab.var("vllm_router_port")),
      mon, "http://%s:%s" % (lab.ips[mon], lab.var("monitoring_prometheus_port")),
      "http://%s:%s" % (lab.ips[mon], lab.var("monitoring_alertmanager_port")))
PY
)"
mapfile -t ENTRIES < <("$VENV/bin/python" scripts/lab/labinv.py hosts entry)
holds_vip() { docker exec "$1" ip -o -4 addr show | grep -q "inet $VIP/"; }
# Prometheus' active targets as "health job/instance" lines, read on the monitoring host (its port admits it).
targets() { docker exec "$MON" curl -sf -m 10 "$PROM/api/v1/targets?state=active" \
              | jq -r '.data.activeTargets[] | "\(.health) \(.labels.job)/\(.labels.instance)"'; }
all_up() { local t; t=$(targets) && [[ -n "$t" ]] && ! grep -qv '^up ' <<<"$t"; }
wait_until() {  # wait_until SECONDS WHAT COMMAND...: poll every 2 s
  local limit=$1 what=$2; shift 2
  local deadline=$((SECONDS + limit))
  until "$@"; do
    (( SECONDS < deadline )) || fail "$what: not within $limit s"
    sleep 2
  done
}

VIP_ADDED=""  # the entry host the test put the VIP on by hand
restore() {
  docker exec "$HOST" systemctl start "$UNIT" >/dev/null 2>&1 || true
  docker exec "$ROUTER" systemctl start vllm-router >/dev/null 2>&1 || true
  if [[ -n "$VIP_ADDED" ]]; then
    docker exec "$VIP_ADDED" ip addr del "$VIP/32" dev "$VIP_DEV" >/dev/null 2>&1 || true
    VIP_ADDED=""
  fi
  for e in "${ENTRIES[@]}"; do docker exec "$e" systemctl start keepalived >/dev/null 2>&1 || true; done
  docker exec "$MON" systemctl start prometheus-alertmanager >/dev/null 2>&1 || true
}
trap restore EXIT

say "1. green: status with the transfer matrix"
# A step before may have restarted a unit: Prometheus' targets settle first (the green run judges them).
wait_until 90 "every Prometheus target up before the green run" all_up
status green
[[ $RC -eq 0 ]] || fail "status exited $RC on the lab before any change"
grep -q 'CLUSTER .*: GREEN' "$LOG/green.table" || fail "no GREEN table"
grep -Eq 'GB/s / link' "$LOG/green.table" || fail "no transfer matrix in the table"

reason() { grep -Eq "^ *- $1\$" "$LOG/red.table"; }  # a line of the table's RED: list (an ERE)
HOLDER="" SPARE=""
for e in "${ENTRIES[@]}"; do if holds_vip "$e"; then HOLDER=$e; else SPARE=$e; fi; done
[[ -n "$HOLDER" && -n "$SPARE" ]] || fail "want one entry host with the VIP $VIP and one without"
# Lab certificates have at most entry_tls_cert_lifetime_days (365) left: every entry host's TLS cell goes red.
WARN_DAYS=36500
say "2. stop $UNIT on $HOST, vllm-router on $ROUTER, keepalived on $SPARE (+ the VIP by hand there: on two hosts),"
say "   prometheus-alertmanager on $MON; TLS threshold $WARN_DAYS days"
docker exec "$HOST" systemctl stop "$UNIT"
docker exec "$ROUTER" systemctl stop vllm-router
docker exec "$SPARE" systemctl stop keepalived
VIP_ADDED=$SPARE
docker exec "$SPARE" ip addr add "$VIP/32" dev "$VIP_DEV"
docker exec "$MON" systemctl stop prometheus-alertmanager
wait_until 90 "Prometheus sees $HOST/${UNIT#vllm@} down" eval "targets | grep -qx 'down vllm/$HOST/${UNIT#vllm@}'"
status red -e status_transfer_check=false -e entry_tls_warn_days=$WARN_DAYS
[[ $RC -ne 0 ]] || fail "status exited 0 with $UNIT stopped"
grep -Eq "^ *RED +$HOST +$UNIT +(stopped|absent)" "$LOG/red.table" || fail "the $HOST $UNIT row is not RED"
grep -Eq "^ *RED +$ROUTER +vllm-router +(stopped|absent)" "$LOG/red.table" || fail "the $ROUTER vllm-router row is not RED"
grep -Eq "^ *RED VIP $VIP: on ($HOLDER, $SPARE|$SPARE, $HOLDER)\$" "$LOG/red.table" || fail "the VIP line does not say two hosts"
for e in "$HOLDER" "$SPARE"; do
  grep -Eq "^ *RED +$e +running +" "$LOG/red.table" || fail "the entry $e line is not RED"
  reason "$e: HAProxy server vllm_routers/$ROUTER is DOWN" || fail "$e: $ROUTER not DOWN in HAProxy"
  reason "$e: TLS certificate expires in [0-9]+ days, under entry_tls_warn_days \($WARN_DAYS\)" \
    || fail "$e: the TLS threshold is not red"
done
grep -Eq "^ *RED +$SPARE +running +stopped +held " "$LOG/red.table" || fail "$SPARE: keepalived stopped with the VIP not shown"
reason "$SPARE: keepalived is stopped" || fail "$SPARE: keepalived stopped not named"
grep -Eq "^ *RED +$MON +running +[0-9]+/[0-9]+ up; down: .* stopped\$" "$LOG/red.table" || fail "the monitoring line is not RED"
reason "$MON: Prometheus targets [0-9]+/[0-9]+ up; down: .*vllm/$HOST/${UNIT#vllm@}.*" \
  || fail "the down Prometheus target is not named"
reason "$MON: prometheus-alertmanager is stopped" || fail "Alertmanager stopped is not named"
# Nothing else: the two unit rows, the VIP line, the two entry lines, the monitoring line.
[[ $(grep -Ec '^ *RED ' "$LOG/red.table") -eq 6 ]] || fail "other rows are red too (another drill running?)"
grep -q "CLUSTER .*: RED" "$LOG/red.table" || fail "the table's headline is not RED"

say "3. start everything again (the VIP off $SPARE first) and wait until $UNIT serves"
restore
deadline=$((SECONDS + 600))
until serving; do
  (( SECONDS < deadline )) || fail "$UNIT on $HOST does not serve /v1/models 600 s after the start"
  sleep 5
done
say "$UNIT on $HOST serves /v1/models again"
holds_vip "$SPARE" && fail "the VIP is still on $SPARE"
wait_until 60 "vllm-router on $ROUTER ready" docker exec "$ROUTER" curl -sf -m 5 -o /dev/null "$ROUTER_URL/readiness"
wait_until 60 "Alertmanager healthy" docker exec "$MON" curl -sf -m 5 -o /dev/null "$AM/-/healthy"
wait_until 120 "every Prometheus target up" all_up
status again -e status_transfer_check=false
[[ $RC -eq 0 ]] || fail "status exited $RC after $UNIT came back"
say "PASS"
