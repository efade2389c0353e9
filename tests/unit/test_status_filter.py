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


def test_router_row_is_red_while_its_workers_differ_from_the_inventory():
    r = {"host": "r1", "router": True, "services": _svc("vllm-router"),
         "router_health": {"status": 200, "json": {"prefill": {"healthy": 1, "total": 1}, "decode": {"healthy": 2, "total": 2}}},
         "router_membership": ["r1: router lacks decode http://10.0.0.33:8200 from the inventory"]}
    row = status.bundle_status_host_rows(r)[0]
    assert not row["health_ok"]
    assert row["health"] == ("ready (prefill 1/1, decode 2/2); membership differs: "
                             "r1: router lacks decode http://10.0.0.33:8200 from the inventory")
    assert status.bundle_status_host_rows(dict(r, router_membership=[]))[0]["health_ok"]


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


# --- The entry (bundle_status_entry_host: HAProxy, keepalived, the VIP, TLS) and the monitoring host
# (bundle_status_monitoring_host), each from what its probes registered ---

STAT_HEADER = ("# pxname,svname,qcur,qmax,scur,smax,slim,stot,bin,bout,dreq,dresp,ereq,econ,eresp,wretr,wredis,status,"
               "weight,act,bck,chkfail,chkdown,lastchg,downtime,qlimit,pid,iid,sid,throttle,lbtot,tracked,type,rate,")


def _stat(*servers, extra=""):
    """HAProxy's `show stat` CSV (master CLI, @1) with one line per (server, status) of vllm_routers."""
    lines = [STAT_HEADER] + ["vllm_routers,%s,0,0,0,1,,12,0,0,,0,,0,0,0,0,%s,1,1,0,0,0,55,0,,1,4,%d,,12,,2,0,"
                             % (name, st, n) for n, (name, st) in enumerate(servers, 1)]
    return {"rc": 0, "stdout": "\n".join(lines) + extra + "\n\n"}


def _ok(stdout):
    return {"rc": 0, "stdout": stdout}


IP_ADDR = ("1: lo    inet 127.0.0.1/8 scope host lo\\       valid_lft forever preferred_lft forever\n"
           "2: eth0    inet 172.30.0.51/24 brd 172.30.0.255 scope global eth0\\       valid_lft forever\n")
IP_ADDR_VIP = IP_ADDR + "2: eth0    inet 172.30.0.50/24 scope global secondary eth0\\       valid_lft forever\n"
NOW = 1767225600  # 2026-01-01 00:00:00 UTC
CERT_365 = _ok("notAfter=Jan  1 00:00:00 2027 GMT")


def _entry(host="entry1", vip_here=True, vrrp="MASTER", keepalived="running", haproxy="running", stat=None,
           cert=CERT_365, warn_days=30, **kw):
    services = dict(_svc("haproxy", state=haproxy), **_svc("keepalived", state=keepalived))
    r = {"host": host, "services": services, "keepalived": True, "vip": "172.30.0.50",
         "ip_addr": _ok(IP_ADDR_VIP if vip_here else IP_ADDR),
         "journal": _ok("(entry_vip) Entering %s STATE" % vrrp) if vrrp else _ok(""),
         "stat": stat or _stat(("router1", "UP"), ("router2", "UP")), "cert": cert, "warn_days": warn_days, "now": NOW}
    r.update(kw)
    return status.bundle_status_entry_host(r)


def _monitoring(targets=None, am_status=200, prometheus="running", alertmanager="running"):
    active = targets if targets is not None else [
        {"labels": {"job": "node", "instance": "etcd3"}, "health": "up"},
        {"labels": {"job": "vllm", "instance": "decode2/decode0"}, "health": "up"}]
    return status.bundle_status_monitoring_host({
        "host": "etcd3", "services": dict(_svc("prometheus", state=prometheus),
                                          **_svc("prometheus-alertmanager", state=alertmanager)),
        "targets": {"status": 200, "json": {"status": "success", "data": {"activeTargets": active, "droppedTargets": []}}},
        "alertmanager": {"status": am_status, "msg": "OK" if am_status == 200 else "Status code was -1: refused"}})


def front_door(entries=None, monitoring=None):
    return dict(green_lab(), entry_vip="172.30.0.50",
                entry_hosts=entries if entries is not None else [_entry(), _entry("entry2", vip_here=False, vrrp="BACKUP")],
                monitoring_hosts=[monitoring or _monitoring()])


def _line(table, *first):
    """The table line whose first words are first ('RED', 'entry2' / 'ok', 'VIP')."""
    return next(ln for ln in table.splitlines() if ln.split()[:len(first)] == list(first))


def test_haproxy_servers_from_show_stat():
    out = _stat(("router1", "UP"), ("router2", "DOWN"), ("router3", "UP 1/2"), ("router4", "MAINT"),
                extra="\nvllm_routers,BACKEND,0,0,0,1,,12,0,0,0,0,,0,0,0,0,UP,1,1,0,,0,55,0,,1,4,0,,12,,1,0,")["stdout"]
    servers = status.bundle_status_haproxy_servers(out)
    assert [(s["backend"], s["server"], s["status"]) for s in servers] == [
        ("vllm_routers", "router1", "UP"), ("vllm_routers", "router2", "DOWN"), ("vllm_routers", "router3", "UP 1/2"),
        ("vllm_routers", "router4", "MAINT")]
    assert [status._server_up(s) for s in servers] == [True, False, True, False]
    assert status.bundle_status_haproxy_servers("") == []
    assert status.bundle_status_haproxy_servers("Unknown command: 'show stt'\n") == []


def test_cert_days_from_openssl_enddate():
    assert status.bundle_status_cert_days("notAfter=Jan  1 00:00:00 2027 GMT", NOW) == 365
    assert status.bundle_status_cert_days("notAfter=Jan 10 12:00:00 2026 GMT", NOW) == 9
    assert status.bundle_status_cert_days("notAfter=Dec 31 00:00:00 2025 GMT", NOW) == -1
    assert status.bundle_status_cert_days("unable to load certificate", NOW) is None
    assert status.bundle_status_cert_days("notAfter=Foo  1 00:00:00 2027 GMT", NOW) is None


def test_keepalived_state_is_the_last_it_entered():
    journal = ("(entry_vip) Entering BACKUP STATE (init)\n(entry_vip) Entering MASTER STATE\n"
               "(entry_vip) Entering FAULT STATE\n(entry_vip) Entering BACKUP STATE\n")
    assert status.bundle_status_keepalived_state(journal) == "BACKUP"
    assert status.bundle_status_keepalived_state("(entry_vip) Entering MASTER STATE") == "MASTER"
    assert status.bundle_status_keepalived_state("") is None


def test_front_door_green():
    data = front_door()
    assert status.bundle_status_red(data) == []
    table = status.bundle_status_table(data)
    assert table.splitlines()[0] == "CLUSTER lab: GREEN"
    assert _line(table, "ok", "VIP").split() == ["ok", "VIP", "172.30.0.50:", "on", "entry1"]
    assert _line(table, "ok", "entry1").split() == ["ok", "entry1", "running", "running", "MASTER", "held", "2/2", "up",
                                                    "365", "days"]
    assert _line(table, "ok", "entry2").split()[3:6] == ["running", "BACKUP", "-"]
    assert _line(table, "ok", "etcd3").split() == ["ok", "etcd3", "running", "2/2", "up", "running,", "healthy"]


def test_vip_on_no_host_is_red():
    data = front_door([_entry(vip_here=False, vrrp="BACKUP"), _entry("entry2", vip_here=False, vrrp="BACKUP")])
    assert status.bundle_status_red(data) == ["VIP 172.30.0.50 on no entry host"]
    assert _line(status.bundle_status_table(data), "RED", "VIP").endswith("on no entry host")


def test_vip_on_two_hosts_is_red():
    # keepalived stopped on entry2 and the VIP added there by hand (the lab test's fault)
    data = front_door([_entry(), _entry("entry2", keepalived="stopped")])
    assert status.bundle_status_red(data) == [
        "VIP 172.30.0.50 on 2 hosts: entry1, entry2 (keepalived should hold it on one)",
        "entry2: keepalived is stopped"]
    table = status.bundle_status_table(data)
    assert _line(table, "RED", "VIP").endswith("on entry1, entry2")
    assert _line(table, "RED", "entry2").split()[:5] == ["RED", "entry2", "running", "stopped", "held"]
    assert _line(table, "ok", "entry1")


def test_vip_not_read_on_an_unreachable_host():
    data = front_door([_entry(vip_here=False, vrrp="BACKUP"), {"host": "entry2", "unreachable": True,
                                                               "problems": ["host did not answer"]}])
    assert status.bundle_status_red(data) == ["VIP 172.30.0.50 on no entry host that answered (not read: entry2)",
                                              "entry2: host did not answer"]
    assert _line(status.bundle_status_table(data), "RED", "entry2").split() == ["RED", "entry2", "unreachable"]


def test_keepalived_fault_and_state_against_the_address_are_red():
    assert _entry(vrrp="FAULT", vip_here=False)["problems"] == [
        "keepalived is in FAULT state (its check of the local HAProxy fails)"]
    assert _entry(vrrp="MASTER", vip_here=False)["problems"] == ["keepalived is MASTER but the VIP is not on this host"]
    assert _entry(vrrp="BACKUP", vip_here=True)["problems"] == ["keepalived is BACKUP but this host holds the VIP"]
    # no state line left in the journal (rotated): shown as ?, not red by itself
    unknown = _entry(vrrp=None)
    assert unknown["problems"] == [] and unknown["vrrp"] is None
    assert _line(status.bundle_status_table(front_door([unknown])), "ok", "entry1").split()[3:5] == ["running", "?"]


def test_haproxy_router_down_is_red():
    e = _entry(stat=_stat(("router1", "UP"), ("router2", "DOWN")))
    assert e["problems"] == ["HAProxy server vllm_routers/router2 is DOWN"]
    data = front_door([e, _entry("entry2", vip_here=False, vrrp="BACKUP")])
    assert status.bundle_status_red(data) == ["entry1: HAProxy server vllm_routers/router2 is DOWN"]
    assert "1/2 up; down: router2" in _line(status.bundle_status_table(data), "RED", "entry1")


def test_haproxy_stopped_or_unread_or_empty_is_red():
    assert _entry(haproxy="stopped", stat={"rc": 1, "stderr": "No such file or directory"})["problems"] == [
        "haproxy is stopped"]
    assert _entry(stat={"rc": 1, "stderr": "PermissionError: [Errno 13] Permission denied"})["problems"] == [
        "HAProxy's stats (master socket) not read: PermissionError: [Errno 13] Permission denied"]
    assert _entry(stat=_ok(STAT_HEADER + "\n"))["problems"] == ["HAProxy has no servers (routers) in its stats"]


def test_tls_under_the_threshold_is_red():
    assert _entry(warn_days=365)["problems"] == []
    assert _entry(warn_days=366)["problems"] == ["TLS certificate expires in 365 days, under entry_tls_warn_days (366)"]
    data = front_door([_entry(warn_days=400), _entry("entry2", vip_here=False, vrrp="BACKUP")])
    assert status.bundle_status_red(data) == ["entry1: TLS certificate expires in 365 days, under entry_tls_warn_days (400)"]
    assert _line(status.bundle_status_table(data), "RED", "entry1").endswith("365 days")
    expired = _entry(cert=_ok("notAfter=Dec 29 00:00:00 2025 GMT"))
    assert expired["problems"] == ["TLS certificate expired 3 days ago"]
    unread = _entry(cert={"rc": 1, "stderr": "Could not open file or uri for loading certificate"})
    assert unread["problems"] == ["TLS certificate not read: Could not open file or uri for loading certificate"]


def test_one_entry_host_has_no_keepalived_and_no_vip():
    r = {"host": "entry1", "services": _svc("haproxy"), "keepalived": False, "vip": "",
         "stat": _stat(("router1", "UP")), "cert": CERT_365, "warn_days": 30, "now": NOW}
    e = status.bundle_status_entry_host(r)
    assert e["problems"] == [] and e["keepalived"] is None
    data = dict(green_lab(), entry_vip="", entry_hosts=[e])
    assert status.bundle_status_red(data) == []
    table = status.bundle_status_table(data)
    assert " VIP " not in table.split("Entry", 1)[1].split("\n", 2)[2]
    assert _line(table, "ok", "entry1").split()[3:8] == ["n/a", "(one", "entry", "host)", "n/a"]


def test_prometheus_target_down_is_red():
    targets = [{"labels": {"job": "node", "instance": "etcd3"}, "health": "up"},
               {"labels": {"job": "vllm", "instance": "decode2/decode0"}, "health": "down"},
               {"labels": {"job": "vllm_router", "instance": "router2"}, "health": "unknown"}]
    m = _monitoring(targets)
    assert (m["targets_up"], m["targets_total"], m["targets_down"]) == (1, 3, ["vllm/decode2/decode0"])
    data = front_door(monitoring=m)
    assert status.bundle_status_red(data) == ["etcd3: Prometheus targets 1/3 up; down: vllm/decode2/decode0"]
    assert "1/3 up; down: vllm/decode2/decode0" in _line(status.bundle_status_table(data), "RED", "etcd3")
    assert _monitoring([])["problems"] == ["Prometheus has no scrape targets"]


def test_prometheus_stopped_or_unread_is_red():
    assert _monitoring(prometheus="stopped")["problems"] == ["prometheus is stopped"]
    m = status.bundle_status_monitoring_host({"host": "etcd3", "services": _svc("prometheus", "prometheus-alertmanager"),
                                              "targets": {"status": -1, "msg": "Connection refused"},
                                              "alertmanager": {"status": 200}})
    assert m["problems"] == ["Prometheus' targets not read: -1 Connection refused"]
    assert "not read" in _line(status.bundle_status_table(front_door(monitoring=m)), "RED", "etcd3")


def test_alertmanager_stopped_or_unhealthy_is_red():
    m = _monitoring(alertmanager="stopped", am_status=-1)
    assert m["problems"] == ["prometheus-alertmanager is stopped"]
    data = front_door(monitoring=m)
    assert status.bundle_status_red(data) == ["etcd3: prometheus-alertmanager is stopped"]
    assert _line(status.bundle_status_table(data), "RED", "etcd3").endswith("stopped")
    assert _monitoring(am_status=503)["problems"] == ["Alertmanager /-/healthy: 503 Status code was -1: refused"]


def test_reported_lines_and_unreachable_ones():
    hostvars = {"entry1": {"_status_entry": {"host": "entry1", "problems": []}}, "entry2": {}}
    assert status.bundle_status_reported(["entry1", "entry2"], hostvars, "_status_entry") == [
        {"host": "entry1", "problems": []}, {"host": "entry2", "unreachable": True, "problems": ["host did not answer"]}]


def test_no_entry_or_monitoring_section_without_those_hosts():
    table = status.bundle_status_table(green_lab())
    assert "Entry (" not in table and "Monitoring (" not in table


def test_store_ssd_client_row_and_expected_unit():
    base = {"host": "p1", "vllm_role": None, "store_ssd": True, "services": _svc("mooncake-store-client"),
            "master_pip": {"mooncake-transfer-engine-non-cuda": [{"version": "0.3.13"}]},
            "master_package": "mooncake-transfer-engine-non-cuda",
            "store_ssd_health": {"status": 200, "json": {"status": "healthy", "code": 0}}}
    row = status.bundle_status_host_rows(base)[0]
    assert (row["unit"], row["health"], row["health_ok"], row["version"]) == (
        "mooncake-store-client", "healthy", True, "0.3.13")
    down = status.bundle_status_host_rows(dict(base, services={}, store_ssd_health={"status": -1, "msg": "refused"}))[0]
    assert not down["health_ok"] and down["state"] == "absent" and down["health"] == "unhealthy: refused"
    # expected only where the store tier runs the SSD client
    groups = {"all": ["m1", "p1", "d1"], "mooncake_master": ["m1"], "vllm_prefill": ["p1"], "vllm_decode": ["d1"]}
    hostvars = {"m1": {}, "p1": {"vllm_instances": [{"name": "a"}], "vllm_store_tier": True, "vllm_store_ssd": True},
                "d1": {"vllm_instances": [{"name": "b"}], "vllm_store_ssd": True}}
    expected = status.bundle_status_expected(groups, hostvars)
    assert expected["p1"] == ["vllm@a", "mooncake-store-client"] and expected["d1"] == ["vllm@b"]
    hostvars["p1"]["vllm_store_tier"] = False
    assert status.bundle_status_expected(groups, hostvars)["p1"] == ["vllm@a"]


def test_store_ssd_unit_name_is_the_vllm_roles():
    import yaml
    from pathlib import Path
    roles_vars = yaml.safe_load((Path(__file__).resolve().parents[2] / "roles" / "vllm" / "vars" / "main.yml").read_text())
    assert status.STORE_SSD_UNIT == roles_vars["_vllm_store_ssd_unit"]


def two_pools_lab():
    """Model pools (vllm_pools): chat on p1/prefill0, d1 and r1; fast on p1/prefill1, d2 and r2 (p1 serves both)."""
    data = green_lab()
    data["units"][3:3] = [vllm_row("p1", "prefill1", "prefill")]
    data["units"].append({"host": "r2", "unit": "vllm-router", "state": "running", "status": "active",
                          "version": "0.1.17", "health": "serving", "health_ok": True})
    data["pools"] = [
        {"name": "chat", "implicit": False, "prefill": [["p1", "prefill0"]], "decode": [["d1", "decode0"]],
         "routers": ["r1"]},
        {"name": "fast", "implicit": False, "prefill": [["p1", "prefill1"]], "decode": [["d2", "decode0"]],
         "routers": ["r2"]},
    ]
    data["transfers"] = [
        {"source": "p1", "target": "d1", "source_instance": "prefill0", "target_instance": "decode0", "ok": True,
         "gbps": 8.0},
        {"source": "p1", "target": "d2", "source_instance": "prefill1", "target_instance": "decode0", "ok": True,
         "gbps": 16.0},
    ]
    return data


def test_with_pools_rows_are_grouped_by_pool_and_each_pool_has_its_matrix():
    data = two_pools_lab()
    assert status.bundle_status_red(data) == []  # the cross-pool pairs are not measured, and not missing
    lines = status.bundle_status_table(data).splitlines()
    assert lines[0] == "CLUSTER lab: GREEN"
    assert lines[1].split()[:3] == ["pool", "host", "unit"]
    rows = [ln.split()[1:4] for ln in lines[3:3 + len(data["units"])]]
    assert rows == [["-", "e1", "etcd"], ["-", "e1", "mooncake-master"], ["-", "e2", "mooncake-master"],
                    ["chat", "p1", "vllm@prefill0"], ["chat", "d1", "vllm@decode0"], ["chat", "r1", "vllm-router"],
                    ["fast", "p1", "vllm@prefill1"], ["fast", "d2", "vllm@decode0"], ["fast", "r2", "vllm-router"]]
    chat, fast = lines.index("pool chat"), lines.index("pool fast")
    assert lines[chat + 1].split() == ["prefill", "\\", "decode", "d1"]
    assert lines[chat + 3].split()[:3] == ["p1", "1.00", "GB/s"]
    assert lines[fast + 1].split() == ["prefill", "\\", "decode", "d2"]
    assert lines[fast + 3].split()[:3] == ["p1", "2.00", "GB/s"]
    assert "RED" not in "\n".join(lines)


def test_with_pools_a_pool_pair_failed_or_missing_is_red_and_another_pools_pair_is_not_its():
    data = two_pools_lab()
    # A result of fast's pair p1/prefill1 -> d2 does not stand in for chat, nor a stray cross-pool one.
    data["transfers"][0].update(ok=False, error="timeout")
    data["transfers"].append({"source": "p1", "target": "d1", "source_instance": "prefill1",
                              "target_instance": "decode0", "ok": True, "gbps": 99.0})
    assert status.bundle_status_red(data) == ["transfer p1/prefill0 -> d1/decode0 failed: timeout"]
    del data["transfers"][0]
    assert status.bundle_status_red(data) == ["transfer p1 -> d1: not run"]
    table = status.bundle_status_table(data)
    assert "RED not run" in table and "12.38 GB/s" not in table


def test_the_implicit_pool_renders_the_table_as_without_pools():
    data = green_lab()
    before = status.bundle_status_table(copy.deepcopy(data))
    data["pools"] = [{"name": "default", "implicit": True, "prefill": [["p1", "prefill0"]],
                      "decode": [["d1", "decode0"], ["d2", "decode0"]], "routers": ["r1"]}]
    assert status.bundle_status_table(data) == before
    assert status.bundle_status_red(data) == []


def canary_state(pool="default", **history):
    """A router's PD canary state: history per 'prefill|decode' key (plugins/tools/pd_canary.py)."""
    return {"pool": pool, "failures": 3, "history": {k.replace("__", "|").replace("_", "/"): v for k, v in history.items()}}


def test_the_canary_shows_in_each_cell_and_a_broken_pair_is_red_only_on_every_router():
    data = green_lab()
    ok = ["pass", "pass"]
    data["canary"] = [canary_state(p1_prefill0__d1_decode0=ok, p1_prefill0__d2_decode0=["pass", "fail", "fail", "fail"]),
                      canary_state(p1_prefill0__d1_decode0=ok, p1_prefill0__d2_decode0=["fail"] * 3)]
    red = status.bundle_status_red(data)
    assert red == ["canary p1/prefill0 -> d2/decode0: failed 3 times in a row on every router host (PDPairBroken)"]
    table = status.bundle_status_table(data)
    assert "1.00 GB/s / link n/a | canary 1/1 ok" in table
    assert "canary broken (p1/prefill0 -> d2/decode0)" in table
    # one router host still passes through the pair: a router cut off from it, not a broken pair
    data["canary"][1]["history"]["p1/prefill0|d2/decode0"] = ["fail", "pass"]
    assert status.bundle_status_red(data) == []
    assert "canary broken" not in status.bundle_status_table(data)


def test_the_canary_shows_when_the_transfer_check_is_off_and_without_it_nothing_changes():
    data = green_lab()
    data["transfer_check"] = False
    data["transfers"] = []
    data["canary"] = [canary_state(p1_prefill0__d1_decode0=["pass"], p1_prefill0__d2_decode0=["pass"])]
    table = status.bundle_status_table(data)
    assert "not measured" in table and "canary 1/1 ok" in table and "GB/s" not in table
    assert "canary" not in status.bundle_status_table(green_lab())


def test_an_instance_the_canary_holds_out_of_rotation_is_red():
    data = green_lab()
    ok = ["pass", "pass"]
    state = canary_state(p1_prefill0__d1_decode0=ok)
    state["ejected"] = {"out": {"d1/decode0": {"since": 3600, "why": "decode d1/decode0 fails with every peer"}}}
    data["canary"] = [state]
    assert status.bundle_status_red(data) == [
        "d1/decode0: out of every router's rotation since 01:00:00 (the canary ejected it: decode d1/decode0 fails "
        "with every peer)"]
    state["ejected"]["out"] = {}
    assert status.bundle_status_red(data) == []
