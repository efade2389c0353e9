#!/usr/bin/env bash
# Fill every cache the labs need, so the lab steps themselves never download:
#   the docker engine, the lab image, the wheelhouse, the tiny model (molecule.sh's prepare), and the
#   RDMA lab's VM image (vm/build-vm-image.sh). Each part is a no-op when its cache is current.
# `make test` runs this in the background while the static tier runs.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
start=$(date +%s)
PD_LAB_SKIP_PREPARE=0 "$here/molecule.sh" --version >/dev/null
echo "[lab-caches] docker, image, wheelhouse, model: $(( $(date +%s) - start )) s"
t=$(date +%s)
"$here/vm/build-vm-image.sh" >/dev/null
echo "[lab-caches] RDMA VM image: $(( $(date +%s) - t )) s"
