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


def _svc(*names, state="running"):
    return {n + ".service": {"state": state, "status": "enabled"} for n in names}


def test_host_rows_from_probe_results():
    r = {"host": "h1", "etcd": True, "master": True, "vllm_role": "prefill", "router": True,
         "services": _svc("etcd", "mooncake-master", "vllm@p0", "vllm-router"),
         "etcd_version": {"json": {"etcdserver": "3.5.21"}},
         "etcd_health": {"status": 200, "content": '{"health":"true","reason":""}'},
         "master_health": {"status": 200, "json": {"status": "ok", "role": "leader"}},
         "master_pip": {"mooncake-transfer-engine-non-cuda": [{"version": "0.3.13"}]},
         "master_package": "mooncake-transfer-engine-non-cuda",
         "vllm_instances": [{"name": "p0", "port": 8100, "gpus": [0], "nics": "auto"}],
         "vllm_versions": [{"json": {"version": "0.33.0"}}], "vllm_health": [{"status": 200}],
         "selection": {"p0": {"nics": ["mlx5_0"], "gid_index": 3, "ports": [{"rate_gbps": 400}, {"rate_gbps": 200}]}},
         "protocol": "rdma", "router_pip": {"vllm-router": [{"version": "0.1.9"}]},
         "router_health": {"status": 200, "json": {"prefill": {"healthy": 1, "total": 1}, "decode": {"healthy": 2, "total": 2}}}}
    rows = {row["unit"]: row for row in status.bundle_status_host_rows(r)}
    assert list(rows) == ["etcd", "mooncake-master", "vllm@p0", "vllm-router"]
    assert all(row["host"] == "h1" and row["health_ok"] for row in rows.values())
    assert rows["etcd"]["version"] == "3.5.21" and rows["mooncake-master"]["health"] == "leader"
    assert rows["mooncake-master"]["version"] == "0.3.13"
    p0 = rows["vllm@p0"]
    assert (p0["role"], p0["nics"], p0["gid_index"], p0["rate_gbps"], p0["version"]) == ("prefill", ["mlx5_0"], 3, 200, "0.33.0")
    assert rows["vllm-router"]["health"] == "ready (prefill 1/1, decode 2/2)"


def test_host_rows_say_what_failed():
    r = {"host": "h2", "etcd": True, "master": True, "vllm_role": "decode", "router": True, "services": {},
         "etcd_health": {"status": -1, "msg": "Status code was -1 and not [200]: Request failed: <urlopen error [Errno 111] "
                                                "Connection refused> " + "x" * 80},
         "master_health": {"status": 503, "json": {"status": "unavailable"}},
         "vllm_instances": [{"name": "d0", "port": 8200}], "vllm_health": [{"status": 503, "msg": "Service Unavailable"}],
         "router_health": {"status": 503}}
    rows = {row["unit"]: row for row in status.bundle_status_host_rows(r)}
    assert not any(row["health_ok"] for row in rows.values())
    assert rows["etcd"]["state"] == "absent" and rows["etcd"]["health"].startswith("unhealthy: Status code was -1")
    assert len(rows["etcd"]["health"]) <= len("unhealthy: ") + 60
    assert rows["mooncake-master"]["health"] == "unhealthy: unavailable"
    assert rows["vllm@d0"]["health"] == "health 503 Service Unavailable" and rows["vllm@d0"]["rate_gbps"] is None
    assert rows["vllm-router"]["health"] == "readiness 503"


def test_expected_units_and_unreachable_hosts():
    groups = {"all": ["e1", "p1", "r1"], "etcd": ["e1"], "mooncake_master": ["e1"], "vllm_prefill": ["p1"],
              "vllm_router": ["r1"]}
    hostvars = {"e1": {"_status_units": [{"host": "e1", "unit": "etcd"}]}, "p1": {"vllm_instances": [{"name": "a"}]},
                "r1": {}}
    expected = status.bundle_status_expected(groups, hostvars)
    assert expected == {"e1": ["etcd", "mooncake-master"], "p1": ["vllm@a"], "r1": ["vllm-router"]}
    rows = status.bundle_status_units(expected, hostvars)
    assert rows[0] == {"host": "e1", "unit": "etcd"}
    assert [(r["host"], r["unit"], r["state"]) for r in rows[1:]] == [("p1", "vllm@a", "unreachable"),
                                                                      ("r1", "vllm-router", "unreachable")]


# --- etcd's master view beside the masters' own (HA masters) ---------------------------------------------------

def ha_lab(value="10.0.0.1:50051", lease_ttl=4):
    data = green_lab()
    data["units"][1].update(address="10.0.0.1:50051", leader_address="10.0.0.1:50051")
    data["units"][2].update(address="10.0.0.2:50051", leader_address="10.0.0.1:50051")
    data["master_ha"] = True
    data["master_views"] = [None, {"host": "e1", "value": value, "lease_ttl": lease_ttl, "granted_ttl": 5, "error": None}]
    return data


def _view_line(table):
    return next(ln for ln in table.splitlines() if "Master leader:" in ln)


def test_etcd_master_view_agreeing_is_green_and_shown():
    data = ha_lab()
    assert status.bundle_status_red(data) == []
    line = _view_line(status.bundle_status_table(data))
    assert line == ("ok Master leader: masters say e1 (10.0.0.1:50051); "
                    "etcd says e1 (10.0.0.1:50051), lease TTL 4 of 5 s, read on e1")


def test_etcd_master_view_naming_another_master_is_red():
    data = ha_lab(value="10.0.0.2:50051")
    red = status.bundle_status_red(data)
    assert red == ["mooncake-master: e1 reports leader, but etcd names e2 (10.0.0.2:50051)",
                   "mooncake-master: e1 (leader) follows 10.0.0.1:50051, but etcd names 10.0.0.2:50051",
                   "mooncake-master: e2 (standby) follows 10.0.0.1:50051, but etcd names 10.0.0.2:50051"]
    table = status.bundle_status_table(data)
    assert table.splitlines()[0] == "CLUSTER lab: RED, 3 problems"
    assert _view_line(table).startswith("RED Master leader: masters say e1 (10.0.0.1:50051); etcd says e2 (10.0.0.2:50051)")


def test_etcd_master_view_without_live_lease_or_key_or_read_is_red():
    assert status.bundle_status_red(ha_lab(lease_ttl=-1)) == [
        "mooncake-master: etcd master view: 10.0.0.1:50051 has no live lease (TTL -1): it outlives its writer"]
    assert status.bundle_status_red(ha_lab(value=None)) == [
        "mooncake-master: etcd master view: no key (no master holds the leadership in etcd)"]
    data = ha_lab()
    data["master_views"] = [{"host": "e1", "error": "range -1 Connection refused"}]
    assert status.bundle_status_red(data) == ["mooncake-master: etcd master view: not read (e1: range -1 Connection refused)"]


def test_etcd_master_view_is_not_compared_without_ha():
    data = ha_lab(value="10.0.0.2:50051")
    data["master_ha"] = False
    assert status.bundle_status_red(data) == []
    assert "Master leader:" not in status.bundle_status_table(data)


def test_etcd_view_from_uri_results():
    rng = {"status": 200, "json": {"kvs": [{"key": "bW9vbmNha2Utc3RvcmUvcGQtbW9vbmNha2UvbWFzdGVyX3ZpZXc=",
                                            "value": "MTcyLjMwLjAuMTE6NTAwNTE=", "lease": "2930332852729446406"}]}}
    lease = {"status": 200, "json": {"ID": "2930332852729446406", "TTL": "4", "grantedTTL": "5"}}
    assert status.bundle_status_etcd_view({"host": "etcd1", "range": rng, "lease": lease}) == {
        "host": "etcd1", "value": "172.30.0.11:50051", "lease_ttl": 4, "granted_ttl": 5, "error": None}
    assert status.bundle_status_etcd_view({"host": "etcd1", "range": {"status": 200, "json": {"count": "0"}},
                                           "lease": {"skipped": True}})["value"] is None
    assert status.bundle_status_etcd_view({"host": "p1", "range": {"skipped": True}}) is None
    failed = status.bundle_status_etcd_view({"host": "etcd1", "range": {"status": -1, "msg": "Connection refused"}})
    assert failed["error"] == "range -1 Connection refused"


def test_master_rows_carry_their_address_and_whom_they_follow():
    r = {"host": "e2", "master": True, "services": _svc("mooncake-master"), "master_address": "10.0.0.2:50051",
         "master_health": {"status": 200, "json": {"status": "ok", "role": "standby", "leader_address": "10.0.0.1:50051"}}}
    row = status.bundle_status_host_rows(r)[0]
    assert (row["address"], row["leader_address"], row["health"]) == ("10.0.0.2:50051", "10.0.0.1:50051", "standby")


# --- GPU stack per vLLM host (bundle_status_gpu_host), over facts gpu_facts collected from FAKE trees and
# RECORDED nvidia-smi -q -x outputs (tests/unit/test_gpu_facts.py) ---

def _gpu_facts(tmp_path, smi="h100-hgx", fm="Fabric Manager version is : 580.65.06", active=True, **kw):
    from test_gpu_facts import collect, recorded
    return collect(tmp_path, recorded(smi) if smi else None, fm, active, **kw)


def _gpu_line(facts, protocol="rdma", gpudirect="peermem", host="gpu-d1", **kw):
    r = {"host": host, "platform": "cuda", "protocol": protocol, "facts": facts, "gpudirect": gpudirect,
         "load_modules": True}
    r.update(kw)
    return status.bundle_status_gpu_host(r)


def test_gpu_line_of_a_healthy_hgx_host(tmp_path):
    line = _gpu_line(_gpu_facts(tmp_path))
    assert line == {"host": "gpu-d1", "platform": "cuda", "driver": "580.65.06", "cuda": "13.0", "gpus": 8,
                    "persistence": "on", "fabric_manager": "active 580.65.06", "gpudirect": "peermem", "problems": []}
    data = dict(green_lab(), gpu_hosts=[line, status.bundle_status_gpu_host({"host": "p1", "platform": "cpu"})])
    assert status.bundle_status_red(data) == []
    table = status.bundle_status_table(data)
    assert "GPU stack per vLLM host" in table
    rows = {ln.split()[1]: ln for ln in table.splitlines() if ln.startswith(("ok ", "RED "))}
    assert rows["gpu-d1"].split() == ["ok", "gpu-d1", "cuda", "580.65.06", "13.0", "8", "on", "active", "580.65.06",
                                      "peermem"]
    # a cpu host (the lab): a short line, n/a everywhere, never red
    assert rows["p1"].split() == ["ok", "p1", "cpu"] + ["n/a"] * 6


def test_gpu_line_fabric_manager_stopped_is_red(tmp_path):
    line = _gpu_line(_gpu_facts(tmp_path, smi="h100-hgx-fm-stopped", active=False))
    assert line["fabric_manager"].startswith("inactive")
    assert len(line["problems"]) == 1 and "nvidia-fabricmanager is not active" in line["problems"][0]
    red = status.bundle_status_red(dict(green_lab(), gpu_hosts=[line]))
    assert red == ["gpu-d1: " + line["problems"][0]]
    table = status.bundle_status_table(dict(green_lab(), gpu_hosts=[line]))
    assert any(ln.split()[:2] == ["RED", "gpu-d1"] for ln in table.splitlines())


def test_gpu_line_fabric_manager_of_another_version_is_red(tmp_path):
    line = _gpu_line(_gpu_facts(tmp_path, fm="Fabric Manager version is : 570.124.06"))
    assert line["fabric_manager"] == "active 570.124.06 != driver"
    assert "does not match driver 580.65.06" in line["problems"][0]


def test_gpu_line_pcie_host_without_nvswitch_and_dmabuf(tmp_path):
    facts = _gpu_facts(tmp_path, smi="l40s-pcie", fm=None, active=None, buses=["41", "c1"], nvswitches=0)
    line = _gpu_line(facts, gpudirect="auto")
    assert (line["gpus"], line["fabric_manager"]) == (2, "n/a (no NVSwitch)")
    assert line["gpudirect"] in ("peermem", "dmabuf") and line["problems"] == []


def test_gpu_line_persistence_off_is_shown_not_red(tmp_path):
    facts = _gpu_facts(tmp_path)
    facts["smi"]["gpus"][0]["persistence_mode"] = "Disabled"
    line = _gpu_line(facts)
    assert line["persistence"] == "off on 1 of 8" and line["problems"] == []


def test_gpu_line_no_gpudirect_path_is_red(tmp_path):
    facts = _gpu_facts(tmp_path)
    facts["peermem"] = {"loaded": False, "loadable": False}
    facts["dmabuf"] = {"possible": False, "reasons": ["kernel 5.4.0 < 5.12"]}
    line = _gpu_line(facts, gpudirect="auto")
    assert line["gpudirect"] == "auto: no path"
    assert "found no GPUDirect path" in line["problems"][0]
    assert "nvidia_peermem is not loaded" in _gpu_line(facts, gpudirect="peermem")["problems"][0]


def test_gpu_line_over_tcp_and_without_facts_or_driver(tmp_path):
    assert _gpu_line(_gpu_facts(tmp_path), protocol="tcp", gpudirect="auto")["gpudirect"] == "n/a (tcp)"
    assert _gpu_line(None)["problems"] == ["GPU facts not read (gpu_facts failed)"]
    no_driver = _gpu_line(_gpu_facts(tmp_path / "bare", smi=None, fm=None, active=None, banner=None, nvswitches=0),
                          gpudirect="off")
    assert no_driver["driver"] == "none" and "no NVIDIA driver loaded" in no_driver["problems"][0]


def test_no_gpu_section_without_gpu_hosts():
    assert "GPU stack" not in status.bundle_status_table(green_lab())
