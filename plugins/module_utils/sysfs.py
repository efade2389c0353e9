# -*- coding: utf-8 -*-
"""Reading a sysfs/procfs tree, for the gpu_facts and rdma_facts modules: the one copy of their shared helpers.

Imported as ansible.module_utils.sysfs (ansible.cfg's module_utils = ./plugins/module_utils; molecule sets
ANSIBLE_MODULE_UTILS), so Ansible ships it inside each module's AnsiballZ payload. The root is a parameter
everywhere: /sys or /proc on a host, a fake tree in tests and render mode."""

from __future__ import annotations

import os

PCI_DEVICES = os.path.join("bus", "pci", "devices")
NVIDIA_VENDOR = "0x10de"
# PCI classes of NVIDIA GPUs: 0x0300xx VGA controller, 0x0302xx 3D controller (NVSwitch is 0x0680xx).
GPU_CLASS_PREFIXES = ("0x0300", "0x0302")


def read_text(path):
    """The stripped content of a sysfs/procfs file, or None if missing/unreadable."""
    try:
        with open(path, "r", encoding="utf-8", errors="replace") as handle:
            return handle.read().strip()
    except (OSError, ValueError):
        return None


def list_dir(path):
    """Sorted entries of a directory; [] if it is missing or unreadable."""
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def parse_int(raw, default=None):
    """'3' -> 3, '0x10' -> 16; None or garbage -> default."""
    try:
        return int(raw, 0)
    except (TypeError, ValueError):
        return default


def pci_numa_node(dev_dir):
    """A PCI device's NUMA node (its numa_node file); -1 when unknown, as the kernel writes it."""
    return parse_int(read_text(os.path.join(dev_dir, "numa_node")), -1)


def nvidia_pci_functions(sysfs_root):
    """[(pci, dev_dir, pci_class)] of the NVIDIA functions in <sysfs_root>/bus/pci/devices: the address in
    lower case, its sysfs directory and its lower-case class (e.g. 0x030200), in sysfs name order."""
    pci_dir = os.path.join(sysfs_root, PCI_DEVICES)
    found = []
    for addr in list_dir(pci_dir):
        dev_dir = os.path.join(pci_dir, addr)
        if (read_text(os.path.join(dev_dir, "vendor")) or "").lower() != NVIDIA_VENDOR:
            continue
        found.append((addr.lower(), dev_dir, (read_text(os.path.join(dev_dir, "class")) or "").lower()))
    return found


def is_gpu_class(pci_class):
    return pci_class.startswith(GPU_CLASS_PREFIXES)


def index_in_pci_order(gpus):
    """Sort GPU dicts by their 'pci' and number them (key 'index') in that order: CUDA_DEVICE_ORDER=PCI_BUS_ID."""
    gpus.sort(key=lambda g: g["pci"])
    for index, gpu in enumerate(gpus):
        gpu["index"] = index
    return gpus
