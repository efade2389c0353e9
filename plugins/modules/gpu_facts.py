#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Ansible module: read the NVIDIA GPU stack (driver, GPUs, NVSwitch, GPUDirect paths) from sysfs/procfs
and, where present, from `nvidia-smi -q -x` and `nv-fabricmanager --version`."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_facts
short_description: Gather the NVIDIA driver, GPUs, NVSwitch, fabric manager and GPUDirect facts
description:
  - Reads sysfs and procfs (I(sysfs_root), I(procfs_root)) and the kernel's modules.dep; runs
    C(nvidia-smi -q -x) and C(nv-fabricmanager --version) only when they are installed. Changes nothing.
  - A host without NVIDIA GPUs returns empty facts, never an error.
  - Sets the fact C(gpu) (C(ansible_facts.gpu)) and returns the same data under C(gpu).
options:
  sysfs_root:
    description: Root of the sysfs tree. C(/sys) on a host; a fake tree in tests.
    type: path
    default: /sys
  procfs_root:
    description: Root of the procfs tree. C(/proc) on a host; a fake tree in tests.
    type: path
    default: /proc
  modules_root:
    description: Directory holding C(<kernel release>/modules.dep) (is nvidia_peermem loadable).
    type: path
    default: /lib/modules
  run_tools:
    description: Run nvidia-smi, nv-fabricmanager and systemctl when installed. False with a fake tree.
    type: bool
    default: true
author:
  - vLLM PD bundle
"""

EXAMPLES = r"""
- name: Gather GPU facts
  gpu_facts:
"""

RETURN = r"""
gpu:
  description: Same data as C(ansible_facts.gpu).
  returned: always
  type: dict
  contains:
    driver_version:
      description: Loaded NVIDIA kernel driver (procfs driver/nvidia/version, else sysfs module/nvidia/version), or null.
      type: str
    driver_open:
      description: True when the loaded driver is NVIDIA's open kernel module (needed for DMA-BUF).
      type: bool
    kernel_release:
      description: Running kernel (procfs sys/kernel/osrelease).
      type: str
    gpus:
      description: NVIDIA display/3D PCI functions in PCI bus order (CUDA_DEVICE_ORDER=PCI_BUS_ID); C(index), C(pci), C(numa_node), C(device_id).
      type: list
      elements: dict
    nvswitches:
      description: PCI addresses of NVSwitch devices (vendor 0x10de, class 0x0680xx).
      type: list
      elements: str
    peermem:
      description: C(loaded), C(loadable) (in modules.dep of the running kernel), C(memory_peers) (the peer-memory API directory exists).
      type: dict
    dmabuf:
      description: C(possible) and C(reasons) (what is missing) for GPU memory registration through DMA-BUF.
      type: dict
    smi:
      description: From C(nvidia-smi -q -x) (null without it) - C(driver_version), C(cuda_version), C(gpus) (C(pci), C(minor_number), C(persistence_mode), C(fabric_state), C(fabric_status)).
      type: dict
    fabricmanager:
      description: C(version) (from nv-fabricmanager --version) and C(active) (systemctl is-active nvidia-fabricmanager); null when unknown.
      type: dict
"""

import os
import re
import xml.etree.ElementTree as ET

try:  # the installed collection (ansible-galaxy collection install)
    from ansible_collections.pd_bundle.serving.plugins.module_utils.sysfs import (
        index_in_pci_order, is_gpu_class, nvidia_pci_functions, parse_int, pci_numa_node, read_text)
except ImportError:  # a clone: ansible.cfg's module_utils = ./plugins/module_utils
    from ansible.module_utils.sysfs import (  # type: ignore[no-redef]
        index_in_pci_order, is_gpu_class, nvidia_pci_functions, parse_int, pci_numa_node, read_text)

try:
    from ansible.module_utils.basic import AnsibleModule
except ImportError:  # pure functions stay importable without ansible
    AnsibleModule = None

NVSWITCH_CLASS_PREFIX = "0x0680"
DRIVER_RE = re.compile(r"Kernel Module\s+(?:for\s+\S+\s+)?([0-9]+\.[0-9]+(?:\.[0-9]+)?)")
FM_VERSION_RE = re.compile(r"version is\s*:\s*([0-9]+\.[0-9]+(?:\.[0-9]+)?)", re.I)
# DMA-BUF import of GPU memory by RDMA drivers: Linux 5.12+, NVIDIA open kernel module, R515+
# (NVIDIA GPU Operator docs, "GPUDirect RDMA and GPUDirect Storage").
DMABUF_MIN_KERNEL = (5, 12)
DMABUF_MIN_DRIVER = 515
FM_SERVICE = "nvidia-fabricmanager"


def version_tuple(text):
    """'580.65.06' -> (580, 65, 6); '6.8.0-45-generic' -> (6, 8, 0); None/garbage -> ()."""
    match = re.match(r"^\s*([0-9]+(?:\.[0-9]+)*)", str(text or ""))
    return tuple(int(p) for p in match.group(1).split(".")) if match else ()


def parse_driver_version(proc_text, sys_text=None):
    """(version, open): the loaded driver from procfs' banner, else sysfs module/nvidia/version."""
    if proc_text:
        match = DRIVER_RE.search(proc_text)
        if match:
            return match.group(1), "Open Kernel Module" in proc_text
    if sys_text and version_tuple(sys_text):
        return sys_text.strip(), False
    return None, False


def collect_pci(root):
    gpus, switches = [], []
    for pci, dev_dir, pci_class in nvidia_pci_functions(root):
        if pci_class.startswith(NVSWITCH_CLASS_PREFIX):
            switches.append(pci)
        elif is_gpu_class(pci_class):
            gpus.append({
                "pci": pci,
                "numa_node": pci_numa_node(dev_dir),
                "device_id": read_text(os.path.join(dev_dir, "device")),
            })
    return index_in_pci_order(gpus), sorted(switches)


def peermem_loadable(modules_root, release):
    """nvidia-peermem.ko is listed in modules.dep of the running kernel (modprobe can load it)."""
    dep = read_text(os.path.join(modules_root, release or "", "modules.dep")) if release else None
    return bool(dep) and re.search(r"(^|/)nvidia[-_]peermem\.ko(\.[a-z]+)?:", dep, re.M) is not None


def dmabuf_support(kernel_release, driver_version, driver_open):
    reasons = []
    if version_tuple(kernel_release)[:2] < DMABUF_MIN_KERNEL:
        reasons.append("kernel %s < %d.%d" % (kernel_release, DMABUF_MIN_KERNEL[0], DMABUF_MIN_KERNEL[1]))
    if not driver_version:
        reasons.append("no NVIDIA driver loaded")
    else:
        if version_tuple(driver_version)[:1] < (DMABUF_MIN_DRIVER,):
            reasons.append("driver %s < %d" % (driver_version, DMABUF_MIN_DRIVER))
        if not driver_open:
            reasons.append("driver is not the open kernel module")
    return {"possible": not reasons, "reasons": reasons}


def normalize_pci(bus_id):
    """nvidia-smi's '00000000:18:00.0' -> sysfs' '0000:18:00.0'."""
    text = (bus_id or "").strip().lower()
    match = re.match(r"^([0-9a-f]+):([0-9a-f]{2}):([0-9a-f]{2})\.([0-7])$", text)
    if not match:
        return text or None
    return "%04x:%s:%s.%s" % (int(match.group(1), 16) & 0xFFFF, match.group(2), match.group(3), match.group(4))


def _find(node, path):
    found = node.find(path)
    text = found.text.strip() if found is not None and found.text else None
    return None if text in (None, "N/A") else text


def parse_smi_xml(text):
    """The fields the preflight needs from `nvidia-smi -q -x` output; None when unparsable."""
    try:
        root = ET.fromstring(text)
    except ET.ParseError:
        return None
    gpus = []
    for gpu in root.findall("gpu"):
        gpus.append({
            "pci": normalize_pci(gpu.get("id") or _find(gpu, "pci/pci_bus_id")),
            "minor_number": parse_int(_find(gpu, "minor_number")),
            "product_name": _find(gpu, "product_name"),
            "persistence_mode": _find(gpu, "persistence_mode"),
            "fabric_state": _find(gpu, "fabric/state"),
            "fabric_status": _find(gpu, "fabric/status"),
        })
    return {
        "driver_version": _find(root, "driver_version"),
        "cuda_version": _find(root, "cuda_version"),
        "gpus": sorted(gpus, key=lambda g: g["pci"] or ""),
    }


def parse_fm_version(text):
    match = FM_VERSION_RE.search(text or "")
    return match.group(1) if match else None


def collect(sysfs_root="/sys", procfs_root="/proc", modules_root="/lib/modules", smi_xml=None, fm_version_text=None,
            fm_active=None):
    """All facts as a plain dict; tool outputs are passed in (recorded samples in tests)."""
    sysfs, procfs = os.path.abspath(sysfs_root), os.path.abspath(procfs_root)
    driver, driver_open = parse_driver_version(read_text(os.path.join(procfs, "driver", "nvidia", "version")),
                                               read_text(os.path.join(sysfs, "module", "nvidia", "version")))
    release = read_text(os.path.join(procfs, "sys", "kernel", "osrelease"))
    gpus, switches = collect_pci(sysfs)
    return {
        "driver_version": driver,
        "driver_open": driver_open,
        "kernel_release": release,
        "gpus": gpus,
        "nvswitches": switches,
        "peermem": {
            "loaded": os.path.isdir(os.path.join(sysfs, "module", "nvidia_peermem")),
            "loadable": peermem_loadable(modules_root, release),
            "memory_peers": os.path.isdir(os.path.join(sysfs, "kernel", "mm", "memory_peers")),
        },
        "dmabuf": dmabuf_support(release, driver, driver_open),
        "smi": parse_smi_xml(smi_xml) if smi_xml else None,
        "fabricmanager": {"version": parse_fm_version(fm_version_text), "active": fm_active},
    }


def _run(module, name, args):
    path = module.get_bin_path(name)
    if not path:
        return None, None
    rc, out, err = module.run_command([path] + args)
    return rc, out + err


def main():
    module = AnsibleModule(
        argument_spec={
            "sysfs_root": {"type": "path", "default": "/sys"},
            "procfs_root": {"type": "path", "default": "/proc"},
            "modules_root": {"type": "path", "default": "/lib/modules"},
            "run_tools": {"type": "bool", "default": True},
        },
        supports_check_mode=True,
    )
    p = module.params
    smi = fm_text = fm_active = None
    if p["run_tools"]:
        rc, out = _run(module, "nvidia-smi", ["-q", "-x"])
        smi = out if rc == 0 else None
        rc, out = _run(module, "nv-fabricmanager", ["--version"])
        fm_text = out if rc == 0 else None
        rc, out = _run(module, "systemctl", ["is-active", FM_SERVICE])
        fm_active = None if rc is None else (out or "").strip().splitlines()[:1] == ["active"]
    facts = collect(p["sysfs_root"], p["procfs_root"], p["modules_root"], smi, fm_text, fm_active)
    module.exit_json(changed=False, gpu=facts, ansible_facts={"gpu": facts})


if __name__ == "__main__":
    main()
