"""Unit tests for plugins/filter/bundle.py (pure functions; no ansible needed)."""
import importlib.util
import os

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
_spec = importlib.util.spec_from_file_location("bundle_filter", os.path.join(REPO, "plugins", "filter", "bundle.py"))
bf = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bf)

INSTANCES = [{"name": "p0", "port": 8100, "gpus": [0, 1]}, {"name": "p1", "port": 8200},
             {"name": "p2", "port": 8300, "tensor_parallel_size": 4, "gpus": [0]},
             {"name": "p3", "port": 8400, "side_channel_port": 19000, "gpus": [2, 3]}]


@pytest.mark.parametrize("inst,tp", [(INSTANCES[0], 2), (INSTANCES[1], 1), (INSTANCES[2], 4), ({}, 1),
                                     ({"gpus": []}, 1)])
def test_tp_is_explicit_else_one_per_gpu(inst, tp):
    assert bf.vllm_tp(inst) == tp


def test_side_channel_ports_from_base_by_index_one_per_rank():
    assert bf.vllm_side_channel_ports(INSTANCES[0], INSTANCES, 18100) == [18100, 18101]
    assert bf.vllm_side_channel_ports(INSTANCES[1], INSTANCES, "18100") == [18116]
    assert bf.vllm_side_channel_ports(INSTANCES[2], INSTANCES, 18100) == [18132, 18133, 18134, 18135]


def test_side_channel_port_given_wins_over_base():
    assert bf.vllm_side_channel_ports(INSTANCES[3], INSTANCES, 18100) == [19000, 19001]


@pytest.mark.parametrize("value,bytes_", [("4gb", 4 << 30), ("512MiB", 512 << 20), (1024, 1024), ("1 GB", 1 << 30)])
def test_size_bytes(value, bytes_):
    assert bf.size_bytes(value) == bytes_


@pytest.mark.parametrize("value", ["4 parsecs", 0, -1, True, "", "gb"])
def test_size_bytes_refuses(value):
    with pytest.raises(bf.AnsibleFilterError):
        bf.size_bytes(value)


def _check_hostvars():
    return {
        "p1": {"common_host_ip": "10.0.0.1", "vllm_instances": [{"name": "prefill0"}, {"name": "prefill1", "host_ip": "10.1.0.1"}],
               "rdma_instance_selection": {"prefill0": {"nics": ["mlx5_0", "mlx5_1"], "gid_index": 3},
                                           "prefill1": {"nics": ["mlx5_2"], "gid_index": None}}},
        "d1": {"common_host_ip": "10.0.0.2", "vllm_instances": [{"name": "decode0", "nics": ["mlx5_4"], "gid_index": 1}],
               "mooncake_check_device": "mlx5_9"},
        "d2": {"ansible_host": "10.0.0.3", "vllm_instances": [{"name": "decode0", "nics": "auto"}],
               "mooncake_check_device": "mlx5_0,mlx5_1"},
    }


def test_check_pairs_every_instance_pair_as_the_instances_run_the_engine():
    pairs = bf.mooncake_check_pairs(["d1", "d2"], "p1", _check_hostvars(), "rdma")
    assert [(p["source"]["instance"], p["target"]["host"], p["target"]["instance"]) for p in pairs] == [
        ("prefill0", "d1", "decode0"), ("prefill0", "d2", "decode0"),
        ("prefill1", "d1", "decode0"), ("prefill1", "d2", "decode0")]
    src0, src1 = pairs[0]["source"], pairs[2]["source"]
    # the rdma role's selection: NICs and GID index, as instance.env.j2 writes MC_TE_FILTERS / MC_GID_INDEX
    # (no instance lists GPUs: host memory, the tool's own interpreter)
    assert src0 == {"host": "p1", "instance": "prefill0", "ip": "10.0.0.1", "device": "mlx5_0,mlx5_1", "gid_index": 3,
                    "env": {"MC_TE_FILTERS": "mlx5_0,mlx5_1", "MC_GID_INDEX": "3"},
                    "memory": "host", "gpu": None, "python": None}
    # InfiniBand (gid_index None): no MC_GID_INDEX; the instance's own host_ip
    assert (src1["ip"], src1["device"], src1["env"]) == ("10.1.0.1", "mlx5_2", {"MC_TE_FILTERS": "mlx5_2"})
    # no selection: the instance's own nics/gid_index, else (nics auto) the host's mooncake_check_device
    assert pairs[0]["target"]["env"] == {"MC_TE_FILTERS": "mlx5_4", "MC_GID_INDEX": "1"}
    assert (pairs[1]["target"]["ip"], pairs[1]["target"]["device"], pairs[1]["target"]["gid_index"]) == (
        "10.0.0.3", "mlx5_0,mlx5_1", None)


def test_check_pairs_over_tcp_carry_no_nics_or_gid():
    pairs = bf.mooncake_check_pairs(["d1"], "p1", _check_hostvars(), "tcp")
    assert len(pairs) == 2
    assert all(p[end]["device"] == "" and p[end]["env"] == {} and p[end]["gid_index"] is None
               for p in pairs for end in ("source", "target"))


def test_check_pairs_host_without_instances_is_still_checked():
    hv = {"p": {"common_host_ip": "10.0.0.1"}, "d": {"common_host_ip": "10.0.0.2"}}
    (pair,) = bf.mooncake_check_pairs(["d"], "p", hv, "tcp")
    assert (pair["source"]["instance"], pair["target"]["ip"]) == (None, "10.0.0.2")


def _gpu_hostvars(platform="cuda", **extra):
    inst = {"name": "prefill0", "gpus": [4, 5], "nics": ["mlx5_4"], "gid_index": 3}
    dec = {"name": "decode0", "gpus": [0, 1, 2, 3], "nics": ["mlx5_0"], "gid_index": 3}
    base = {"vllm_platform": platform, "rdma_gpudirect": "peermem"}
    return {"p": dict(base, common_host_ip="10.0.0.1", vllm_instances=[inst], **extra),
            "d": dict(base, common_host_ip="10.0.0.2", vllm_instances=[dec], **extra)}


@pytest.mark.parametrize("setting,platform,inst,memory", [
    ("auto", "cuda", {"gpus": [2]}, "cuda"),
    ("auto", "cuda", {"gpus": []}, "host"),  # the RDMA lab's GPU-less VMs (vllm_platform left at cuda)
    ("auto", "cpu", {"gpus": [0]}, "host"),  # the CPU lab
    (None, "cuda", {"gpus": [0]}, "cuda"),
    ("host", "cuda", {"gpus": [0]}, "host"),
    ("CUDA", "cpu", {}, "cuda"),
])
def test_check_memory_selection(setting, platform, inst, memory):
    assert bf.check_memory(setting, platform, inst) == memory


def test_check_memory_refuses_other_kinds():
    with pytest.raises(bf.AnsibleFilterError, match="mooncake_check_memory='vram'"):
        bf.check_memory("vram", "cuda", {"gpus": [0]})


def test_check_pairs_on_cuda_move_gpu_memory_of_the_first_gpu_with_the_instances_gpudirect_flag():
    (pair,) = bf.mooncake_check_pairs(["d"], "p", _gpu_hostvars(), "rdma")
    src, dst = pair["source"], pair["target"]
    assert (src["memory"], src["gpu"], dst["memory"], dst["gpu"]) == ("cuda", 4, "cuda", 0)
    # torch and the CUDA wheel: the vLLM venv (the vllm role's default vllm_venv)
    assert src["python"] == bf.host_cfg("p", _gpu_hostvars())["vllm_venv"] + "/bin/python"
    assert src["env"] == {"MC_TE_FILTERS": "mlx5_4", "MC_GID_INDEX": "3", "WITH_NVIDIA_PEERMEM": "1"}


@pytest.mark.parametrize("extra,flag", [
    ({"rdma_gpudirect": "dmabuf"}, "0"),
    ({"rdma_gpudirect": "off"}, "0"),
    # the rdma role's resolved mode of this run wins over the setting
    ({"rdma_gpudirect": "auto", "rdma_gpudirect_mode": "dmabuf"}, "0"),
    # auto without the role: decided from this run's GPU facts, as the rdma role decides it
    ({"rdma_gpudirect": "auto", "ansible_facts": {"gpu": {"peermem": {"loaded": True}}}}, "1"),
    ({"rdma_gpudirect": "auto", "ansible_facts": {"gpu": {"peermem": {}, "dmabuf": {"possible": True}}}}, "0"),
    ({"vllm_gpudirect_rdma": "peermem", "rdma_gpudirect": "off"}, "1"),
])
def test_check_end_gpudirect_flag_follows_the_mode(extra, flag):
    (pair,) = bf.mooncake_check_pairs(["d"], "p", _gpu_hostvars(**extra), "rdma")
    assert pair["source"]["env"]["WITH_NVIDIA_PEERMEM"] == flag


def test_check_end_auto_gpudirect_without_facts_is_refused_naming_the_host():
    with pytest.raises(bf.AnsibleFilterError, match="transfer check on p: rdma_gpudirect='auto' is not resolved"):
        bf.mooncake_check_pairs(["d"], "p", _gpu_hostvars(rdma_gpudirect="auto"), "rdma")


def test_check_pairs_on_cuda_over_tcp_still_move_gpu_memory_without_gpudirect():
    (pair,) = bf.mooncake_check_pairs(["d"], "p", _gpu_hostvars(rdma_gpudirect="auto"), "tcp")
    assert pair["source"]["memory"] == "cuda" and pair["source"]["env"] == {"WITH_NVIDIA_PEERMEM": "0"}


def test_check_pairs_on_cpu_are_unchanged_host_memory():
    (pair,) = bf.mooncake_check_pairs(["d"], "p", _gpu_hostvars("cpu"), "tcp")
    assert all((pair[e]["memory"], pair[e]["gpu"], pair[e]["python"], pair[e]["env"]) == ("host", None, None, {})
               for e in ("source", "target"))


_OPTS = {"tool": "/opt/mooncake/bin/mooncake-check", "protocol": "rdma", "size": "64MiB", "port": 18800,
         "duration": 4, "min_ratio": 0.5}


def test_check_argv_host_memory_is_the_tools_own_command_line():
    end = {"ip": "10.0.0.2", "device": "mlx5_0", "memory": "host", "gpu": None, "python": None}
    assert bf.mooncake_check_argv(end, "serve", _OPTS) == [
        "/opt/mooncake/bin/mooncake-check", "serve", "--host-ip=10.0.0.2", "--protocol=rdma", "--device=mlx5_0",
        "--size=64MiB", "--control-port=18800", "--timeout=300"]
    assert bf.mooncake_check_argv(dict(end, ip="10.0.0.1"), "probe", dict(_OPTS, target="10.0.0.2")) == [
        "/opt/mooncake/bin/mooncake-check", "probe", "--json", "--host-ip=10.0.0.1", "--protocol=rdma",
        "--device=mlx5_0", "--target=10.0.0.2", "--control-port=18800", "--size=64MiB", "--duration=4",
        "--min-ratio=0.5"]


def test_check_argv_gpu_memory_runs_with_the_vllm_python_on_the_instances_gpu():
    (pair,) = bf.mooncake_check_pairs(["d"], "p", _gpu_hostvars(), "rdma")
    serve = bf.mooncake_check_argv(pair["target"], "serve", _OPTS)
    probe = bf.mooncake_check_argv(pair["source"], "probe", dict(_OPTS, target=pair["target"]["ip"]))
    assert serve[:3] == [pair["target"]["python"], "/opt/mooncake/bin/mooncake-check", "serve"]
    assert serve[-2:] == ["--memory=cuda", "--gpu=0"] and probe[-2:] == ["--memory=cuda", "--gpu=4"]
    assert "--device=mlx5_4" in probe and "--target=10.0.0.2" in probe


def test_check_argv_refuses_another_action():
    with pytest.raises(bf.AnsibleFilterError):
        bf.mooncake_check_argv({"ip": "x", "device": ""}, "store", _OPTS)


def test_vllm_engine_nics_selection_first_then_the_instance():
    inst = {"name": "prefill0", "nics": ["mlx5_9"], "gid_index": 5}
    sel = {"prefill0": {"nics": ["mlx5_0", "mlx5_1"], "gid_index": 3}}
    assert bf.vllm_engine_nics(inst, sel) == {"nics": ["mlx5_0", "mlx5_1"], "gid_index": 3}
    assert bf.vllm_engine_nics(inst, {}) == {"nics": ["mlx5_9"], "gid_index": 5}
    assert bf.vllm_engine_nics(inst, None) == {"nics": ["mlx5_9"], "gid_index": 5}
    # 'auto' not resolved by a selection is no NIC list; a selection's gid_index 0 is kept.
    assert bf.vllm_engine_nics({"name": "d", "nics": "auto"}, {"d": {"gid_index": 0}}) == {"nics": [], "gid_index": 0}


@pytest.mark.parametrize("setting,masters,want", [
    ("auto", ["m1"], False), ("auto", ["m1", "m2"], True), ("auto", [], False),
    (True, ["m1"], True), ("false", ["m1", "m2"], False), ("yes", ["m1"], True)])
def test_master_ha(setting, masters, want):
    assert bf.master_ha(setting, masters) is want


def test_master_ha_refuses_a_non_boolean():
    with pytest.raises(bf.AnsibleFilterError):
        bf.master_ha("sometimes", ["m1", "m2"])


@pytest.mark.parametrize("setting,ha,want", [
    ("auto", True, "etcd"), ("auto", False, "http"), ("http", True, "http"), ("etcd", False, "etcd")])
def test_metadata_backend(setting, ha, want):
    assert bf.metadata_backend(setting, ha) == want


def test_vllm_endpoints_one_definition_of_an_instance_address():
    hv = {"p1": {"ansible_host": "10.0.0.1", "vllm_default_bootstrap_port": 9000,
                 "vllm_instances": [{"name": "a", "port": 8100}, {"name": "b", "port": 8101, "bootstrap_port": 9001,
                                                                  "host_ip": "10.9.0.1", "engine_id": "e-b"}]},
          "d1": {"common_host_ip": "10.0.1.1", "vllm_instances": [{"name": "c", "port": 8200}]},
          "x1": {"_cfg": {"vllm_instances": [{"name": "z", "port": 1}]}}}
    got = bf.vllm_endpoints(["p1", "d1"], hv, default_bootstrap_port=8998)
    assert [(e["host"], e["url"], e["bootstrap_port"], e["engine_id"]) for e in got] == [
        ("p1", "http://10.0.0.1:8100", 9000, "p1-a"), ("p1", "http://10.9.0.1:8101", 9001, "e-b"),
        ("d1", "http://10.0.1.1:8200", 8998, "d1-c")]
    assert bf.vllm_endpoints(["x1"], hv, "_cfg")[0]["url"] == "http://x1:1"  # settings from a sub-dict
    assert bf.vllm_endpoints([], hv) == []


def _router_cfg(**kw):
    cfg = {"kv_connector": "mooncake", "host": "10.0.0.9", "port": 8000, "prefill_policy": "power_of_two",
           "decode_policy": "power_of_two", "prometheus_host": "10.0.0.9", "prometheus_port": 29000,
           "max_concurrent_requests": 0, "health_check_interval_secs": 2, "health_failure_threshold": 2,
           "health_success_threshold": 1, "request_timeout_secs": 0, "extra_args": []}
    cfg.update(kw)
    return cfg


def test_router_argv():
    argv = bf.router_argv(_router_cfg(), [{"url": "http://p:8100", "bootstrap_port": 8998}], ["http://d:8200"])
    assert argv[:9] == ["--vllm-pd-disaggregation", "--kv-connector", "mooncake", "--prefill", "http://p:8100", "8998",
                        "--decode", "http://d:8200", "--host"]
    assert "--max-concurrent-requests" not in argv and "--request-timeout-secs" not in argv
    argv = bf.router_argv(_router_cfg(kv_connector="nixl", max_concurrent_requests=64, request_timeout_secs=600,
                                      extra_args=["--log-level", "debug"]),
                          [{"url": "http://p:8100", "bootstrap_port": 8998}], [])
    assert argv[3:5] == ["--prefill", "http://p:8100"] and argv[5] == "--host"  # no bootstrap port with nixl
    assert argv[argv.index("--max-concurrent-requests") + 1] == "64"
    assert argv[argv.index("--request-timeout-secs") + 1] == "600" and argv[-2:] == ["--log-level", "debug"]


_LISTEN_CFG = {"etcd_client_port": 2379, "etcd_peer_port": 2380, "etcd_metrics_port": 2381, "etcd_mooncake_client_port": 2479, "etcd_tls_enabled": True,
               "mooncake_master_rpc_port": 50051, "mooncake_master_metrics_port": 9003,
               "mooncake_master_http_metadata_server": True, "mooncake_master_http_metadata_port": 8080,
               "mooncake_rpc_port_min": 15000, "mooncake_rpc_port_max": 17000, "mooncake_check_port": 18800,
               "vllm_default_bootstrap_port": 8998, "vllm_side_channel_port_base": 18100,
               "vllm_instances": [{"name": "p0", "port": 8100, "tensor_parallel_size": 2}, {"name": "p1", "port": 8101,
                                                                                            "bootstrap_port": 8999}],
               "vllm_router_port": 8000, "vllm_router_prometheus_port": 29000}


def test_host_listeners_one_table_for_firewall_and_preflight():
    ls = bf.host_listeners(_LISTEN_CFG, {"etcd": True, "master": True, "prefill": True, "router": True})
    specs = [e["spec"] for e in ls]
    assert specs == ["2379", "2380", "2381", "2479", "50051", "9003", "8080", "15000-17000", "18800", "8100", "8998", "8101", "8999",
                     "18100-18101", "18116", "8000", "29000"]
    assert [e["spec"] for e in ls if e["public"]] == ["8000"]
    table = bf.listener_port_table(ls)
    assert [15000, "mooncake_rpc_port_min..mooncake_rpc_port_max"] not in table  # the range is checked apart
    assert [8998, "vllm_instances[p0].bootstrap_port (vllm_default_bootstrap_port)"] in table
    assert [18101, "vllm_instances[p0].side_channel_port + 1 (vllm_side_channel_port_base)"] in table
    # A decode host: no bootstrap or side-channel ports; no plain etcd listener without etcd TLS.
    ls = bf.host_listeners(dict(_LISTEN_CFG, etcd_tls_enabled=False), {"etcd": True, "decode": True})
    assert [e["spec"] for e in ls] == ["2379", "2380", "2381", "15000-17000", "18800", "8100", "8101"]


# Who may connect to each port, written out here (not read from bundle.py): metrics ports take monitoring,
# the API the routers, KV ports the prefill/decode hosts, etcd's plain listener Mooncake's etcd clients only.
WANT_SOURCES = {
    "2379": ["etcd"], "2380": ["etcd"], "2381": ["monitoring"], "2479": ["master", "store_clients"],
    "50051": ["store_clients"], "9003": ["monitoring"], "8080": ["store_clients"],
    "15000-17000": ["prefill", "decode"], "18800": ["prefill", "decode"],
    "8100": ["router", "monitoring"], "8101": ["router", "monitoring"],
    "8998": ["prefill", "decode", "router"], "8999": ["prefill", "decode", "router"], "18100-18101": ["prefill", "decode"],
    "18116": ["prefill", "decode"], "8000": ["any"], "29000": ["monitoring"],
}


def source_problems(listeners, want):
    """[spec: got != want] for every listener whose sources differ from want (order does not matter)."""
    return ["%s: %s != %s" % (e["spec"], sorted(e["sources"]), sorted(want.get(e["spec"], ["?"])))
            for e in listeners if sorted(e["sources"]) != sorted(want.get(e["spec"], ["?"]))]


def test_host_listeners_sources_per_port():
    ls = bf.host_listeners(_LISTEN_CFG, {"etcd": True, "master": True, "prefill": True, "router": True})
    assert source_problems(ls, WANT_SOURCES) == []
    assert all(set(e["sources"]) <= set(bf.SOURCE_CLASSES) for e in ls)
    # Monitoring reaches the metrics ports only: etcd's metrics listener, the master's, the router's and the
    # instances' (/metrics).
    assert [e["spec"] for e in ls if "monitoring" in e["sources"]] == ["2381", "9003", "8100", "8101", "29000"]
    assert [e["spec"] for e in ls if "any" in e["sources"]] == [e["spec"] for e in ls if e["public"]] == ["8000"]


def test_a_wrong_source_is_caught():
    """The per-port comparison above fails when one port takes one class too many (monitoring on etcd's
    plain listener: the issue's bypass) or one too few."""
    ls = bf.host_listeners(_LISTEN_CFG, {"etcd": True, "master": True, "prefill": True, "router": True})
    wrong = [dict(e, sources=e["sources"] + ["monitoring"]) if e["spec"] == "2479" else e for e in ls]
    assert source_problems(wrong, WANT_SOURCES) == ["2479: ['master', 'monitoring', 'store_clients'] != "
                                                    "['master', 'store_clients']"]
    short = [dict(e, sources=["router"]) if e["spec"] == "8100" else e for e in ls]
    assert source_problems(short, WANT_SOURCES) == ["8100: ['router'] != ['monitoring', 'router']"]
    # The plan the template writes follows the listeners: the wrong table would open 2479 to monitoring.
    plan = bf.firewall_plan(wrong, {"monitoring": ["10.10.9.0/24"]})
    assert "2479" in next(c for c in plan["classes"] if c["name"] == "monitoring")["ports"]


def test_host_listeners_sources_follow_etcd_tls_and_the_entry():
    # Without etcd TLS Mooncake's etcd clients use the client port (there is no plain listener).
    ls = bf.host_listeners(dict(_LISTEN_CFG, etcd_tls_enabled=False), {"etcd": True})
    assert [(e["spec"], e["sources"]) for e in ls] == [("2379", ["etcd", "master", "store_clients"]), ("2380", ["etcd"]),
                                                   ("2381", ["monitoring"])]
    # Behind an entry the router's client port takes the entry hosts only; the entry's check port is loopback only.
    ls = bf.host_listeners(_LISTEN_CFG, {"router": True, "behind_entry": True})
    assert [(e["spec"], e["sources"], e["entry_only"], e["public"]) for e in ls] == [
        ("8000", ["entry"], True, False), ("29000", ["monitoring"], False, False)]
    ls = bf.host_listeners(dict(entry_port=443, entry_check_port=8404), {"entry": True})
    assert [(e["spec"], e["sources"]) for e in ls] == [("443", ["any"]), ("8404", [])]


_FW_GROUPS = {"etcd": ["c1", "c2", "c3"], "mooncake_master": ["c1", "c2"], "vllm_prefill": ["p1", "p2"],
              "vllm_decode": ["d1"], "vllm_router": ["r1"], "entry": []}
_FW_HV = {"c1": {"common_host_ip": "10.0.0.1"}, "c2": {"common_host_ip": "10.0.0.2"}, "c3": {"ansible_host": "10.0.0.3"},
          "p1": {"common_host_ip": "10.0.1.1", "vllm_instances": [{"name": "a", "host_ip": "10.0.1.101"}]},
          "p2": {"common_host_ip": "10.0.1.2"}, "d1": {"common_host_ip": "10.0.2.1"},
          "r1": {"common_host_ip": "10.0.3.1"}}


def test_firewall_source_classes():
    c = bf.firewall_source_classes(_FW_GROUPS, _FW_HV, ["10.10.9.0/24", "fd00::/64"])
    assert c["etcd"] == ["10.0.0.1", "10.0.0.2", "10.0.0.3"] and c["master"] == ["10.0.0.1", "10.0.0.2"]
    assert c["prefill"] == ["10.0.1.1", "10.0.1.101", "10.0.1.2"]  # an instance's own host_ip too
    assert c["monitoring"] == ["10.10.9.0/24", "fd00::/64"] and c["entry"] == []
    assert c["cluster"] == ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.1.1", "10.0.1.101", "10.0.1.2", "10.0.2.1",
                            "10.0.3.1"]
    # P2P: only verify.yml's store round trip (first prefill puts, first decode gets) is a store client.
    assert c["store_clients"] == ["10.0.1.1", "10.0.1.101", "10.0.2.1"]
    assert bf.firewall_source_classes(dict(_FW_GROUPS, mooncake_master=[]), _FW_HV)["store_clients"] == []
    store = {h: dict(v, vllm_kv_connector=bf.STORE_CONNECTOR) for h, v in _FW_HV.items()}
    assert bf.firewall_source_classes(_FW_GROUPS, store)["store_clients"] == ["10.0.1.1", "10.0.1.101", "10.0.1.2",
                                                                             "10.0.2.1"]


def test_firewall_plan_groups_ports_by_class():
    ls = bf.host_listeners(_LISTEN_CFG, {"etcd": True, "master": True, "prefill": True, "router": True})
    classes = bf.firewall_source_classes(_FW_GROUPS, _FW_HV, ["10.10.9.0/24", "fd00::/64"])
    plan = bf.firewall_plan(ls, classes, [8081])
    assert plan["public"] == ["8000"]
    assert [p["spec"] for p in plan["protected"]] == [e["spec"] for e in ls if e["spec"] != "8000"] + ["8081"]
    by = {c["name"]: c for c in plan["classes"]}
    assert list(by) == ["etcd", "master", "prefill", "decode", "router", "store_clients", "monitoring", "cluster"]
    assert by["monitoring"]["ports"] == ["2381", "9003", "8100", "8101", "29000"]
    assert (by["monitoring"]["v4"], by["monitoring"]["v6"]) == (["10.10.9.0/24"], ["fd00::/64"])
    assert by["master"]["ports"] == ["2479"] and by["store_clients"]["ports"] == ["2479", "50051", "8080"]
    assert by["cluster"] == {"name": "cluster", "ports": ["8081"], "v4": classes["cluster"], "v6": []}


def test_vllm_stale_instances():
    show = ("ExecMainStartTimestamp=@1000\nId=vllm@p0.service\n\n"
            "Id=vllm@p1.service\nExecMainStartTimestamp=@3000\n\n"
            "ExecMainStartTimestamp=\nId=vllm@p2.service\n")
    inputs = [{"instance": "", "path": "/etc/systemd/system/vllm@.service"},
              {"instance": "p0", "path": "/etc/vllm/p0.env"}, {"instance": "p1", "path": "/etc/vllm/p1.env"},
              {"instance": "p1", "path": "/etc/vllm/p1.mooncake.json"}]  # missing: not in stat's output
    stat = "500.0 /etc/systemd/system/vllm@.service\n2000 /etc/vllm/p0.env\n2500 /etc/vllm/p1.env\n"
    assert bf.vllm_stale_instances(show, stat, inputs) == ["p0"]  # p1 started after its inputs; p2 is not running
    stat = stat.replace("500.0 /etc/systemd", "4000.5 /etc/systemd")  # the shared unit file changed after both started
    assert bf.vllm_stale_instances(show, stat, inputs) == ["p0", "p1"]
    assert bf.vllm_stale_instances("", stat, inputs) == []


def test_vllm_unloaded_instances_need_a_reload_running_or_not():
    """A re-run reloads systemd only when it writes the unit: an instance whose unit systemd has not loaded
    restarts (with a reload), even one that was not running and was just started on the old unit."""
    show = ("Id=vllm@p0.service\nExecMainStartTimestamp=@1000\nNeedDaemonReload=no\n\n"
            "NeedDaemonReload=yes\nId=vllm@p1.service\nExecMainStartTimestamp=@3000\n\n"
            "Id=vllm@p2.service\nExecMainStartTimestamp=\nNeedDaemonReload=yes\n")
    assert bf.vllm_unloaded_instances(show) == ["p1", "p2"]
    assert bf.vllm_unloaded_instances(show.replace("=yes", "=no")) == []
    assert bf.vllm_unloaded_instances("") == []


def test_host_cfg_reads_role_defaults_under_the_inventory():
    """Another role's setting comes from that role's defaults, overridden by the inventory: no copies."""
    hv = {'r1': {'vllm_router_port': 9000, 'etcd_cert_dir': '/pki'}, 'r2': {}}
    import yaml
    router_default = yaml.safe_load(open(os.path.join(REPO, "roles/vllm_router/defaults/main.yml")).read())['vllm_router_port']
    assert bf.host_cfg('r1', hv)['vllm_router_port'] == 9000
    assert bf.host_cfg('r2', hv)['vllm_router_port'] == router_default
    # plain "{{ name }}" templates over other settings are rendered; others are left out
    assert bf.host_cfg('r1', hv)['etcd_ca_file'] == '/pki/ca.crt'
    assert 'etcd_cert_file' not in bf.host_cfg('r1', hv)  # needs inventory_hostname


def test_host_cfg_renders_a_default_through_path_filters():
    """vllm_served_model_name: "{{ vllm_model | basename }}" is read from the vllm role, not restated by a play."""
    import yaml
    vllm = yaml.safe_load(open(os.path.join(REPO, "roles/vllm/defaults/main.yml")).read())
    hv = {'p1': {'vllm_model': 'Qwen/Qwen3-32B'}, 'p2': {}, 'p3': {'vllm_model': '/m', 'vllm_served_model_name': 'x'}}
    assert bf.host_cfg('p1', hv)['vllm_served_model_name'] == 'Qwen3-32B'
    assert bf.host_cfg('p2', hv)['vllm_served_model_name'] == os.path.basename(vllm['vllm_model'])
    assert bf.host_cfg('p3', hv)['vllm_served_model_name'] == 'x'


def test_etcd_mooncake_hostports_follow_each_members_tls():
    hv = {'e1': {'common_host_ip': '10.0.0.1', 'etcd_tls_enabled': True, 'etcd_mooncake_client_port': 2479},
          'e2': {'common_host_ip': '10.0.0.2', 'etcd_tls_enabled': False, 'etcd_client_port': 2390}}
    assert bf.etcd_mooncake_hostports(['e1', 'e2'], hv) == ['10.0.0.1:2479', '10.0.0.2:2390']


def test_router_binds_its_cluster_address_unless_told():
    hv = {'r1': {'common_host_ip': '10.0.0.41'}, 'r2': {'common_host_ip': '10.0.0.42', 'vllm_router_host': '0.0.0.0',
                                                        'vllm_router_port': 9000}}
    assert bf.router_bind('r1', hv) == '10.0.0.41'
    assert bf.router_local_url('r1', hv) == 'http://10.0.0.41:%s' % bf.host_cfg('r1', hv)['vllm_router_port']
    assert bf.router_bind('r2', hv) == '0.0.0.0' and bf.router_local_url('r2', hv) == 'http://127.0.0.1:9000'


def test_router_endpoints_are_what_the_entry_and_the_drain_reach():
    """One list for haproxy's backends (address:port from another host) and the vLLM drain (local_url on the
    router's host, with the router's key): a router bound to every address is reached at its cluster address."""
    hv = {'r1': {'common_host_ip': '10.0.0.41', 'vllm_router_api_key': 'k1', 'vllm_router_implementation': 'vllm-router'},
          'r2': {'common_host_ip': '10.0.0.42', 'vllm_router_host': '0.0.0.0', 'vllm_router_port': 9000},  # smg: the default
          'r3': {'common_host_ip': '10.0.0.43', 'vllm_router_host': '192.168.7.3', 'vllm_router_port': 9001}}
    eps = bf.router_endpoints(['r1', 'r2', 'r3'], hv)
    port = int(bf.host_cfg('r1', hv)['vllm_router_port'])
    assert eps[0] == {'host': 'r1', 'address': '10.0.0.41', 'port': port, 'url': 'http://10.0.0.41:%d' % port,
                      'local_url': 'http://10.0.0.41:%d' % port, 'headers': {'Authorization': 'Bearer k1'},
                      'implementation': 'vllm-router'}
    # Which worker API it has: the vLLM retirement calls vllm-router's /remove_worker only (smg's manifest drops it).
    assert [e['implementation'] for e in eps] == ['vllm-router', 'smg', 'smg']
    assert (eps[1]['address'], eps[1]['port'], eps[1]['local_url'], eps[1]['headers']) == \
        ('10.0.0.42', 9000, 'http://127.0.0.1:9000', {})
    assert (eps[1]['url'], eps[2]['url'], eps[2]['local_url']) == \
        ('http://10.0.0.42:9000', 'http://192.168.7.3:9001', 'http://192.168.7.3:9001')
    assert bf.router_endpoints([], hv) == []


def test_master_local_url_is_its_metrics_server_on_its_host():
    """The master's health waits, watchdog and status read one URL: mooncake_master_metrics_host (the cluster
    address by default), 127.0.0.1 when the metrics server binds every address."""
    port = bf.host_cfg('m1', {'m1': {'common_host_ip': '10.0.0.5'}})['mooncake_master_metrics_port']
    assert bf.master_local_url('m1', {'m1': {'common_host_ip': '10.0.0.5'}}) == 'http://10.0.0.5:%s' % port
    assert bf.master_local_url('m1', {'m1': {'ansible_host': '10.0.0.6'}}) == 'http://10.0.0.6:%s' % port
    hv = {'m1': {'common_host_ip': '10.0.0.5', 'mooncake_master_metrics_host': '0.0.0.0',
                 'mooncake_master_metrics_port': 9100}}
    assert bf.master_local_url('m1', hv) == 'http://127.0.0.1:9100'


@pytest.mark.parametrize("p2p_or_store, backend, setting, masters, expected", [
    ("MooncakeConnector", "auto", "auto", ["m1"], False),           # P2P never reads it: off
    ("MooncakeStoreConnector", "auto", "auto", ["m1"], True),       # store mode, one master: http backend
    ("MooncakeStoreConnector", "auto", "auto", ["m1", "m2"], False),  # HA masters resolve the backend to etcd
    ("MooncakeStoreConnector", "http", "auto", ["m1"], True),
    ("MooncakeConnector", "auto", True, ["m1"], True),               # forced
    ("MooncakeStoreConnector", "http", "false", ["m1"], False),
])
def test_master_http_metadata_server_only_where_an_instance_reads_it(p2p_or_store, backend, setting, masters, expected):
    hv = {"m1": {"mooncake_master_http_metadata_server": setting}, "m2": {},
          "p1": {"vllm_kv_connector": p2p_or_store, "mooncake_metadata_backend": backend}}
    groups = {"mooncake_master": masters, "vllm_prefill": ["p1"], "vllm_decode": []}
    assert bf.master_http_metadata("m1", groups, hv) is expected
    ports = [x["port"] for x in bf.host_listeners(bf.host_cfg("m1", hv), {"master": True, "http_metadata": expected})]
    assert (bf.host_cfg("m1", hv)["mooncake_master_http_metadata_port"] in ports) is expected


def test_the_transfer_check_drops_root_with_unlimited_locked_memory_for_rdma():
    end = {"ip": "10.0.0.1", "device": "mlx5_0"}
    rdma = dict(_OPTS, protocol="rdma", run_as="mooncake-check")
    argv = bf.mooncake_check_argv(end, "serve", rdma)
    prefix = bf.run_as_argv("mooncake-check", True)
    assert argv[:len(prefix)] == prefix == ["prlimit", "--memlock=unlimited", "--", "setpriv", "--reuid=mooncake-check",
                                            "--regid=mooncake-check", "--init-groups", "--"]
    assert argv[len(prefix):] == bf.mooncake_check_argv(end, "serve", dict(rdma, run_as=""))
    # tcp registers no memory: no prlimit (a container without CAP_SYS_RESOURCE could not raise it)
    assert bf.mooncake_check_argv(end, "serve", dict(_OPTS, protocol="tcp", run_as="u"))[:2] == ["setpriv", "--reuid=u"]
    assert bf.run_as_argv("") == [] and bf.run_as_argv(None) == []


def test_host_roles_and_bundle_hosts_with_a_monitoring_group():
    """One mapping of groups to roles: node exporters run on every bundle host only when there is a monitoring
    group; the monitoring hosts get Prometheus' and Alertmanager's listeners, the others the node exporter's only."""
    groups = {'etcd': ['e1', 'e2'], 'mooncake_master': ['e1'], 'vllm_prefill': ['p1'], 'vllm_decode': ['d1'],
              'monitoring': ['m1'], 'ungrouped': ['x']}
    assert bf.bundle_hosts(groups) == ['e1', 'e2', 'p1', 'd1', 'm1']
    r = bf.host_roles('e1', groups)
    assert (r['etcd'], r['master'], r['engine'], r['vllm'], r['node_exporter'], r['monitoring']) == (True, True, True, False, True, False)
    assert bf.host_roles('x', groups)['node_exporter'] is False  # not a bundle host
    assert bf.host_roles('e1', dict(groups, monitoring=[]))['node_exporter'] is False
    cfg = {'monitoring_prometheus_port': 9090, 'monitoring_alertmanager_port': 9093, 'monitoring_node_exporter_port': 9100}
    ports = {e['vars'][0]: e['sources'] for e in bf.host_listeners(cfg, bf.host_roles('m1', groups))}
    assert ports == {'monitoring_prometheus_port': ['monitoring'], 'monitoring_alertmanager_port': ['monitoring'],
                     'monitoring_node_exporter_port': ['monitoring']}
    decode = [e['vars'][0] for e in bf.host_listeners(cfg, bf.host_roles('d1', groups)) if 'monitoring' in e['vars'][0]]
    assert decode == ['monitoring_node_exporter_port']


def test_monitoring_class_is_the_monitoring_hosts_and_the_extra_sources():
    groups = {'etcd': ['e1'], 'monitoring': ['m1']}
    hv = {'e1': {'ansible_host': '10.0.0.1'}, 'm1': {'ansible_host': '10.0.0.9'}}
    classes = bf.firewall_source_classes(groups, hv, ['10.9.0.0/24', '10.0.0.9'])
    assert classes['monitoring'] == ['10.0.0.9', '10.9.0.0/24']
    assert classes['cluster'] == ['10.0.0.1', '10.0.0.9']


def test_host_packages_are_the_union_of_the_roles_a_host_runs():
    """playbooks/packages.yml's one apt transaction per host: each role's list (the same the role's own install
    task reads), once each, only for the roles the host runs."""
    groups = {'etcd': ['e1', 'e2'], 'mooncake_master': ['e1'], 'vllm_prefill': ['p1'], 'vllm_decode': ['d1'],
              'vllm_router': ['r1'], 'entry': ['x1', 'x2'], 'monitoring': ['e2']}
    hv = {h: {'firewall_enabled': True, 'etcd_install_method': 'package'} for h in ['e1', 'e2', 'p1', 'd1', 'r1', 'x1', 'x2']}
    hv['d1'] = {'firewall_enabled': False, 'mooncake_system_packages': ['libfoo']}
    import yaml
    etcd = yaml.safe_load(open(os.path.join(REPO, "roles/etcd/defaults/main.yml")).read())
    mooncake = yaml.safe_load(open(os.path.join(REPO, "roles/mooncake/defaults/main.yml")).read())
    base = ['nftables', 'prometheus-node-exporter']
    assert bf.host_packages('e1', groups, hv) == base + etcd['etcd_packages'] + [
        p for p in mooncake['mooncake_system_packages'] if p not in base + etcd['etcd_packages']]
    assert bf.host_packages('e2', groups, hv) == base + etcd['etcd_packages'] + ['prometheus', 'prometheus-alertmanager']
    p1 = bf.host_packages('p1', groups, hv)
    assert set(p1) == set(base + mooncake['mooncake_system_packages'] + bf.ROLE_PACKAGES['vllm'])
    assert len(p1) == len(set(p1))  # python3-venv is in two lists, installed once
    # no firewall where it is off; the inventory's mooncake_system_packages replaces the default
    assert bf.host_packages('d1', groups, hv) == ['prometheus-node-exporter', 'libfoo'] + bf.ROLE_PACKAGES['vllm']
    assert bf.host_packages('x1', groups, hv) == base + ['haproxy', 'curl', 'keepalived']
    assert bf.host_packages('x1', dict(groups, entry=['x1']), hv)[-1] == 'curl'  # one entry host: no keepalived
    assert not set(etcd['etcd_packages']) & set(bf.host_packages('e1', groups, dict(hv, e1={'firewall_enabled': True})))
    # (etcd_install_method archive, the default: the role installs a release archive, no distro package)
    assert bf.host_packages('z', groups, dict(hv, z={'firewall_enabled': True})) == []  # not a bundle host


def test_role_packages_refuses_a_role_it_does_not_know():
    with pytest.raises(bf.AnsibleFilterError, match='no role'):
        bf.role_packages('vllm-router', 'r1', {}, {})


def _two_pools(hostvars, groups):
    """Pool a: p1's prefill0 and d1; pool b: p1's prefill1 and d2 (one host serves in two small pools)."""
    from ansible_collections.pd_bundle.serving.plugins.filter import pools
    return pools.bundle_inventory_pools(
        [{"name": "a", "model": "/m/a", "prefill": ["p1/prefill0"], "decode": ["d1"], "routers": ["r1"]},
         {"name": "b", "model": "/m/b", "prefill": ["p1/prefill1"], "decode": ["d2"], "routers": ["r2"]}],
        groups, hostvars)


def test_check_pairs_with_pools_stay_inside_each_pool():
    """KV never moves between pools, so the transfer check measures only the pairs of one pool (and the firewall
    would refuse the others); the implicit pool of an inventory without pools keeps every pair."""
    hv = _check_hostvars()
    groups = {"vllm_prefill": ["p1"], "vllm_decode": ["d1", "d2"], "vllm_router": ["r1", "r2"]}
    pairs = bf.mooncake_check_pairs(["d1", "d2"], "p1", hv, "tcp", _two_pools(hv, groups))
    assert [(p["source"]["instance"], p["target"]["host"]) for p in pairs] == [("prefill0", "d1"), ("prefill1", "d2")]
    from ansible_collections.pd_bundle.serving.plugins.filter import pools
    implicit = pools.bundle_inventory_pools([], groups, hv)
    assert bf.mooncake_check_pairs(["d1", "d2"], "p1", hv, "tcp", implicit) == bf.mooncake_check_pairs(["d1", "d2"], "p1", hv, "tcp")


def test_firewall_kv_peers_are_the_hosts_own_pools():
    """With pools a vLLM host's prefill and decode classes (its KV ports' sources) are its own pools' hosts; a host
    in no pool (a master) and an inventory without pools keep every one, and cluster stays every host."""
    hv = {"p1": {"common_host_ip": "10.0.1.1", "vllm_instances": [{"name": "prefill0"}]},
          "p2": {"common_host_ip": "10.0.1.2", "vllm_instances": [{"name": "prefill0"}]},
          "d1": {"common_host_ip": "10.0.2.1", "vllm_instances": [{"name": "decode0"}]},
          "d2": {"common_host_ip": "10.0.2.2", "vllm_instances": [{"name": "decode0"}]},
          "m1": {"common_host_ip": "10.0.0.1"}, "r1": {"common_host_ip": "10.0.3.1"}, "r2": {"common_host_ip": "10.0.3.2"}}
    groups = {"mooncake_master": ["m1"], "vllm_prefill": ["p1", "p2"], "vllm_decode": ["d1", "d2"],
              "vllm_router": ["r1", "r2"]}
    from ansible_collections.pd_bundle.serving.plugins.filter import pools
    two = pools.bundle_inventory_pools(
        [{"name": "a", "model": "/m/a", "prefill": ["p1"], "decode": ["d1"], "routers": ["r1"]},
         {"name": "b", "model": "/m/b", "prefill": ["p2"], "decode": ["d2"], "routers": ["r2"]}], groups, hv)
    whole = bf.firewall_source_classes(groups, hv)
    for host, pre, dec in [("p1", ["10.0.1.1"], ["10.0.2.1"]), ("d2", ["10.0.1.2"], ["10.0.2.2"]),
                           ("m1", whole["prefill"], whole["decode"])]:
        c = bf.firewall_source_classes(groups, hv, None, two, host)
        assert (c["prefill"], c["decode"]) == (pre, dec), host
        assert c["cluster"] == whole["cluster"] and c["store_clients"] == whole["store_clients"], host
    implicit = pools.bundle_inventory_pools([], groups, hv)
    assert bf.firewall_source_classes(groups, hv, None, implicit, "p1") == whole


def test_unit_started_before_its_inputs():
    """A router whose process started before its unit, key, venv or launcher last changed lost its restart."""
    stat = "1700000100.5 /etc/systemd/system/vllm-router.service\n1700000050.0 /etc/vllm-router/api-key.env\n"
    assert bf.unit_started_before("ExecMainStartTimestamp=@1700000090\n", stat) is True
    assert bf.unit_started_before("ExecMainStartTimestamp=@1700000200\n", stat) is False
    assert bf.unit_started_before("ExecMainStartTimestamp=\n", stat) is False  # not running: its start reads them
    assert bf.unit_started_before("ExecMainStartTimestamp=@1700000090\n", "") is False
