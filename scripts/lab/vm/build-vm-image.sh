#!/usr/bin/env bash
# LAB ONLY: build the Debian 12 VM image for the QEMU/Soft-RoCE lab (molecule/rdma).
#
#   scripts/lab/vm/build-vm-image.sh      # builds only when the recipe changed; prints the paths
#
# Output in ${PD_LAB_VM_DIR:-${PD_LAB_CACHE:-~/.cache/pd-lab}/vm}:
#   base.qcow2         root filesystem (ext4 on the whole disk, /dev/vda), read-only (0444);
#                      VMs boot from qcow2 overlays on top of it, never from it directly
#   vmlinuz, initrd.img kernel and initramfs of the image, for qemu -kernel/-initrd (no bootloader)
#   id_ed25519(.pub)   SSH key for root, generated once; its public half is baked into the image
#   base.label         content label: hash of suite, mirror, packages, recipe version and the key
#   build.log          mmdebstrap's log of the last build
# The last lines of stdout are KEY=VALUE pairs (BASE, KERNEL, INITRD, KEY, LABEL) for scripts.
#
# Network (systemd-networkd, static per MAC, no DHCP, no gateway): the VM whose NIC has MAC
# 52:54:00:77:00:1N gets 10.77.0.1N/24 for N=1..4 (vm1 = .11 ... vm4 = .14). The host bridge
# holds 10.77.0.1. net.ifnames=0 on the kernel command line keeps the NIC name eth0.
# The hostname comes from the kernel command line (systemd.hostname=vmN).
#
# PD_LAB_REBUILD=1 forces a rebuild. Needs root, mmdebstrap, mke2fs >= 1.43 (-d), qemu-img.
set -euo pipefail

CACHE=${PD_LAB_CACHE:-$HOME/.cache/pd-lab}
OUT=${PD_LAB_VM_DIR:-$CACHE/vm}
SUITE=${PD_LAB_SUITE:-bookworm}
MIRROR=${PD_LAB_MIRROR:-http://deb.debian.org/debian}
DISK_SIZE=${PD_LAB_VM_DISK_SIZE:-6G}
log() { echo "[build-vm-image] $*" >&2; }

# Everything the rdma and mooncake roles install, so converge never needs a mirror
# (the VMs have no route out; the wheelhouse comes from the host bridge over http).
PACKAGES=(
  # boot: kernel (+ initramfs-tools via its Depends), init, udev for module autoloading
  linux-image-amd64 initramfs-tools systemd systemd-sysv udev dbus kmod
  # access + Ansible (python3-apt for the apt module, python3-packaging for the pip module)
  openssh-server python3 python3-apt python3-venv python3-packaging acl sudo
  # RDMA userspace: what roles/rdma/vars/Debian.yml installs, + iproute2 for `rdma link`
  rdma-core ibverbs-utils ibverbs-providers libibverbs1 librdmacm1 infiniband-diags perftest iproute2
  # Mooncake wheel runtime libraries (roles/mooncake mooncake_system_packages)
  libnuma1 libcurl4
  # diagnostics
  procps iputils-ping netcat-openbsd less ca-certificates
)
# Bump when the hooks below change, so cached images are rebuilt.
RECIPE=3

[[ $(id -u) -eq 0 ]] || { log "must run as root (mmdebstrap --mode=root)"; exit 1; }
# Host tools of the RDMA lab, this image's and vm.sh's (qemu, bridge FORWARD rules), from Debian: one list.
missing=()
for t in mmdebstrap:mmdebstrap qemu-img:qemu-utils qemu-system-x86_64:qemu-system-x86 mke2fs:e2fsprogs \
         ssh-keygen:openssh-client iptables:iptables; do
  command -v "${t%%:*}" >/dev/null 2>&1 || missing+=("${t#*:}")
done
if ((${#missing[@]})); then
  log "installing host tools: ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
mkdir -p "$OUT"
chmod 0700 "$OUT"

# The SSH key lives in the cache; a new key means a new image (its hash is in the label).
if [[ ! -s "$OUT/id_ed25519" || ! -s "$OUT/id_ed25519.pub" ]]; then
  rm -f "$OUT/id_ed25519" "$OUT/id_ed25519.pub"
  ssh-keygen -q -t ed25519 -N '' -C pd-lab-vm -f "$OUT/id_ed25519"
  log "generated $OUT/id_ed25519"
fi
pubkey=$(cat "$OUT/id_ed25519.pub")

pkg_list=$(IFS=,; echo "${PACKAGES[*]}")
label=$(printf '%s|%s|%s|%s|%s|%s\n' "$SUITE" "$MIRROR" "$pkg_list" "$RECIPE" "$DISK_SIZE" "$pubkey" | sha256sum | cut -c1-16)

emit() {
  echo "BASE=$OUT/base.qcow2"
  echo "KERNEL=$OUT/vmlinuz"
  echo "INITRD=$OUT/initrd.img"
  echo "KEY=$OUT/id_ed25519"
  echo "LABEL=$label"
}

if [[ "${PD_LAB_REBUILD:-0}" != 1 && -s "$OUT/base.qcow2" && -s "$OUT/vmlinuz" && -s "$OUT/initrd.img" \
      && "$(cat "$OUT/base.label" 2>/dev/null)" == "$label" ]]; then
  log "image is up to date ($label)"
  emit
  exit 0
fi

log "building $SUITE image ($label) from $MIRROR"
start=$(date +%s)
work=$(mktemp -d "$OUT/build.XXXXXX")
trap 'rm -rf "$work"' EXIT
root="$work/root"

# Network units: one per MAC; a VM only matches its own.
net_hook=''
for n in 1 2 3 4; do
  net_hook+="printf '[Match]\nMACAddress=52:54:00:77:00:1$n\n\n[Link]\nRequiredForOnline=yes\n\n[Network]\nAddress=10.77.0.1$n/24\nLinkLocalAddressing=no\nIPv6AcceptRA=no\n' > \"\$1/etc/systemd/network/10-pdrdma-vm$n.network\"; "
done
hosts_hook="printf '127.0.0.1 localhost\n10.77.0.1 pdrdma-host\n10.77.0.11 vm1\n10.77.0.12 vm2\n10.77.0.13 vm3\n10.77.0.14 vm4\n' > \"\$1/etc/hosts\""

mmdebstrap --variant=minbase --mode=root --format=directory \
  --include="$pkg_list" \
  --customize-hook='mkdir -p "$1/etc/systemd/network" "$1/root/.ssh"' \
  --customize-hook="$net_hook" \
  --customize-hook="$hosts_hook" \
  --customize-hook="printf '%s\n' '$pubkey' > \"\$1/root/.ssh/authorized_keys\"; chmod 700 \"\$1/root/.ssh\"; chmod 600 \"\$1/root/.ssh/authorized_keys\"" \
  --customize-hook='printf "/dev/vda / ext4 rw,noatime,errors=remount-ro 0 1\n" > "$1/etc/fstab"' \
  --customize-hook='chroot "$1" systemctl enable systemd-networkd.service ssh.service >/dev/null 2>&1' \
  --customize-hook='chroot "$1" systemctl mask systemd-firstboot.service apt-daily.timer apt-daily-upgrade.timer man-db.timer e2scrub_all.timer fstrim.timer getty@tty1.service >/dev/null 2>&1 || true' \
  --customize-hook='printf "UseDNS no\n" > "$1/etc/ssh/sshd_config.d/pd-lab.conf"' \
  --customize-hook="printf 'deb %s %s main\ndeb %s %s-updates main\ndeb %s-security %s-security main\n' '$MIRROR' '$SUITE' '$MIRROR' '$SUITE' '$MIRROR' '$SUITE' > \"\$1/etc/apt/sources.list\"" \
  --customize-hook='rm -f "$1/etc/machine-id" "$1/var/lib/dbus/machine-id"; : > "$1/etc/machine-id"' \
  --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin "$1"/var/cache/apt/archives/*.deb' \
  "$SUITE" "$root" "$MIRROR" >"$work/build.log" 2>&1 || { cp "$work/build.log" "$OUT/build.log"; tail -n 40 "$OUT/build.log" >&2; log "mmdebstrap failed"; exit 1; }
cp "$work/build.log" "$OUT/build.log"

kernel=$(ls "$root"/boot/vmlinuz-* | sort -V | tail -n1)
initrd=$(ls "$root"/boot/initrd.img-* | sort -V | tail -n1)
[[ -s "$kernel" && -s "$initrd" ]] || { log "no kernel/initrd in the image"; exit 1; }
log "kernel $(basename "$kernel"), initrd $(du -h "$initrd" | cut -f1)"

# ext4 filled straight from the directory (no loop device), on the whole disk: root=/dev/vda.
truncate -s "$DISK_SIZE" "$work/root.raw"
mke2fs -q -t ext4 -L pdroot -E root_owner=0:0 -d "$root" "$work/root.raw"
qemu-img convert -q -f raw -O qcow2 "$work/root.raw" "$work/base.qcow2"

# Replace atomically; overlays of a previous base are stale now (create.yml makes new ones).
rm -f "$OUT/base.qcow2"
install -m 0644 "$kernel" "$OUT/vmlinuz"
install -m 0644 "$initrd" "$OUT/initrd.img"
mv "$work/base.qcow2" "$OUT/base.qcow2"
chmod 0444 "$OUT/base.qcow2"
echo "$label" > "$OUT/base.label"
log "built in $(( $(date +%s) - start )) s: $(du -h "$OUT/base.qcow2" | cut -f1) qcow2 (virtual $DISK_SIZE)"
emit
