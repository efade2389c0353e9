"""Unit tests for plugins/filter/rdma_select.py, fed by rdma_facts over the fake sysfs trees."""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import shutil
import subprocess
import sys

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
FIXTURES = os.path.join(REPO, "tests", "fixtures", "sysfs")


def _load(name, *parts):
    spec = importlib.util.spec_from_file_location(name, os.path.join(REPO, *parts))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


rdma_facts = _load("rdma_facts", "plugins", "modules", "rdma_facts.py")
flt = _load("rdma_select", "plugins", "filter", "rdma_select.py")
select = flt.rdma_select
FilterError = flt.AnsibleFilterError


def facts(name):
    return rdma_facts.collect(os.path.join(FIXTURES, name))


def test_filter_module_exports():
    names = flt.FilterModule().filters()
    assert names["rdma_select"] is select and "rdma_describe" in names


# -- dgx_8gpu_8ib ------------------------------------------------------------------------------
@pytest.mark.parametrize("gpu", range(8))
def test_dgx_each_gpu_gets_its_switch_nic(gpu):
    sel = select(facts("dgx_8gpu_8ib"), gpus=[gpu])
    assert sel["nics"] == ["mlx5_%d" % gpu]
    assert sel["gid_index"] is None and sel["link_layer"] == "InfiniBand" and sel["ib_port"] == 1
    assert sel["ports"][0]["affinity"] == {gpu: "pix"}


def test_dgx_gpu3():
    sel = select(facts("dgx_8gpu_8ib"), gpus=[3])
    assert sel["nics"] == ["mlx5_3"] and sel["netdevs"] == ["ibp81s0"]


def test_dgx_tp8_uses_all_eight_ib_nics_not_mgmt():
    sel = select(facts("dgx_8gpu_8ib"), gpus=list(range(8)))
    assert sel["nics"] == ["mlx5_%d" % i for i in range(8)]


def test_dgx_tp2():
    assert select(facts("dgx_8gpu_8ib"), gpus=[4, 5])["nics"] == ["mlx5_4", "mlx5_5"]


def test_dgx_no_gpus_prefers_fastest():
    # CPU-only instance: every NIC ties on affinity; the 400 Gb/s IB ports beat the 25 Gb/s mgmt port
    sel = select(facts("dgx_8gpu_8ib"), gpus=[])
    assert sel["nics"] == ["mlx5_%d" % i for i in range(8)]


def test_dgx_ethernet_only_finds_mgmt_roce_port_and_exclude_rule():
    data = facts("dgx_8gpu_8ib")
    sel = select(data, gpus=[4], link_layer="Ethernet")
    assert sel["nics"] == ["mlx5_8"] and sel["gid_index"] == 3 and sel["netdevs"] == ["enp225s0f0np0"]
    assert sel["ports"][0]["ipv4"] == "192.168.10.8"
    for pattern in (["mlx5_8"], ["enp225s0f0*"], ["mlx5_8:1"]):
        with pytest.raises(FilterError) as err:
            select(data, gpus=[4], link_layer="Ethernet", exclude=pattern)
        assert "excluded by pattern" in str(err.value)


def test_dgx_min_rate_excludes_slow_port():
    with pytest.raises(FilterError) as err:
        select(facts("dgx_8gpu_8ib"), gpus=[4], link_layer="Ethernet", min_rate_gbps=100)
    assert "below min_rate_gbps" in str(err.value)


def test_dgx_explicit_and_link_layer_checks():
    data = facts("dgx_8gpu_8ib")
    assert select(data, gpus=[0], nics=["mlx5_1", "mlx5_0"])["nics"] == ["mlx5_1", "mlx5_0"]
    assert select(data, nics="mlx5_2,mlx5_3")["nics"] == ["mlx5_2", "mlx5_3"]
    assert select(data, nics=["ibp25s0"])["nics"] == ["mlx5_0"]  # netdev name resolves to its device
    with pytest.raises(FilterError, match="link layer is InfiniBand, expected Ethernet"):
        select(data, nics=["mlx5_0"], link_layer="Ethernet")
    with pytest.raises(FilterError, match="mix link layers"):
        select(data, nics=["mlx5_0", "mlx5_8"])
    with pytest.raises(FilterError, match=r"'mlx5_42' not found"):
        select(data, nics=["mlx5_42"])


def test_missing_gpu_index_on_gpu_host():
    with pytest.raises(FilterError, match=r"GPU index\(es\) \[9\] not present"):
        select(facts("dgx_8gpu_8ib"), gpus=[9], instance_name="prefill-0")


# -- roce_plain --------------------------------------------------------------------------------
def test_roce_plain_picks_ipv4_roce_v2_gid():
    data = facts("roce_plain")
    sel = select(data, gpus=[0])
    assert sel["nics"] == ["mlx5_0"] and sel["gid_index"] == 3 and sel["netdevs"] == ["ens1f0np0"]
    assert sel["ports"][0]["ipv4"] == "10.0.0.5"
    sel = select(data, gpus=[1])
    assert sel["nics"] == ["mlx5_1"] and sel["gid_index"] == 3
    sel = select(data, gpus=[0, 1])
    assert sel["nics"] == ["mlx5_0", "mlx5_1"] and sel["gid_index"] == 3
    assert sel["link_layer"] == "Ethernet"


def test_roce_plain_gid_type_v1():
    sel = select(facts("roce_plain"), gpus=[0], gid_type="RoCE v1")
    assert sel["gid_index"] == 2


def test_roce_never_picks_link_local_gid():
    data = facts("roce_plain")
    for dev in data["devices"]:
        dev["ports"][0]["gids"] = [g for g in dev["ports"][0]["gids"] if g["ipv4"] is None]
    with pytest.raises(FilterError) as err:
        select(data, gpus=[0])
    msg = str(err.value)
    assert "no RoCE v2 GID with an IPv4 address" in msg
    assert "GID 1: RoCE v2 fe80:" in msg  # lists what it saw


def test_gid_index_mismatch_is_refused():
    data = copy.deepcopy(facts("roce_plain"))
    for gid in data["devices"][1]["ports"][0]["gids"]:
        gid["index"] += 2
    with pytest.raises(FilterError, match="different GID indexes.*mlx5_0=3, mlx5_1=5"):
        select(data, gpus=[0, 1])


# -- roce_bond ---------------------------------------------------------------------------------
def test_roce_bond():
    data = facts("roce_bond")
    sel = select(data, gpus=[0])
    assert sel["nics"] == ["mlx5_bond_0"] and sel["netdevs"] == ["bond0"] and sel["gid_index"] == 3
    assert sel["ports"][0]["ipv4"] == "10.0.2.5"
    # GPU 1 is on the other socket: still the only NIC, affinity sys
    sel = select(data, gpus=[1])
    assert sel["nics"] == ["mlx5_bond_0"] and sel["ports"][0]["affinity"] == {1: "sys"}
    # exclude by a slave/bond netdev glob
    with pytest.raises(FilterError):
        select(data, gpus=[0], exclude=["bond*"])


# -- one_port_down -----------------------------------------------------------------------------
def test_one_port_down_explicit_refused_with_clear_message():
    with pytest.raises(FilterError) as err:
        select(facts("one_port_down"), gpus=[1], nics=["mlx5_1"], instance_name="decode-1")
    msg = str(err.value)
    assert "[instance decode-1]" in msg
    assert "explicit NIC 'mlx5_1' cannot be used: port 1 is DOWN (phys_state Disabled), not ACTIVE" in msg
    assert "mlx5_0 (pci 0000:1b:00.0, numa 0)" in msg and "port 1: DOWN/Disabled" in msg


def test_one_port_down_auto_skips_it():
    data = facts("one_port_down")
    sel = select(data, gpus=[1])
    assert sel["nics"] == ["mlx5_0"] and sel["gid_index"] == 3
    assert sel["ports"][0]["affinity"] == {1: "sys"}
    assert select(data, gpus=[0, 1])["nics"] == ["mlx5_0"]


# -- no_rdma -----------------------------------------------------------------------------------
def test_no_rdma_auto_fails_listing_what_it_saw():
    with pytest.raises(FilterError) as err:
        select(facts("no_rdma"), gpus=[0])
    msg = str(err.value)
    assert "no usable RDMA port for nics=auto" in msg
    assert "RDMA devices: none" in msg
    assert "GPUs: 0=0000:02:00.0(numa -1), 1=0000:03:00.0(numa -1)" in msg


def test_no_rdma_explicit_fails():
    with pytest.raises(FilterError, match="'mlx5_0' not found"):
        select(facts("no_rdma"), nics=["mlx5_0"])


# -- rxe_vm ------------------------------------------------------------------------------------
def test_rxe_vm():
    data = facts("rxe_vm")
    for gpus in ([], [0]):  # GPU indexes on a GPU-less lab VM carry no affinity
        sel = select(data, gpus=gpus)
        assert sel["nics"] == ["rxe0"] and sel["gid_index"] == 1 and sel["netdevs"] == ["eth0"]
    assert select(data, nics=["rxe0"])["gid_index"] == 1
    assert select(data, nics=["eth0"])["nics"] == ["rxe0"]


# -- misc --------------------------------------------------------------------------------------
def test_bad_arguments():
    with pytest.raises(FilterError, match="link_layer must be one of"):
        select(facts("rxe_vm"), link_layer="RoCE")
    with pytest.raises(FilterError, match="empty list"):
        select(facts("rxe_vm"), nics=[])


def test_describe_lists_everything():
    text = flt.rdma_describe(facts("roce_plain"))
    assert "mlx5_1 (pci 0000:9b:00.0, numa 1)" in text
    assert "GID 3: RoCE v2 0000:0000:0000:0000:0000:ffff:0a00:0105 ipv4 10.0.1.5 on ens2f0np0" in text


# -- through the role (render mode, controller reads the fake sysfs trees) ------------------------
def _ansible_playbook():
    candidate = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")
    return candidate if os.path.exists(candidate) else shutil.which("ansible-playbook")


@pytest.mark.skipif(_ansible_playbook() is None, reason="ansible-playbook not installed")
def test_role_select_sets_instance_selection(tmp_path):
    inventory = {"all": {"vars": {"mooncake_protocol": "rdma",
                                  "ansible_python_interpreter": "{{ ansible_playbook_python }}"},
                         "hosts": {
                             "dgx": {"rdma_sysfs_root": os.path.join(FIXTURES, "dgx_8gpu_8ib"),
                                     "vllm_instances": [{"name": "p0", "gpus": [3], "nics": "auto"},
                                                        {"name": "p1", "gpus": [4, 5], "nics": ["mlx5_4"]}]},
                             "roce": {"rdma_sysfs_root": os.path.join(FIXTURES, "roce_plain"),
                                      "vllm_instances": [{"name": "d0", "gpus": [0, 1], "nics": "auto"}]},
                             "vm": {"rdma_sysfs_root": os.path.join(FIXTURES, "rxe_vm"),
                                    "vllm_instances": [{"name": "p0", "gpus": [0], "nics": "auto"}]},
                             "tcp": {"mooncake_protocol": "tcp",
                                     "vllm_instances": [{"name": "p0", "gpus": [0], "nics": "auto"}]}}}}
    (tmp_path / "inv.json").write_text(json.dumps(inventory))
    (tmp_path / "play.yml").write_text(
        "- hosts: all\n  connection: local\n  gather_facts: false\n  tasks:\n"
        "    - ansible.builtin.include_role: {name: rdma, tasks_from: select}\n"
        "    - ansible.builtin.copy:\n"
        "        content: '{{ rdma_instance_selection | to_json }}'\n"
        "        dest: '" + str(tmp_path) + "/{{ inventory_hostname }}.json'\n"
        "        mode: '0644'\n")
    env = dict(os.environ, ANSIBLE_ROLES_PATH=os.path.join(REPO, "roles"),
               ANSIBLE_COLLECTIONS_PATH=os.path.join(REPO, "collections"),
               ANSIBLE_CACHE_PLUGIN="memory", ANSIBLE_NOCOLOR="1")
    proc = subprocess.run([_ansible_playbook(), "-i", str(tmp_path / "inv.json"), str(tmp_path / "play.yml"),
                           "-e", "render_dir=%s" % (tmp_path / "render")],
                          cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]

    def read(host):
        return json.loads((tmp_path / ("%s.json" % host)).read_text())

    dgx = read("dgx")
    assert dgx["p0"]["nics"] == ["mlx5_3"] and dgx["p0"]["gid_index"] is None
    assert dgx["p1"]["nics"] == ["mlx5_4"]
    assert read("roce")["d0"]["nics"] == ["mlx5_0", "mlx5_1"] and read("roce")["d0"]["gid_index"] == 3
    assert read("vm")["p0"]["nics"] == ["rxe0"] and read("vm")["p0"]["gid_index"] == 1
    assert read("tcp") == {}
