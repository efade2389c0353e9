#!/usr/bin/env bash
# Lab helper: make sure a Docker engine runs on this (systemd-less) lab machine.
#  - installs docker.io (20.10) from Debian apt if no dockerd exists,
#  - starts dockerd in the background if none runs (log: /var/log/dockerd-lab.log),
#  - waits until `docker info` works,
#  - makes sure the FORWARD chain accepts traffic of docker bridges (lab only),
#  - prints the docker CLI path to use (last line of stdout, also in $PD_LAB_DOCKER_ENV).
# Idempotent: safe to run again and again. Lab only, never used on production hosts.
set -euo pipefail

LOG=${PD_LAB_DOCKERD_LOG:-/var/log/dockerd-lab.log}
log() { echo "[ensure-docker] $*" >&2; }

if [[ $(id -u) -ne 0 ]]; then
  log "must run as root"; exit 1
fi

export DEBIAN_FRONTEND=noninteractive
apt_updated=0
apt_install() {
  if [[ $apt_updated -eq 0 ]]; then apt-get update -qq; apt_updated=1; fi
  apt-get install -y -qq --no-install-recommends "$@" >&2
}

if ! command -v dockerd >/dev/null 2>&1; then
  log "no dockerd: installing docker.io from apt"
  # docker.io's postinst tries to start the service; there is no init system here,
  # policy-rc.d (if any) stops that, failure to start is not an error for us.
  apt_install docker.io iptables
fi
command -v iptables >/dev/null 2>&1 || apt_install iptables

# Pick a client that can talk to the daemon. /usr/local/bin/docker (28.x) is preferred
# when it negotiates with the 20.10 daemon, else the apt client /usr/bin/docker.
pick_client() {
  local c
  for c in "$(command -v docker || true)" /usr/bin/docker; do
    [[ -n "$c" && -x "$c" ]] || continue
    if "$c" version --format '{{.Server.Version}}' >/dev/null 2>&1; then
      echo "$c"; return 0
    fi
  done
  return 1
}

if ! pgrep -x dockerd >/dev/null 2>&1; then
  log "starting dockerd (log: $LOG)"
  # A pid file left by a machine that stopped without stopping dockerd makes the new one refuse to start
  # ("pid file found") when its pid now belongs to another process; no dockerd runs, so it is stale.
  rm -f /var/run/docker.pid
  # containerd is started by dockerd itself when not running.
  nohup dockerd >>"$LOG" 2>&1 </dev/null &
  disown || true
fi

# Wait for the daemon socket to answer, then choose the client.
for _ in $(seq 1 60); do
  if pick_client >/dev/null; then sleep 1; break; fi
  sleep 1
done
client=$(pick_client || true)
if [[ -z "$client" ]]; then
  log "docker daemon did not answer within 60 s; tail of $LOG:"; tail -n 30 "$LOG" >&2 || true
  exit 1
fi
"$client" info >/dev/null

# Docker's own iptables rules normally cover its bridges; make sure a DROP policy
# on FORWARD (set e.g. by other lab tooling) does not cut containers off. Lab only.
if command -v iptables >/dev/null 2>&1; then
  if ! iptables -C FORWARD -i br-+ -j ACCEPT 2>/dev/null; then
    iptables -I FORWARD -i br-+ -j ACCEPT || true
  fi
  if ! iptables -C FORWARD -o br-+ -j ACCEPT 2>/dev/null; then
    iptables -I FORWARD -o br-+ -j ACCEPT || true
  fi
fi

log "docker client: $client; server: $("$client" version --format '{{.Server.Version}}')"
echo "$client"
