#!/usr/bin/env bash
# Lab helper: serve the wheelhouse over plain HTTP on one address (default: the lab docker
# network's gateway), for hosts that cannot bind-mount it (VMs, remote lab hosts).
# pip then uses:  --no-index --find-links http://ADDR:PORT/ --trusted-host ADDR
# Runs in the foreground; stop it with Ctrl-C (or kill its pid). Lab only: no TLS, no auth.
set -euo pipefail
CACHE=${PD_LAB_CACHE:-$HOME/.cache/pd-lab}
WH=${PD_LAB_WHEELHOUSE:-$CACHE/wheelhouse}
ADDR=${PD_LAB_WHEELHOUSE_ADDR:-172.30.0.1}
PORT=${PD_LAB_WHEELHOUSE_PORT:-8765}
exec python3 -m http.server --bind "$ADDR" --directory "$WH" "$PORT"
