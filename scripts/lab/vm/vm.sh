#!/usr/bin/env bash
# LAB ONLY: host side of the QEMU/Soft-RoCE lab (molecule/rdma create.yml/destroy.yml use it).
#
#   vm.sh net-up                 bridge pdrdma0 10.77.0.1/24 + iptables FORWARD accept for it
#   vm.sh net-down               remove the bridge and those FORWARD rules
#   vm.sh boot NAME MAC [VCPUS] [MEM_MIB]
#                                tap pdr-NAME on the bridge, fresh qcow2 overlay on the read-only
#                                base image, qemu-system-x86_64 -accel tcg daemonized (pidfile)
#   vm.sh stop NAME              kill the VM (pidfile), remove its tap and overlay
#   vm.sh wheelhouse-up          serve the wheelhouse on http://10.77.0.1:8765/ (background, pidfile)
#   vm.sh wheelhouse-down        stop it
#   vm.sh status                 what runs
# Each command is idempotent and prints "changed" on its last line when it changed something.
# State: $PD_LAB_VM_DIR/run/<name>.{qcow2,pid,console.log}. Image: build-vm-image.sh.
# Only its own bridge, taps, processes and rules are touched (never docker's).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
CACHE=${PD_LAB_CACHE:-$HOME/.cache/pd-lab}
OUT=${PD_LAB_VM_DIR:-$CACHE/vm}
RUN=$OUT/run
BR=${PD_LAB_VM_BRIDGE:-pdrdma0}
BR_CIDR=${PD_LAB_VM_BRIDGE_CIDR:-10.77.0.1/24}
BR_IP=${BR_CIDR%/*}
WH_PORT=${PD_LAB_WHEELHOUSE_PORT:-8765}
VM_CPU=${PD_LAB_VM_CPU:-max}   # qemu -cpu model (FACTS: -cpu max boots the image under TCG)
log() { echo "[vm] $*" >&2; }
changed=0

alive() { [[ -s "$1" ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

# Stop the process of a pidfile only if it is still the expected program (no stale-pid kills).
stop_pidfile() {
  local pidfile=$1 expect=$2 pid
  [[ -s "$pidfile" ]] || return 0
  pid=$(cat "$pidfile")
  if kill -0 "$pid" 2>/dev/null && grep -qa "$expect" "/proc/$pid/cmdline" 2>/dev/null; then
    kill "$pid"
    for _ in $(seq 1 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
    changed=1
  fi
  rm -f "$pidfile"
}

fwd_rule() {  # add|del  -i|-o
  local op=$1 dir=$2
  if [[ $op == add ]]; then
    iptables -C FORWARD "$dir" "$BR" -j ACCEPT 2>/dev/null || { iptables -I FORWARD "$dir" "$BR" -j ACCEPT; changed=1; }
  else
    while iptables -C FORWARD "$dir" "$BR" -j ACCEPT 2>/dev/null; do iptables -D FORWARD "$dir" "$BR" -j ACCEPT; changed=1; done
  fi
}

cmd=${1:-status}; shift || true
mkdir -p "$RUN"
case "$cmd" in
  net-up)
    if ! ip link show "$BR" >/dev/null 2>&1; then
      ip link add "$BR" type bridge; changed=1
    fi
    if ! ip -4 addr show dev "$BR" | grep -q "inet $BR_CIDR"; then
      ip addr add "$BR_CIDR" dev "$BR"; changed=1
    fi
    ip link set "$BR" up
    # docker sets the FORWARD policy to DROP, and with br_netfilter loaded bridged VM<->VM
    # frames go through FORWARD too: accept the lab bridge (FACTS "VMs (for RDMA)").
    if command -v iptables >/dev/null 2>&1; then fwd_rule add -i; fwd_rule add -o; fi
    ;;
  net-down)
    if command -v iptables >/dev/null 2>&1; then fwd_rule del -i; fwd_rule del -o; fi
    if ip link show "$BR" >/dev/null 2>&1; then ip link del "$BR"; changed=1; fi
    ;;
  boot)
    name=${1:?name}; mac=${2:?mac}; vcpus=${3:-2}; mem=${4:-2048}
    tap="pdr-$name"; pidfile="$RUN/$name.pid"; overlay="$RUN/$name.qcow2"
    eval "$("$here/build-vm-image.sh" | grep -E '^(BASE|KERNEL|INITRD)=')"
    if alive "$pidfile"; then
      log "$name already runs (pid $(cat "$pidfile"))"
    else
      if ! ip link show "$tap" >/dev/null 2>&1; then
        ip tuntap add dev "$tap" mode tap
      fi
      ip link set "$tap" master "$BR" up
      # A fresh overlay per boot: the base stays read-only and every run starts clean.
      rm -f "$overlay"
      qemu-img create -q -f qcow2 -F qcow2 -b "$BASE" "$overlay"
      : > "$RUN/$name.console.log"
      qemu-system-x86_64 -name "pdrdma-$name" \
        -accel tcg,thread=multi -cpu "$VM_CPU" -smp "$vcpus" -m "$mem" \
        -kernel "$KERNEL" -initrd "$INITRD" \
        -append "root=/dev/vda rw console=ttyS0 net.ifnames=0 systemd.hostname=$name mitigations=off" \
        -drive "file=$overlay,if=virtio,format=qcow2,cache=unsafe" \
        -netdev "tap,id=n0,ifname=$tap,script=no,downscript=no" \
        -device "virtio-net-pci,netdev=n0,mac=$mac" \
        -device virtio-rng-pci \
        -display none -serial "file:$RUN/$name.console.log" -monitor none \
        -no-reboot -daemonize -pidfile "$pidfile"
      log "$name booting (pid $(cat "$pidfile"), console $RUN/$name.console.log)"
      changed=1
    fi
    ;;
  stop)
    name=${1:?name}
    stop_pidfile "$RUN/$name.pid" qemu-system
    if ip link show "pdr-$name" >/dev/null 2>&1; then ip link del "pdr-$name"; changed=1; fi
    if [[ -e "$RUN/$name.qcow2" ]]; then rm -f "$RUN/$name.qcow2"; changed=1; fi
    ;;
  wheelhouse-up)
    pidfile="$RUN/wheelhouse.pid"
    if alive "$pidfile"; then
      log "wheelhouse server already runs (pid $(cat "$pidfile"))"
    else
      PD_LAB_WHEELHOUSE_ADDR=$BR_IP PD_LAB_WHEELHOUSE_PORT=$WH_PORT \
        nohup "$here/../serve-wheelhouse.sh" >"$RUN/wheelhouse.log" 2>&1 </dev/null &
      echo $! > "$pidfile"
      for _ in $(seq 1 40); do
        (exec 3<>"/dev/tcp/$BR_IP/$WH_PORT") 2>/dev/null && break
        alive "$pidfile" || { cat "$RUN/wheelhouse.log" >&2; exit 1; }
        sleep 0.25
      done
      log "wheelhouse on http://$BR_IP:$WH_PORT/ (pid $(cat "$pidfile"))"
      changed=1
    fi
    ;;
  wheelhouse-down)
    stop_pidfile "$RUN/wheelhouse.pid" http.server
    ;;
  status)
    ip -br addr show dev "$BR" 2>/dev/null || echo "no bridge $BR"
    for p in "$RUN"/*.pid; do
      [[ -e "$p" ]] || continue
      if alive "$p"; then echo "$(basename "$p" .pid): pid $(cat "$p")"; else echo "$(basename "$p" .pid): dead"; fi
    done
    ;;
  *) log "unknown command $cmd"; exit 2 ;;
esac
[[ $changed == 1 ]] && echo changed || echo ok
