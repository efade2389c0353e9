"""Unit tests for plugins/filter/status.py (the table of playbooks/status.yml)."""

from __future__ import annotations

import copy
import importlib.util
import os

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
_spec = importlib.util.spec_from_file_location("status_filter", os.path.join(REPO, "plugins", "filter", "status.py"))
status = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(status)


def vllm_row(host, name, role, protocol="tcp", **kw):
    row = {"host": host, "unit": "vllm@" + name, "state": "running", "status": "active", "version": "0.32.0",
           "health": "serving", "health_ok": True, "role": role, "port": 8100, "gpus": [], "protocol": protocol,
           "nics": [], "gid_index": None, "rate_gbps": None}
    row.update(kw)
    return row


def green_lab():
    return {
        "name": "lab",
        "prefills": ["p1"], "decodes": ["d1", "d2"],
        "units": [
            {"host": "e1", "unit": "etcd", "state": "running", "status": "active", "version": "3.4.23",
             "health": "healthy", "health_ok": True},
            {"host": "e1", "unit": "mooncake-master", "state": "running", "status": "active", "version": "0.3.13",
             "health": "leader", "health_ok": True},
            {"host": "e2", "unit": "mooncake-master", "state": "running", "status": "active", "version": "0.3.13",
             "health": "standby", "health_ok": True},
            vllm_row("p1", "prefill0", "prefill"),
            vllm_row("d1", "decode0", "decode"),
            vllm_row("d2", "decode0", "decode"),
            {"host": "r1", "unit": "vllm-router", "state": "running", "status": "active", "version": "0.1.17",
             "health": "serving", "health_ok": True},
        ],
        "transfers": [{"source": "p1", "target": "d1", "ok": True, "gbps": 8.0},
                      {"source": "p1", "target": "d2", "ok": True, "gbps": 16.0}],
    }


def test_green_lab_is_green_and_tcp_is_not_red():
    data = green_lab()
    assert status.bundle_status_red(data) == []
    table = status.bundle_status_table(data)
    assert table.splitlines()[0] == "CLUSTER lab: GREEN"
    assert "RED" not in table
    line = next(ln for ln in table.splitlines() if "vllm@prefill0" in ln)
    assert line.split()[-3:] == ["tcp", "n/a", "n/a"]
    # 8 Gbit/s = 1 GB/s; no RDMA, so no link rate
    assert "1.00 GB/s / link n/a" in table and "2.00 GB/s / link n/a" in table


def test_stopped_unit_is_red_in_its_row():
    data = green_lab()
    data["units"][5].update(state="stopped", status="inactive", health="health -1", health_ok=False)
    red = status.bundle_status_red(data)
    assert red == ["d2: vllm@decode0 is stopped (inactive)"]
    table = status.bundle_status_table(data)
    assert table.splitlines()[0] == "CLUSTER lab: RED, 1 problem"
    row = next(ln for ln in table.splitlines() if ln.split()[1:3] == ["d2", "vllm@decode0"])
    assert row.startswith("RED") and "stopped (inactive)" in row
    others = [ln for ln in table.splitlines() if "vllm@decode0" in ln and " d1 " in ln]
    assert others and others[0].startswith("ok")


def test_failed_health_probe_is_red_even_when_running():
    data = green_lab()
    data["units"][0].update(health="unhealthy: no answer", health_ok=False)
    assert status.bundle_status_red(data) == ["e1: etcd unhealthy: unhealthy: no answer"]


def test_no_master_leader_is_red():
    data = green_lab()
    data["units"][1].update(state="failed", status="failed", health="unhealthy: no answer", health_ok=False)
    red = status.bundle_status_red(data)
    assert "mooncake-master: no healthy leader" in red
    assert "standby (no leader)" in status.bundle_status_table(data)


def test_standby_alone_without_leader_is_red():
    data = green_lab()
    data["units"] = [u for u in data["units"] if u.get("health") != "leader"]
    assert status.bundle_status_red(data) == ["mooncake-master: no healthy leader"]


def test_failed_and_missing_transfers_are_red():
    data = green_lab()
    data["transfers"] = [{"source": "p1", "target": "d1", "ok": False, "error": "sha256 mismatch"}]
    red = status.bundle_status_red(data)
    assert red == ["transfer p1 -> d1 failed: sha256 mismatch", "transfer p1 -> d2: not run"]
    table = status.bundle_status_table(data)
    assert "RED failed" in table and "RED not run" in table


def test_transfer_check_off_shows_no_matrix_and_is_not_red():
    data = green_lab()
    data["transfer_check"] = False
    data["transfers"] = []
    assert status.bundle_status_red(data) == []
    assert "not measured" in status.bundle_status_table(data)


def test_rdma_instance_shows_nics_gid_and_link_beside_the_transfer():
    data = green_lab()
    data["units"][3] = vllm_row("p1", "prefill0", "prefill", protocol="rdma", gpus=[0, 1],
                                nics=["mlx5_0", "mlx5_1"], gid_index=3, rate_gbps=400)
    data["units"][4] = vllm_row("d1", "decode0", "decode", protocol="rdma", gpus=[0], nics=["mlx5_0"],
                                gid_index=3, rate_gbps=200)
    table = status.bundle_status_table(data)
    line = next(ln for ln in table.splitlines() if "vllm@prefill0" in ln)
    assert line.split()[-5:] == ["0,1", "mlx5_0,mlx5_1", "3", "400", "Gb/s"]
    # the pair's link is the slower end: 200 Gb/s = 25 GB/s; d2 runs tcp, so no link rate
    assert "1.00 GB/s / link 25.00 GB/s" in table
    assert "2.00 GB/s / link n/a" in table


def test_unreachable_host_rows_are_red():
    data = green_lab()
    data["units"].append({"host": "r2", "unit": "vllm-router", "state": "unreachable",
                          "health": "host did not answer", "health_ok": False})
    assert status.bundle_status_red(data) == ["r2: vllm-router is unreachable"]


def test_input_is_not_modified():
    data = green_lab()
    before = copy.deepcopy(data)
    status.bundle_status_table(data)
    status.bundle_status_red(data)
    assert data == before


def test_ratio_below_floor_turns_the_cell_red():
    data = green_lab()
    data["transfers"][1].update(source_instance="prefill0", target_instance="decode0", ratio=0.31,
                                min_ratio=0.5, floor_met=False)
    red = status.bundle_status_red(data)
    assert red == ["transfer p1/prefill0 -> d2/decode0: Mooncake/raw-TCP ratio 0.31 below the floor 0.5"]
    table = status.bundle_status_table(data)
    assert table.splitlines()[0] == "CLUSTER lab: RED, 1 problem"
    assert "RED ratio 0.31 < 0.5" in table and "1.00 GB/s / link n/a" in table  # d1 stays green
    data["transfers"][1]["floor_met"] = True
    assert status.bundle_status_red(data) == []


def test_instance_pairs_of_one_host_pair_share_a_cell():
    data = green_lab()
    data["transfers"] = [
        {"source": "p1", "target": "d1", "source_instance": "prefill0", "target_instance": "decode0", "ok": True,
         "gbps": 16.0, "floor_met": True},
        {"source": "p1", "target": "d1", "source_instance": "prefill1", "target_instance": "decode0", "ok": True,
         "gbps": 8.0, "floor_met": True},
        {"source": "p1", "target": "d2", "source_instance": "prefill0", "target_instance": "decode0", "ok": True,
         "gbps": 16.0, "floor_met": True},
        {"source": "p1", "target": "d2", "source_instance": "prefill1", "target_instance": "decode0", "ok": False,
         "error": "sha256 mismatch"},
    ]
    assert status.bundle_status_red(data) == ["transfer p1/prefill1 -> d2/decode0 failed: sha256 mismatch"]
    table = status.bundle_status_table(data)
    assert "1.00 GB/s / link n/a" in table  # the slowest of the two pairs to d1
    assert "RED failed" in table
