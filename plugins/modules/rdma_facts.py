#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Ansible module: read RDMA devices, NVIDIA GPUs and their PCIe affinity from sysfs."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: rdma_facts
short_description: Gather RDMA devices, NVIDIA GPUs and GPU/NIC PCIe affinity from sysfs
description:
  - Reads sysfs only (no shell-outs, no libibverbs). Safe to run on hosts without RDMA, in
    containers, and on a fake sysfs tree (I(sysfs_root)) on the controller.
  - A host without C(class/infiniband) returns empty lists, never an error.
  - Sets the fact C(rdma) (C(ansible_facts.rdma)) and also returns the same data under the
    return key C(rdma).
options:
  sysfs_root:
    description:
      - Root of the sysfs tree to read. C(/sys) on a real host; a fixture tree in tests and render mode.
    type: path
    default: /sys
author:
  - vLLM PD bundle
"""

EXAMPLES = r"""
- name: Gather RDMA facts
  rdma_facts:

- name: Gather RDMA facts from a fake sysfs tree (render mode / tests)
  rdma_facts:
    sysfs_root: "{{ playbook_dir }}/../tests/fixtures/sysfs/roce_plain"
"""

RETURN = r"""
rdma:
  description: Same data as C(ansible_facts.rdma).
  returned: always
  type: dict
  contains:
    devices:
      description: >-
        RDMA devices from C(class/infiniband/*), sorted by name. Each item has C(name), C(pci)
        (PCI address or null for soft devices), C(numa_node) (int, -1 if unknown, null for soft
        devices), C(node_guid), C(fw_ver), C(hca_type), C(parent) (rxe: the netdev) and C(ports).
        Each port has C(port) (int), C(state) (C(ACTIVE), C(DOWN), C(INIT), ...), C(phys_state)
        (C(LinkUp), C(Disabled), ...), C(link_layer) (C(InfiniBand)/C(Ethernet)), C(rate_gbps)
        (float or null), C(netdev) (main netdev or null), C(netdevs) (all netdevs seen) and C(gids)
        (list of C(index), C(gid), C(type) (C(IB), C(RoCE v1), C(RoCE v2) or null), C(netdev),
        C(ipv4) (for IPv4-mapped GIDs, else null), C(link_local)); all-zero GIDs are skipped.
      type: list
      elements: dict
    gpus:
      description: >-
        NVIDIA display/3D PCI functions (vendor 0x10de, class 0x0300xx/0x0302xx) ordered by PCI
        address; C(index) is the position in that order (CUDA_DEVICE_ORDER=PCI_BUS_ID order).
        Items have C(index), C(pci), C(numa_node), C(class), C(device_id).
      type: list
      elements: dict
    affinity:
      description: >-
        One item per GPU x RDMA device: C(gpu) (index), C(gpu_pci), C(nic), C(nic_pci) and
        C(level): C(pix) (share a PCIe bridge below the root port), C(numa) (same NUMA node;
        both -1 counts as the same node) or C(sys).
      type: list
      elements: dict
    kernel_modules:
      description: Map of module name to bool, from C(module/<name>) (loaded or built in).
      type: dict
    sysfs_root:
      description: The sysfs root that was read.
      type: str
"""

import ipaddress
import os
import re

try:  # the installed collection (ansible-galaxy collection install)
    from ansible_collections.pd_bundle.serving.plugins.module_utils.sysfs import (
        index_in_pci_order, is_gpu_class, list_dir, nvidia_pci_functions, parse_int, pci_numa_node, read_text)
except ImportError:  # a clone: ansible.cfg's module_utils = ./plugins/module_utils
    from ansible.module_utils.sysfs import (  # type: ignore[no-redef]
        index_in_pci_order, is_gpu_class, list_dir, nvidia_pci_functions, parse_int, pci_numa_node, read_text)

try:
    from ansible.module_utils.basic import AnsibleModule
except ImportError:  # pure functions stay importable without ansible
    AnsibleModule = None

PCI_ADDR_RE = re.compile(r"^[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")
RATE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*Gb/sec")
WATCHED_MODULES = (
    "ib_core", "ib_uverbs", "rdma_ucm", "rdma_cm", "mlx5_core", "mlx5_ib", "rdma_rxe",
    "nvidia", "nvidia_peermem", "nv_peer_mem",
)
AFFINITY_LEVELS = ("pix", "numa", "sys")


def natural_key(text):
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", str(text))]


def parse_state(raw):
    """'4: ACTIVE' -> 'ACTIVE'; 'ACTIVE' -> 'ACTIVE'; None -> None."""
    if raw is None:
        return None
    return raw.split(":", 1)[1].strip() if ":" in raw else raw.strip()


def parse_rate(raw):
    """'200 Gb/sec (4X HDR)' -> 200.0; unparsable -> None."""
    if raw is None:
        return None
    match = RATE_RE.match(raw)
    return float(match.group(1)) if match else None


def is_zero_gid(gid):
    return gid is None or gid.replace(":", "").strip("0") == ""


def gid_ipv4(gid):
    """'0000:0000:0000:0000:0000:ffff:0a00:0005' -> '10.0.0.5'; otherwise None."""
    try:
        mapped = ipaddress.IPv6Address(gid).ipv4_mapped
    except ValueError:
        return None
    return str(mapped) if mapped is not None else None


def gid_type(raw, link_layer):
    """Kernel prints 'IB/RoCE v1' for both IB and RoCE v1 and 'RoCE v2' for v2."""
    if raw is None:
        return "IB" if link_layer == "InfiniBand" else None
    text = raw.strip()
    if "v2" in text:
        return "RoCE v2"
    if text in ("IB/RoCE v1", "IB", "RoCE v1", "RoCE"):
        return "IB" if link_layer == "InfiniBand" else "RoCE v1"
    return text


def pci_from_path(real_path):
    """The last component of a resolved sysfs path that is a PCI address, or None."""
    for part in reversed(real_path.split(os.sep)):
        if PCI_ADDR_RE.match(part):
            return part.lower()
    return None


def pci_chain(root, real_path):
    """Components of a resolved device path below <root>/devices, e.g.
    ['pci0000:15', '0000:15:01.0', '0000:16:00.0', '0000:17:00.0', '0000:18:00.0'];
    stops at the last PCI address. [] if not under <root>/devices/pci*."""
    devices_dir = os.path.realpath(os.path.join(root, "devices"))
    try:
        rel = os.path.relpath(real_path, devices_dir)
    except ValueError:
        return []
    parts = rel.split(os.sep)
    if not parts or not parts[0].startswith("pci"):
        return []
    last = max((i for i, p in enumerate(parts) if PCI_ADDR_RE.match(p)), default=-1)
    if last < 1:
        return []
    return parts[: last + 1]


def affinity_level(gpu_chain, nic_chain, gpu_numa, nic_numa):
    """pix: share a PCIe bridge below the root port; numa: same NUMA node; sys: otherwise."""
    if len(gpu_chain) >= 4 and len(nic_chain) >= 4:
        # [host bridge, root port, bridge..., endpoint]: bridges below the root port
        gpu_bridges = set(gpu_chain[2:-1])
        nic_bridges = set(nic_chain[2:-1])
        if gpu_chain[:2] == nic_chain[:2] and gpu_bridges & nic_bridges:
            return "pix"
    if gpu_numa is not None and nic_numa is not None and gpu_numa == nic_numa:
        return "numa"
    return "sys"


def _port_netdevs(dev_dir, port_dir, port_num, link_layer, parent):
    """Return (netdev, netdevs): gid_attrs ndevs first (RoCE/rxe), then rxe parent,
    then device/net/* (IPoIB or the PCI function's netdev, matched by dev_port)."""
    seen = []
    ndev_dir = os.path.join(port_dir, "gid_attrs", "ndevs")
    for idx in sorted(list_dir(ndev_dir), key=natural_key):
        name = read_text(os.path.join(ndev_dir, idx))
        if name and name not in seen:
            seen.append(name)
    if parent and parent not in seen:
        seen.append(parent)
    net_dir = os.path.join(dev_dir, "device", "net")
    pci_netdevs = []
    for name in list_dir(net_dir):
        dev_port = parse_int(read_text(os.path.join(net_dir, name, "dev_port")), 0)
        pci_netdevs.append((0 if dev_port == port_num - 1 else 1, name))
    for _, name in sorted(pci_netdevs):
        if name not in seen:
            seen.append(name)
    return (seen[0] if seen else None), seen


def collect_port(dev_dir, port_name, parent):
    port_dir = os.path.join(dev_dir, "ports", port_name)
    port_num = parse_int(port_name, 0)
    link_layer = read_text(os.path.join(port_dir, "link_layer"))
    rate_raw = read_text(os.path.join(port_dir, "rate"))
    gids = []
    gids_dir = os.path.join(port_dir, "gids")
    for idx in sorted(list_dir(gids_dir), key=natural_key):
        index = parse_int(idx)
        if index is None:
            continue
        gid = read_text(os.path.join(gids_dir, idx))
        if is_zero_gid(gid):
            continue
        gid = gid.lower()
        gids.append({
            "index": index,
            "gid": gid,
            "type": gid_type(read_text(os.path.join(port_dir, "gid_attrs", "types", idx)), link_layer),
            "netdev": read_text(os.path.join(port_dir, "gid_attrs", "ndevs", idx)),
            "ipv4": gid_ipv4(gid),
            "link_local": gid.startswith("fe80:"),
        })
    netdev, netdevs = _port_netdevs(dev_dir, port_dir, port_num, link_layer, parent)
    return {
        "port": port_num,
        "state": parse_state(read_text(os.path.join(port_dir, "state"))),
        "phys_state": parse_state(read_text(os.path.join(port_dir, "phys_state"))),
        "link_layer": link_layer,
        "rate": rate_raw,
        "rate_gbps": parse_rate(rate_raw),
        "netdev": netdev,
        "netdevs": netdevs,
        "gids": gids,
    }


def collect_devices(root):
    class_dir = os.path.join(root, "class", "infiniband")
    devices = []
    for name in sorted(list_dir(class_dir), key=natural_key):
        dev_dir = os.path.join(class_dir, name)
        dev_link = os.path.join(dev_dir, "device")
        pci = None
        numa = None
        chain = []
        if os.path.exists(dev_link):
            real = os.path.realpath(dev_link)
            pci = pci_from_path(real)
            chain = pci_chain(root, real)
            numa = pci_numa_node(dev_link) if pci else None
        parent = read_text(os.path.join(dev_dir, "parent"))
        ports = [
            collect_port(dev_dir, port, parent)
            for port in sorted(list_dir(os.path.join(dev_dir, "ports")), key=natural_key)
            if port.isdigit()
        ]
        devices.append({
            "name": name,
            "pci": pci,
            "numa_node": numa,
            "node_guid": read_text(os.path.join(dev_dir, "node_guid")),
            "fw_ver": read_text(os.path.join(dev_dir, "fw_ver")),
            "hca_type": read_text(os.path.join(dev_dir, "hca_type")),
            "parent": parent,
            "ports": ports,
            "_chain": chain,
        })
    return devices


def collect_gpus(root):
    return index_in_pci_order([{
        "pci": pci,
        "numa_node": pci_numa_node(dev_dir),
        "class": pci_class,
        "device_id": read_text(os.path.join(dev_dir, "device")),
        "_chain": pci_chain(root, os.path.realpath(dev_dir)),
    } for pci, dev_dir, pci_class in nvidia_pci_functions(root) if is_gpu_class(pci_class)])


def collect_modules(root):
    return {name: os.path.isdir(os.path.join(root, "module", name)) for name in WATCHED_MODULES}


def collect(sysfs_root="/sys"):
    """All facts as a plain dict (JSON-serialisable)."""
    root = os.path.abspath(sysfs_root)
    devices = collect_devices(root)
    gpus = collect_gpus(root)
    affinity = []
    for gpu in gpus:
        for dev in devices:
            affinity.append({
                "gpu": gpu["index"],
                "gpu_pci": gpu["pci"],
                "nic": dev["name"],
                "nic_pci": dev["pci"],
                "level": affinity_level(gpu["_chain"], dev["_chain"], gpu["numa_node"], dev["numa_node"]),
            })
    for item in devices + gpus:
        item.pop("_chain", None)
    return {
        "sysfs_root": root,
        "devices": devices,
        "gpus": gpus,
        "affinity": affinity,
        "kernel_modules": collect_modules(root),
    }


def main():
    module = AnsibleModule(
        argument_spec={"sysfs_root": {"type": "path", "default": "/sys"}},
        supports_check_mode=True,
    )
    facts = collect(module.params["sysfs_root"])
    module.exit_json(changed=False, rdma=facts, ansible_facts={"rdma": facts})


if __name__ == "__main__":
    main()
