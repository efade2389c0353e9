#!/usr/bin/env bash
# Lab entry point: prepare the docker lab's caches, then run molecule with the given args.
#   scripts/lab/molecule.sh test            # full sequence
#   scripts/lab/molecule.sh create|converge|verify|destroy|login -h prefill1
# Env: PD_LAB_CACHE (default ~/.cache/pd-lab), PD_LAB_IMAGE, PD_LAB_VENV (venv with molecule,
# default .venv of the repo), PD_LAB_SKIP_PREPARE=1 to skip the cache steps.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
export PD_LAB_CACHE=${PD_LAB_CACHE:-$HOME/.cache/pd-lab}
export PD_LAB_IMAGE=${PD_LAB_IMAGE:-local/pd-lab-debian12:latest}

venv=${PD_LAB_VENV:-}
if [[ -z "$venv" ]]; then
  [[ -x "$repo/.venv/bin/molecule" ]] && venv=$repo/.venv
fi
[[ -n "$venv" && -x "$venv/bin/molecule" ]] || { echo "no venv with molecule (set PD_LAB_VENV)" >&2; exit 1; }
# molecule looks up ansible-config etc. on PATH.
export PATH="$venv/bin:$PATH"

if [[ "${PD_LAB_SKIP_PREPARE:-0}" != 1 ]]; then
  DOCKER=$("$here/ensure-docker.sh" | tail -n1); export DOCKER
  "$here/build-image.sh"
  "$here/build-wheelhouse.sh" >/dev/null
  python3 "$here/make-tiny-model.py" >/dev/null
fi

cd "$repo"
molecule "$@" || exit $?
# In production etcd and the masters run on hosts of their own. In the 2-core docker lab they share
# the cores with three vLLM containers, whose model loads and engine steps starved etcd for 20 s
# (leader elections, the masters' leases lost, a failover that did not happen within 30 s). The
# vLLM containers get a quarter of the default CPU weight; they still use every idle cycle.
if [[ "${1:-}" == create ]]; then
  for c in prefill1 decode1 decode2; do
    if "${DOCKER:-docker}" inspect "$c" >/dev/null 2>&1; then "${DOCKER:-docker}" update --cpu-shares 256 "$c" >/dev/null; fi
  done
fi
