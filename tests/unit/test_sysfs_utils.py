"""Unit tests for plugins/module_utils/sysfs.py (ansible.module_utils.sysfs, registered by conftest.py), the
helpers gpu_facts and rdma_facts share, over small FAKE sysfs trees built here."""

from __future__ import annotations

import importlib.util
import os
import sys

import pytest

from ansible.module_utils.sysfs import (index_in_pci_order, is_gpu_class, list_dir, nvidia_pci_functions, parse_int,
                                        pci_numa_node, read_text)

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def _write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)


def _pci(root, addr, vendor, pci_class, numa=None):
    dev = os.path.join(str(root), "bus", "pci", "devices", addr)
    _write(os.path.join(dev, "vendor"), vendor + "\n")
    _write(os.path.join(dev, "class"), pci_class + "\n")
    if numa is not None:
        _write(os.path.join(dev, "numa_node"), numa + "\n")
    return dev


def test_read_text(tmp_path):
    _write(str(tmp_path / "f"), "  4: ACTIVE\n")
    assert read_text(str(tmp_path / "f")) == "4: ACTIVE"
    assert read_text(str(tmp_path / "missing")) is None
    assert read_text(str(tmp_path)) is None  # a directory
    (tmp_path / "bad").write_bytes(b"ab\xffc\n")
    assert read_text(str(tmp_path / "bad")) == "ab\ufffdc"  # undecodable bytes replaced, not an error


def test_list_dir(tmp_path):
    for name in ("mlx5_1", "mlx5_0", "10"):
        (tmp_path / name).mkdir()
    assert list_dir(str(tmp_path)) == ["10", "mlx5_0", "mlx5_1"]
    assert list_dir(str(tmp_path / "missing")) == []


@pytest.mark.parametrize("raw,default,expected", [
    ("3", None, 3), ("-1", None, -1), ("0x10", None, 16), (" 7 ", None, 7),
    (None, -1, -1), ("garbage", 0, 0), ("", None, None), ("1.5", -1, -1)])
def test_parse_int(raw, default, expected):
    assert parse_int(raw, default) == expected


def test_pci_numa_node(tmp_path):
    assert pci_numa_node(_pci(tmp_path, "0000:18:00.0", "0x10de", "0x030200", numa="1")) == 1
    assert pci_numa_node(_pci(tmp_path, "0000:19:00.0", "0x10de", "0x030200", numa="-1")) == -1
    assert pci_numa_node(_pci(tmp_path, "0000:1a:00.0", "0x10de", "0x030200")) == -1  # no file: unknown


def test_nvidia_pci_functions(tmp_path):
    gpu = _pci(tmp_path, "0000:AB:00.0", "0x10DE", "0x030200")
    switch = _pci(tmp_path, "0000:05:00.0", "0x10de", "0x068000")
    _pci(tmp_path, "0000:19:00.0", "0x15b3", "0x020700")  # a Mellanox NIC: not NVIDIA
    vga = _pci(tmp_path, "0000:41:00.0", "0x10de", "0x030000")
    assert nvidia_pci_functions(str(tmp_path)) == [
        ("0000:05:00.0", switch, "0x068000"),
        ("0000:41:00.0", vga, "0x030000"),
        ("0000:ab:00.0", gpu, "0x030200"),  # address and ids in lower case; the directory as sysfs names it
    ]
    assert nvidia_pci_functions(str(tmp_path / "no-sysfs")) == []


@pytest.mark.parametrize("pci_class,expected", [
    ("0x030200", True), ("0x030000", True), ("0x068000", False), ("0x020700", False), ("", False)])
def test_is_gpu_class(pci_class, expected):
    assert is_gpu_class(pci_class) is expected


def test_index_in_pci_order():
    gpus = [{"pci": "0000:9a:00.0"}, {"pci": "0000:18:00.0"}, {"pci": "0000:2a:00.0"}]
    assert index_in_pci_order(gpus) == [
        {"pci": "0000:18:00.0", "index": 0}, {"pci": "0000:2a:00.0", "index": 1}, {"pci": "0000:9a:00.0", "index": 2}]
    assert index_in_pci_order([]) == []


SYSFS_FQCN = "ansible_collections.pd_bundle.serving.plugins.module_utils.sysfs"


@pytest.mark.parametrize("name", ["gpu_facts", "rdma_facts"])
@pytest.mark.parametrize("collection", [True, False], ids=["by-collection-name", "clone-fallback"])
def test_modules_read_sysfs_through_the_shared_helpers(name, collection, monkeypatch):
    """One copy: the modules import the helpers from module_utils, they do not define their own: by the collection's
    name where it is importable (tests/conftest.py puts the clone's collections/ on sys.path, as an installed
    collection is), else (a clone without it: that name blocked here) as ansible.module_utils.sysfs."""
    if not collection:
        monkeypatch.setitem(sys.modules, SYSFS_FQCN, None)  # an import of it raises ImportError
    spec = importlib.util.spec_from_file_location("sysfs_user_" + name, os.path.join(REPO, "plugins", "modules",
                                                                                      name + ".py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    for helper in ("read_text", "parse_int", "pci_numa_node", "nvidia_pci_functions", "index_in_pci_order"):
        assert getattr(mod, helper).__module__ == (SYSFS_FQCN if collection else "ansible.module_utils.sysfs"), (
            name, helper)
    for fact in ("NVIDIA_VENDOR", "GPU_CLASS_PREFIXES"):
        assert not hasattr(mod, fact), (name, fact)
