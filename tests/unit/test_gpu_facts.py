"""Unit tests for plugins/modules/gpu_facts.py over FAKE sysfs/procfs trees (built by fake_host below) and
SYNTHESIZED nvidia-smi -q -x samples (tests/unit/fixtures/recorded-*.xml, see the README there)."""

from __future__ import annotations

import importlib.util
import os

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
FIXTURES = os.path.join(REPO, "tests", "unit", "fixtures")
MODULE_PATH = os.path.join(REPO, "plugins", "modules", "gpu_facts.py")

spec = importlib.util.spec_from_file_location("gpu_facts", MODULE_PATH)
gpu_facts = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_facts)

HGX_BUSES = ["18", "2a", "3a", "5d", "9a", "ab", "ba", "db"]
OPEN_580 = ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.65.06  Release Build  "
            "(dvs-builder@U16-I3-B03-4-3)  Tue Jul 22 20:46:47 UTC 2025\nGCC version:  gcc version 13.3.0 ")
PROP_535 = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.183.01  Sun May 12 19:39:15 UTC 2024\nGCC version: "


def recorded(name):
    with open(os.path.join(FIXTURES, "recorded-nvidia-smi-q-x-%s.xml" % name), encoding="utf-8") as handle:
        return handle.read()


def _write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text + "\n")


def fake_host(tmp_path, buses=HGX_BUSES, nvswitches=4, banner=OPEN_580, kernel="6.8.0-45-generic",
              peermem_loaded=True, peermem_in_dep=True, memory_peers=True, gpu_class="0x030200"):
    """A FAKE sysfs + procfs + /lib/modules tree of an NVIDIA host (not a recording)."""
    sysfs, procfs, mods = tmp_path / "sys", tmp_path / "proc", tmp_path / "modules"
    for i, bus in enumerate(buses):
        dev = sysfs / "bus" / "pci" / "devices" / ("0000:%s:00.0" % bus)
        _write(str(dev / "vendor"), "0x10de")
        _write(str(dev / "class"), gpu_class)
        _write(str(dev / "device"), "0x2330")
        _write(str(dev / "numa_node"), "0" if i < len(buses) // 2 else "1")
    for i in range(nvswitches):
        dev = sysfs / "bus" / "pci" / "devices" / ("0000:0%d:00.0" % (i + 5))
        _write(str(dev / "vendor"), "0x10de")
        _write(str(dev / "class"), "0x068000")
    nic = sysfs / "bus" / "pci" / "devices" / "0000:19:00.0"
    _write(str(nic / "vendor"), "0x15b3")
    _write(str(nic / "class"), "0x020700")
    if banner:
        _write(str(procfs / "driver" / "nvidia" / "version"), banner)
        os.makedirs(str(sysfs / "module" / "nvidia"), exist_ok=True)
    if peermem_loaded:
        os.makedirs(str(sysfs / "module" / "nvidia_peermem"), exist_ok=True)
    if memory_peers:
        os.makedirs(str(sysfs / "kernel" / "mm" / "memory_peers"), exist_ok=True)
    _write(str(procfs / "sys" / "kernel" / "osrelease"), kernel)
    dep = "kernel/drivers/infiniband/core/ib_core.ko.zst:\n"
    if peermem_in_dep:
        dep += "updates/dkms/nvidia-peermem.ko.zst: updates/dkms/nvidia.ko.zst kernel/drivers/infiniband/core/ib_core.ko.zst\n"
    _write(str(mods / kernel / "modules.dep"), dep)
    return str(sysfs), str(procfs), str(mods)


def collect(tmp_path, smi=None, fm_text=None, fm_active=None, **kw):
    sysfs, procfs, mods = fake_host(tmp_path, **kw)
    return gpu_facts.collect(sysfs, procfs, mods, smi, fm_text, fm_active)


@pytest.mark.parametrize("proc,sys_text,expected", [
    (OPEN_580, None, ("580.65.06", True)),
    (PROP_535, None, ("535.183.01", False)),
    (None, "570.124.06", ("570.124.06", False)),
    (None, None, (None, False)),
    ("garbage", "garbage", (None, False)),
])
def test_parse_driver_version(proc, sys_text, expected):
    assert gpu_facts.parse_driver_version(proc, sys_text) == expected


@pytest.mark.parametrize("bus_id,expected", [
    ("00000000:18:00.0", "0000:18:00.0"), ("00000000:DB:00.0", "0000:db:00.0"), ("0000:41:00.0", "0000:41:00.0")])
def test_normalize_pci(bus_id, expected):
    assert gpu_facts.normalize_pci(bus_id) == expected


def test_hgx_with_fabric_manager(tmp_path):
    data = collect(tmp_path, recorded("h100-hgx"), "Fabric Manager version is : 580.65.06", True)
    assert data["driver_version"] == "580.65.06" and data["driver_open"] is True
    assert [g["pci"] for g in data["gpus"]] == ["0000:%s:00.0" % b for b in HGX_BUSES]
    assert [g["index"] for g in data["gpus"]] == list(range(8))
    assert [g["numa_node"] for g in data["gpus"]] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert len(data["nvswitches"]) == 4
    assert data["peermem"] == {"loaded": True, "loadable": True, "memory_peers": True}
    assert data["dmabuf"] == {"possible": True, "reasons": []}
    assert data["smi"]["driver_version"] == "580.65.06" and data["smi"]["cuda_version"] == "13.0"
    assert [g["pci"] for g in data["smi"]["gpus"]] == [g["pci"] for g in data["gpus"]]
    assert [g["minor_number"] for g in data["smi"]["gpus"]] == list(range(8))
    assert {g["persistence_mode"] for g in data["smi"]["gpus"]} == {"Enabled"}
    assert {(g["fabric_state"], g["fabric_status"]) for g in data["smi"]["gpus"]} == {("Completed", "Success")}
    assert data["fabricmanager"] == {"version": "580.65.06", "active": True}


def test_hgx_fabric_manager_stopped(tmp_path):
    data = collect(tmp_path, recorded("h100-hgx-fm-stopped"), "Fabric Manager version is : 580.65.06", False)
    assert {g["fabric_state"] for g in data["smi"]["gpus"]} == {"Not Started"}
    assert {g["fabric_status"] for g in data["smi"]["gpus"]} == {None}  # N/A
    assert data["fabricmanager"]["active"] is False


def test_old_proprietary_driver(tmp_path):
    data = collect(tmp_path, recorded("h100-hgx-old-driver"), banner=PROP_535, kernel="5.15.0-119-generic")
    assert data["driver_version"] == "535.183.01" and data["driver_open"] is False
    assert data["smi"]["cuda_version"] == "12.2"
    assert {g["persistence_mode"] for g in data["smi"]["gpus"]} == {"Disabled"}
    assert data["dmabuf"] == {"possible": False, "reasons": ["driver is not the open kernel module"]}


def test_no_peermem_but_dmabuf(tmp_path):
    data = collect(tmp_path, recorded("l40s-pcie"), buses=["41", "c1"], nvswitches=0, peermem_loaded=False,
                   peermem_in_dep=False, memory_peers=False, gpu_class="0x030000")
    assert data["peermem"] == {"loaded": False, "loadable": False, "memory_peers": False}
    assert data["dmabuf"]["possible"] is True
    assert data["nvswitches"] == [] and len(data["gpus"]) == 2


def test_pcie_no_nvswitch(tmp_path):
    data = collect(tmp_path, recorded("l40s-pcie"), buses=["41", "c1"], nvswitches=0)
    assert data["nvswitches"] == []
    assert {g["fabric_state"] for g in data["smi"]["gpus"]} == {None}
    assert data["fabricmanager"] == {"version": None, "active": None}


def test_dmabuf_reasons(tmp_path):
    data = collect(tmp_path, banner=PROP_535, kernel="5.4.0-200-generic")
    assert data["dmabuf"] == {"possible": False, "reasons": [
        "kernel 5.4.0-200-generic < 5.12", "driver is not the open kernel module"]}
    assert data["smi"] is None


def test_cpu_host_is_empty_not_an_error(tmp_path):
    data = collect(tmp_path, buses=[], nvswitches=0, banner=None, peermem_loaded=False, peermem_in_dep=False)
    assert data["driver_version"] is None and data["gpus"] == [] and data["nvswitches"] == []
    assert data["dmabuf"]["possible"] is False and "no NVIDIA driver loaded" in data["dmabuf"]["reasons"]


def test_missing_trees(tmp_path):
    data = gpu_facts.collect(str(tmp_path / "nope"), str(tmp_path / "nope"), str(tmp_path / "nope"))
    assert data["gpus"] == [] and data["driver_version"] is None and data["kernel_release"] is None
    assert data["peermem"] == {"loaded": False, "loadable": False, "memory_peers": False}


def test_bad_xml_is_none():
    assert gpu_facts.parse_smi_xml("<nvidia_smi_log><gpu") is None
    assert gpu_facts.parse_fm_version("command not found") is None
