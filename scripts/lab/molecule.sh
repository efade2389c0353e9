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
  # The second model pool's own weights (molecule/default/pools.yml): the same tokenizer, another random init (5 s).
  # Seed 2: seed 1's greedy tokens are bytes of unfinished UTF-8 characters, which vLLM returns as empty text.
  python3 "$here/make-tiny-model.py" --out "$PD_LAB_CACHE/tiny-b" --seed 2 >/dev/null
fi

cd "$repo"
# The scenario (-s NAME, default "default") and its hosts, from its inventory: the one place that
# names the lab's containers and groups (tests/unit/test_lab_inventory.py ties it to molecule.yml).
scenario=default
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  [[ "${args[i]}" == -s || "${args[i]}" == --scenario-name ]] && scenario=${args[i + 1]:-default}
done
lab_hosts() { ansible -i "$repo/molecule/$scenario/inventory" "$1" --list-hosts 2>/dev/null | awk 'NR > 1 {print $1}'; }
docker_cmd=${DOCKER:-docker}

# Teardown on a busy machine: molecule's destroy waits about 72 s for docker to remove a container;
# vLLM containers that are still stopping their units stayed "Removal In Progress" past that once,
# and destroy exited 2. So: stop the containers first (systemd stops the units in order, up to
# 90 s), and after molecule, remove what is left and wait until docker has really let go.
if [[ "${1:-}" == destroy && "$scenario" == default ]]; then
  mapfile -t hosts < <(lab_hosts all)
  running=()
  for c in "${hosts[@]}"; do "$docker_cmd" inspect "$c" >/dev/null 2>&1 && running+=("$c"); done
  # set -e: a docker command that fails here (a container already being removed) must not end the teardown
  # before its wait below (stop 50's CI: destroy exited 2 with no message).
  if ((${#running[@]})); then "$docker_cmd" stop -t 90 "${running[@]}" >/dev/null 2>&1 || true; fi
  rc=0
  molecule "$@" || rc=$?
  for _ in $(seq 1 60); do
    left=()
    for c in "${hosts[@]}"; do "$docker_cmd" inspect "$c" >/dev/null 2>&1 && left+=("$c"); done
    ((${#left[@]} == 0)) && break
    "$docker_cmd" rm -f "${left[@]}" >/dev/null 2>&1 || true
    sleep 5
  done
  if ((${#left[@]})); then echo "lab destroy: containers still present after 300 s: ${left[*]}" >&2; exit 1; fi
  ((rc)) && { echo "lab destroy: molecule exited $rc; every lab container is gone, resetting its state" >&2
              molecule reset -s "$scenario" >/dev/null 2>&1 || true; }
  exit 0
fi

exec molecule "$@"
