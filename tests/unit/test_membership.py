"""Unit tests for plugins/filter/membership.py: a router's workers against the inventory (issue 32)."""
import importlib.util
import os

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
_spec = importlib.util.spec_from_file_location("membership", os.path.join(REPO, "plugins", "filter", "membership.py"))
m = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(m)

P0 = {"url": "http://10.0.0.21:8100", "bootstrap_port": 8998}
P1 = {"url": "http://10.0.0.21:8101", "bootstrap_port": 8999}
D0, D1 = "http://10.0.0.31:8200", "http://10.0.0.32:8200"


def worker(url, kind, healthy=True, bootstrap=None):
    w = {"url": url, "worker_type": kind, "is_healthy": healthy}
    if bootstrap is not None:
        w["bootstrap_port"] = bootstrap
    return w


# What vllm-router 0.1.17's GET /workers answered on the lab (PD mode, mooncake), trimmed.
IN_SYNC = {"workers": [worker(D0, "decode"), worker(D1, "decode"), worker(P0["url"], "prefill", bootstrap=8998),
                       worker(P1["url"], "prefill", bootstrap=8999)], "total": 4}


def test_in_sync_router_has_nothing_to_do():
    plan = m.router_membership(IN_SYNC, [P0, P1], [D0, D1])
    assert plan == {"remove": [], "add": [], "unhealthy": [], "in_sync": True, "restart": False}
    assert m.membership_problems(plan, "router1") == []


def test_an_instance_that_left_is_removed_live_without_a_restart():
    plan = m.router_membership(IN_SYNC, [P0, P1], [D0])
    assert plan["remove"] == [D1] and plan["add"] == [] and not plan["restart"] and not plan["in_sync"]
    assert m.membership_problems(plan, "router1") == [
        "router1: router has %s, which the inventory does not serve" % D1]


def test_an_instance_that_joined_needs_a_restart_in_pd_mode():
    new = "http://10.0.0.33:8200"
    plan = m.router_membership(IN_SYNC, [P0, P1], [D0, D1, new])
    assert plan["add"] == [{"url": new, "type": "decode", "bootstrap_port": None}]
    assert plan["restart"] is True and m.LIVE_ADD is False
    assert m.membership_problems(plan) == ["router lacks decode %s from the inventory" % new]


def test_wrong_type_or_bootstrap_port_is_removed_and_added():
    plan = m.router_membership(IN_SYNC, [P0, {"url": P1["url"], "bootstrap_port": 9001}], [D0, D1])
    assert plan["remove"] == [P1["url"]] and plan["add"][0]["url"] == P1["url"]
    # Without the bootstrap lookup (store mode's nixl routing) the port does not matter.
    assert m.router_membership(IN_SYNC, [P0, {"url": P1["url"], "bootstrap_port": 9001}], [D0, D1], False)["in_sync"]
    swapped = m.router_membership(IN_SYNC, [P0, P1, {"url": D1}], [D0])
    assert swapped["remove"] == [D1] and swapped["add"][0] == {"url": D1, "type": "prefill", "bootstrap_port": None}


def test_unhealthy_members_are_reported_not_removed():
    w = {"workers": [worker(D0, "decode", healthy=False), worker(P0["url"], "prefill", bootstrap=8998)]}
    plan = m.router_membership(w, [P0], [D0 + "/"])
    assert plan["in_sync"] and plan["unhealthy"] == [D0]


def test_router_flags_drop_the_worker_list_only():
    argv = ["--vllm-pd-disaggregation", "--kv-connector", "mooncake", "--prefill", P0["url"], "8998",
            "--prefill", "http://x:1", "--decode", D0, "--host", "0.0.0.0", "--port", "8000"]
    assert m.router_flags(argv) == ["--vllm-pd-disaggregation", "--kv-connector", "mooncake", "--host", "0.0.0.0",
                                    "--port", "8000"]
    env = '# managed\nVLLM_ROUTER_ARGS="%s"\nRUST_LOG=info\n' % " ".join(argv)
    assert m.router_env_flags(env) == m.router_flags(argv)
    assert m.router_env_flags("RUST_LOG=info\n") is None
    # A workers-only change keeps the flags; a flag change shows.
    assert m.router_flags(argv[:6] + argv[8:]) == m.router_flags(argv)
    assert m.router_flags(argv[:-1] + ["8001"]) != m.router_flags(argv)



def test_router_workers_are_the_list_router_flags_drops():
    """The same walk: each --prefill URL [PORT] and --decode URL entry, the rest of the argv untouched."""
    argv = ["--vllm-pd-disaggregation", "--prefill", P0["url"], "8998", "--prefill", "http://x:1", "--decode", D0,
            "--port", "8000"]
    assert m.router_workers(argv) == [{"url": P0["url"], "worker_type": "prefill", "bootstrap_port": 8998},
                                      {"url": "http://x:1", "worker_type": "prefill"},
                                      {"url": D0, "worker_type": "decode"}]
    env = 'VLLM_ROUTER_ARGS="%s"\n' % " ".join(argv)
    assert m.router_env_argv(env) == argv and m.router_env_argv("RUST_LOG=info\n") is None
    # A worker flag with no URL left: dropped from the flags as before, and no worker.
    assert m.router_flags(["--port", "1", "--decode"]) == ["--port", "1"] and m.router_workers(["--decode"]) == []

def test_vllm_env_endpoint_reads_what_the_routers_know():
    env = ("# vLLM prefill instance prefill0 on prefill1\nSERVE_BIND_HOST=0.0.0.0\nSERVE_PORT=8100\n"
           "VLLM_HOST_IP=172.30.0.21\nVLLM_MOONCAKE_BOOTSTRAP_PORT=8998\nSERVE_KV_TRANSFER_CONFIG='{\"a\":1}'\n")
    assert m.vllm_env_endpoint(env) == {"url": "http://172.30.0.21:8100", "prefill": True}
    dec = "SERVE_BIND_HOST=172.30.0.31\nSERVE_PORT=8200\nVLLM_HOST_IP=172.30.0.31\n"
    assert m.vllm_env_endpoint(dec) == {"url": "http://172.30.0.31:8200", "prefill": False}


def test_bootstrap_query_url():
    assert m.bootstrap_query_url(P0) == "http://10.0.0.21:8998/query"
