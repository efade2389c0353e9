#!/usr/bin/env bash
# Lab helper: build the systemd Debian 12 base image for the molecule docker lab,
# without any container registry: mmdebstrap | docker import.
# Builds only if the image is missing or was built from another package list
# (label pd-lab.packages-sha256); PD_LAB_REBUILD=1 forces a rebuild.
# Lab only. Needs root, mmdebstrap (installed from apt if missing) and a running docker
# (see ensure-docker.sh).
set -euo pipefail

IMAGE=${PD_LAB_IMAGE:-local/pd-lab-debian12:latest}
SUITE=${PD_LAB_SUITE:-bookworm}
MIRROR=${PD_LAB_MIRROR:-http://deb.debian.org/debian}
DOCKER=${DOCKER:-docker}
log() { echo "[build-image] $*" >&2; }

# Everything the roles need, so that converge never has to reach a mirror.
PACKAGES=(
  # init + ansible needs
  systemd systemd-sysv dbus sudo acl python3 python3-apt python3-venv python3-packaging
  # diagnostics and tools used by roles/checks
  iproute2 procps curl ca-certificates jq iputils-ping netcat-openbsd less kmod nftables
  # runtime libraries: mooncake (libibverbs, libnuma, libcurl), vLLM CPU (gomp, tcmalloc)
  libibverbs1 ibverbs-providers libnuma1 numactl libcurl4 libgomp1 libtcmalloc-minimal4
  # etcd from Debian (lab: etcd_install_method=package); its unit is disabled below, the role
  # writes and enables its own /etc/systemd/system/etcd.service
  etcd-server etcd-client openssl
  # the entry (roles/entry): HAProxy and keepalived from Debian; their units stay as Debian ships them
  haproxy keepalived
  # roles/monitoring: Prometheus, Alertmanager and the node exporter from Debian (units disabled below)
  prometheus prometheus-alertmanager prometheus-node-exporter
)
# Bump when the hooks below change, so existing images get rebuilt.
IMAGE_RECIPE=4
pkg_list=$(IFS=,; echo "${PACKAGES[*]}")
sha=$(printf '%s|%s|%s|%s\n' "$SUITE" "$MIRROR" "$pkg_list" "$IMAGE_RECIPE" | sha256sum | cut -c1-16)

if [[ "${PD_LAB_REBUILD:-0}" != 1 ]] && \
   have=$("$DOCKER" image inspect -f '{{ index .Config.Labels "pd-lab.packages-sha256" }}' "$IMAGE" 2>/dev/null); then
  if [[ "$have" == "$sha" ]]; then
    log "$IMAGE is up to date ($sha)"; exit 0
  fi
  log "$IMAGE was built from another package list ($have != $sha): rebuilding"
fi

if ! command -v mmdebstrap >/dev/null 2>&1; then
  log "installing mmdebstrap from apt"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mmdebstrap >&2
fi

log "building $IMAGE from $SUITE ($MIRROR): $pkg_list"
start=$(date +%s)
# Customize hooks (run on the finished tree, outside of it):
#  - no getty / udev-triggered units inside containers,
#  - an empty machine-id so each container gets its own,
#  - etcd, haproxy, keepalived and the prometheus units of the Debian packages disabled (they would start
#    with Debian's default configs in every container; the roles enable them where they run),
#  - apt sources with updates and security, over http (the lab's proxy CA is not trusted in the image).
mmdebstrap --variant=minbase --mode=root --format=tar \
  --include="$pkg_list" \
  --customize-hook='chroot "$1" systemctl mask getty@tty1.service console-getty.service systemd-firstboot.service >/dev/null 2>&1 || true' \
  --customize-hook='chroot "$1" systemctl disable etcd.service haproxy.service keepalived.service prometheus.service prometheus-alertmanager.service prometheus-node-exporter.service >/dev/null 2>&1 || true' \
  --customize-hook="printf 'deb %s %s main\ndeb %s %s-updates main\ndeb %s-security %s-security main\n' '$MIRROR' '$SUITE' '$MIRROR' '$SUITE' '$MIRROR' '$SUITE' > \"\$1\"/etc/apt/sources.list" \
  --customize-hook='rm -f "$1"/etc/machine-id "$1"/var/lib/dbus/machine-id; : > "$1"/etc/machine-id' \
  --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin' \
  "$SUITE" - "$MIRROR" \
| "$DOCKER" import \
    -c 'CMD ["/sbin/init"]' \
    -c 'ENV container=docker' \
    -c "LABEL pd-lab.packages-sha256=$sha" \
    - "$IMAGE" >&2
log "built $IMAGE in $(( $(date +%s) - start )) s; size: $("$DOCKER" image inspect -f '{{.Size}}' "$IMAGE") bytes"
