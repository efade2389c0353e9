"""Unit tests for plugins/modules/rdma_facts.py over the fake sysfs trees in tests/fixtures/sysfs."""

from __future__ import annotations

import importlib.util
import io
import json
import os
import shutil
import subprocess
import sys
from contextlib import redirect_stdout

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
FIXTURES = os.path.join(REPO, "tests", "fixtures", "sysfs")
MODULE_PATH = os.path.join(REPO, "plugins", "modules", "rdma_facts.py")


def _load():
    spec = importlib.util.spec_from_file_location("rdma_facts", MODULE_PATH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


rdma_facts = _load()


def facts(name):
    return rdma_facts.collect(os.path.join(FIXTURES, name))


def dev(data, name):
    return next(d for d in data["devices"] if d["name"] == name)


def level(data, gpu, nic):
    return next(a["level"] for a in data["affinity"] if a["gpu"] == gpu and a["nic"] == nic)


# -- parsers ---------------------------------------------------------------------------------
@pytest.mark.parametrize("raw,expected", [
    ("4: ACTIVE", "ACTIVE"), ("1: DOWN", "DOWN"), ("ACTIVE", "ACTIVE"), (None, None)])
def test_parse_state(raw, expected):
    assert rdma_facts.parse_state(raw) == expected


@pytest.mark.parametrize("raw,expected", [
    ("200 Gb/sec (4X HDR)", 200.0), ("2.5 Gb/sec (1X SDR)", 2.5), ("400 Gb/sec (4X NDR)", 400.0),
    ("garbage", None), (None, None)])
def test_parse_rate(raw, expected):
    assert rdma_facts.parse_rate(raw) == expected


def test_gid_ipv4_and_zero():
    assert rdma_facts.gid_ipv4("0000:0000:0000:0000:0000:ffff:0a00:0005") == "10.0.0.5"
    assert rdma_facts.gid_ipv4("fe80:0000:0000:0000:ba3f:d2ff:fe11:0000") is None
    assert rdma_facts.is_zero_gid("0000:0000:0000:0000:0000:0000:0000:0000")
    assert not rdma_facts.is_zero_gid("fe80:0000:0000:0000:0000:0000:0000:0001")


def test_gid_type_mapping():
    assert rdma_facts.gid_type("IB/RoCE v1", "InfiniBand") == "IB"
    assert rdma_facts.gid_type("IB/RoCE v1", "Ethernet") == "RoCE v1"
    assert rdma_facts.gid_type("RoCE v2", "Ethernet") == "RoCE v2"
    assert rdma_facts.gid_type(None, "InfiniBand") == "IB"


# -- fixtures ----------------------------------------------------------------------------------
def test_dgx_devices_gpus_affinity():
    data = facts("dgx_8gpu_8ib")
    assert [d["name"] for d in data["devices"]] == ["mlx5_%d" % i for i in range(9)]
    assert len(data["gpus"]) == 8  # NVSwitch functions (class 0x0680) are not GPUs
    assert [g["index"] for g in data["gpus"]] == list(range(8))
    assert data["gpus"][3]["pci"] == "0000:50:00.0" and data["gpus"][3]["numa_node"] == 0
    assert data["gpus"][4]["numa_node"] == 1
    m3 = dev(data, "mlx5_3")
    assert m3["pci"] == "0000:51:00.0" and m3["numa_node"] == 0
    port = m3["ports"][0]
    assert port["port"] == 1 and port["state"] == "ACTIVE" and port["phys_state"] == "LinkUp"
    assert port["link_layer"] == "InfiniBand" and port["rate_gbps"] == 400.0
    assert port["netdev"] == "ibp81s0"
    assert [(g["index"], g["type"]) for g in port["gids"]] == [(0, "IB")]  # zero GIDs skipped
    assert level(data, 3, "mlx5_3") == "pix"
    assert level(data, 3, "mlx5_0") == "numa"
    assert level(data, 3, "mlx5_4") == "sys"
    assert level(data, 4, "mlx5_8") == "numa"
    for gpu in range(8):
        pix = [a["nic"] for a in data["affinity"] if a["gpu"] == gpu and a["level"] == "pix"]
        assert pix == ["mlx5_%d" % gpu]
    mgmt = dev(data, "mlx5_8")["ports"][0]
    assert mgmt["link_layer"] == "Ethernet" and mgmt["rate_gbps"] == 25.0
    assert mgmt["netdev"] == "enp225s0f0np0"
    # plain management netdevs (eno1/eno2) are not RDMA devices
    assert not any(d["name"].startswith("eno") for d in data["devices"])
    assert data["kernel_modules"]["mlx5_ib"] is True
    assert data["kernel_modules"]["nvidia_peermem"] is False


def test_roce_plain_gid_table():
    data = facts("roce_plain")
    assert [g["pci"] for g in data["gpus"]] == ["0000:1a:00.0", "0000:9a:00.0"]
    port = dev(data, "mlx5_0")["ports"][0]
    assert port["link_layer"] == "Ethernet" and port["rate_gbps"] == 200.0 and port["netdev"] == "ens1f0np0"
    table = [(g["index"], g["type"], g["ipv4"], g["link_local"]) for g in port["gids"]]
    assert table == [
        (0, "RoCE v1", None, True),
        (1, "RoCE v2", None, True),
        (2, "RoCE v1", "10.0.0.5", False),
        (3, "RoCE v2", "10.0.0.5", False),
    ]
    assert port["gids"][3]["gid"] == "0000:0000:0000:0000:0000:ffff:0a00:0005"
    assert all(g["netdev"] == "ens1f0np0" for g in port["gids"])
    assert dev(data, "mlx5_1")["numa_node"] == 1
    assert level(data, 0, "mlx5_0") == "pix" and level(data, 0, "mlx5_1") == "sys"
    assert level(data, 1, "mlx5_1") == "pix"


def test_roce_bond_netdev_is_bond():
    data = facts("roce_bond")
    bond = dev(data, "mlx5_bond_0")
    port = bond["ports"][0]
    assert bond["pci"] == "0000:3c:00.0"
    assert port["netdev"] == "bond0"
    assert port["netdevs"][0] == "bond0" and "ens1f0np0" in port["netdevs"]
    assert [g["ipv4"] for g in port["gids"] if g["type"] == "RoCE v2"] == [None, "10.0.2.5"]
    assert level(data, 0, "mlx5_bond_0") == "pix"
    assert level(data, 1, "mlx5_bond_0") == "sys"


def test_one_port_down():
    data = facts("one_port_down")
    assert dev(data, "mlx5_0")["ports"][0]["state"] == "ACTIVE"
    port = dev(data, "mlx5_1")["ports"][0]
    assert port["state"] == "DOWN" and port["phys_state"] == "Disabled"


def test_no_rdma_returns_empty_lists():
    data = facts("no_rdma")
    assert data["devices"] == [] and data["affinity"] == []
    assert [g["numa_node"] for g in data["gpus"]] == [-1, -1]


def test_rxe_vm():
    data = facts("rxe_vm")
    assert data["gpus"] == [] and data["affinity"] == []
    rxe = dev(data, "rxe0")
    assert rxe["pci"] is None and rxe["numa_node"] is None and rxe["parent"] == "eth0"
    port = rxe["ports"][0]
    assert port["state"] == "ACTIVE" and port["link_layer"] == "Ethernet" and port["rate_gbps"] == 2.5
    assert port["netdev"] == "eth0"
    assert [(g["index"], g["type"], g["ipv4"]) for g in port["gids"]] == [
        (0, "RoCE v2", None), (1, "RoCE v2", "10.77.0.11")]
    assert data["kernel_modules"]["rdma_rxe"] is True


def test_missing_root_is_not_an_error(tmp_path):
    data = rdma_facts.collect(str(tmp_path / "does-not-exist"))
    assert data["devices"] == [] and data["gpus"] == [] and data["affinity"] == []


def test_facts_are_json_serialisable():
    for name in os.listdir(FIXTURES):
        if os.path.isdir(os.path.join(FIXTURES, name)):
            json.dumps(facts(name))


def test_fixtures_are_reproducible(tmp_path):
    """The committed trees equal a fresh run of make_fixtures.py."""
    subprocess.run([sys.executable, os.path.join(FIXTURES, "make_fixtures.py"), "--out", str(tmp_path)],
                   check=True, capture_output=True)
    for name in sorted(os.listdir(tmp_path)):
        assert rdma_facts.collect(str(tmp_path / name)) | {"sysfs_root": None} == \
            facts(name) | {"sysfs_root": None}, name


# -- as an Ansible module ----------------------------------------------------------------------
def test_main_with_patched_args():
    testing = pytest.importorskip("ansible.module_utils.testing")
    buf = io.StringIO()
    with testing.patch_module_args({"sysfs_root": os.path.join(FIXTURES, "rxe_vm")}):
        with redirect_stdout(buf), pytest.raises(SystemExit) as exc:
            rdma_facts.main()
    assert exc.value.code == 0
    result = json.loads(buf.getvalue())
    assert result["changed"] is False
    assert result["ansible_facts"]["rdma"]["devices"][0]["name"] == "rxe0"
    assert result["rdma"] == result["ansible_facts"]["rdma"]


def _ansible_bin():
    candidate = os.path.join(os.path.dirname(sys.executable), "ansible")
    return candidate if os.path.exists(candidate) else shutil.which("ansible")


@pytest.mark.skipif(_ansible_bin() is None, reason="ansible CLI not installed")
def test_runs_as_real_module():
    env = dict(os.environ, ANSIBLE_LOCALHOST_WARNING="False", ANSIBLE_INVENTORY_UNPARSED_WARNING="False",
               ANSIBLE_NOCOLOR="1", ANSIBLE_CALLBACK_RESULT_FORMAT="json",
               ANSIBLE_CACHE_PLUGIN="memory")  # no fact cache files in the repo
    proc = subprocess.run(
        [_ansible_bin(), "localhost", "-c", "local", "-M", os.path.join(REPO, "plugins", "modules"),
         "-m", "rdma_facts", "-a", "sysfs_root=%s" % os.path.join(FIXTURES, "roce_plain")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    yaml = pytest.importorskip("yaml")
    payload = yaml.safe_load(proc.stdout.split("=>", 1)[1])  # JSON or YAML result format
    rdma = payload["ansible_facts"]["rdma"]
    assert [d["name"] for d in rdma["devices"]] == ["mlx5_0", "mlx5_1"]
    assert len(rdma["gpus"]) == 2
