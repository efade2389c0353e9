"""plugins/filter/mooncake_etcd.py (what Mooncake keeps in etcd) and the tests/infra pieces that read it
(etcd3gw over curl on a host, the deployed master arguments, which unit listens where) must be able to fail."""
import base64
import json
import runpy
import shlex
from pathlib import Path
from types import SimpleNamespace

import pytest

from test_infra_helpers import _load_infra, conftest

REPO = Path(__file__).resolve().parents[2]
me = runpy.run_path(str(REPO / "plugins" / "filter" / "siblings.py"))["load"]("mooncake_etcd")
gateway = _load_infra("etcd_gateway.py")

MASTERS = [{"host": "m1", "address": "10.0.0.1:50051", "healthy": True, "role": "leader", "leader_address": "10.0.0.1:50051"},
           {"host": "m2", "address": "10.0.0.2:50051", "healthy": True, "role": "standby", "leader_address": "10.0.0.1:50051"}]


def view(value="10.0.0.1:50051", ttl=4):
    return {"value": value, "lease_ttl": ttl, "error": None}


def test_the_keys_seen_on_the_lab():
    assert me.master_view_key("pd-mooncake") == "mooncake-store/pd-mooncake/master_view"
    assert me.engine_segment("mooncake/ram/10.0.0.21:15123") == "10.0.0.21:15123"
    assert me.engine_segment("mooncake/rpc_meta/10.0.0.21:15123") == "10.0.0.21:15123"
    assert me.engine_segment("mooncake/ram/") is None and me.engine_segment("mooncake-store/x/master_view") is None


def test_views_that_agree_have_no_problem():
    assert me.master_view_problems(view(), MASTERS) == []
    assert me.master_view_problems(view("10.0.0.9:1"), MASTERS, ha=False) == []


def test_disagreement_expired_lease_unknown_master_and_stuck_election_are_problems():
    assert me.master_view_problems(view("10.0.0.2:50051"), MASTERS)[0] == "m1 reports leader, but etcd names m2 (10.0.0.2:50051)"
    assert me.master_view_problems(view(ttl=-1), MASTERS) == [
        "etcd master view: 10.0.0.1:50051 has no live lease (TTL -1): it outlives its writer"]
    assert me.master_view_problems(view(ttl=None), MASTERS)
    assert "which is no master of the inventory" in me.master_view_problems(view("10.0.0.9:50051"), MASTERS)[0]
    stuck = [dict(m, role="standby") for m in MASTERS]  # both standby, the view names m1: the watchdog's case
    assert me.master_view_problems(view(), stuck) == ["etcd master view names m1 (10.0.0.1:50051), which does not lead"]
    lagging = [MASTERS[0], dict(MASTERS[1], leader_address="10.0.0.2:50051")]
    assert me.master_view_problems(view(), lagging) == ["m2 (standby) follows 10.0.0.2:50051, but etcd names 10.0.0.1:50051"]
    # a master that does not answer is not compared (its unit row is red already)
    assert me.master_view_problems(view(), [MASTERS[0], {"host": "m2", "address": "10.0.0.2:50051", "healthy": False}]) == []


def test_unowned_keys_are_stale_segments_other_clusters_and_anything_else():
    keys = ["mooncake-store/pd-mooncake/master_view", "mooncake/ram/10.0.0.21:15001", "mooncake/rpc_meta/10.0.0.21:15001",
            "mooncake/ram/10.0.0.21:15999", "mooncake-store/old-id/master_view", "mooncake/other", "unrelated/key"]
    assert me.unowned_keys(keys, "pd-mooncake", {"10.0.0.21:15001"}) == [
        "mooncake-store/old-id/master_view", "mooncake/other", "mooncake/ram/10.0.0.21:15999"]
    assert me.unowned_keys(keys[:1], "pd-mooncake", set()) == []


# --- etcd3gw through curl on a host ----------------------------------------------------------------------------

def b64(text):
    return base64.b64encode(text.encode()).decode()


class FakeEtcdHost:
    """Answers the curl commands CurlOnHost runs, like etcd's JSON gateway would (or fails like curl does)."""

    def __init__(self, kvs=None, ttl=4, rc=0):
        self.kvs, self.ttl, self.rc, self.commands = kvs or {}, ttl, rc, []

    def run(self, cmd):
        self.commands.append(cmd)
        if self.rc:
            return SimpleNamespace(rc=self.rc, stdout="", stderr="curl: (7) Failed to connect")
        argv = shlex.split(cmd)
        url = argv[-1]
        body = json.loads(argv[argv.index("--data-binary") + 1]) if "--data-binary" in argv else {}
        if url.endswith("/version"):
            out = {"etcdserver": "3.6.14", "etcdcluster": "3.6.0"}
        elif url.endswith("/kv/range"):
            start = base64.b64decode(body["key"])
            end = base64.b64decode(body.get("range_end", "")) or start + b"\0"
            out = {"kvs": [{"key": b64(k), "value": b64(v), "mod_revision": "7", "lease": "255"}
                           for k, v in sorted(self.kvs.items()) if start <= k.encode() < end]}
        elif url.endswith("/lease/timetolive"):
            out = {"ID": body["ID"], "TTL": str(self.ttl)}
        else:
            return SimpleNamespace(rc=0, stdout="404 page not found" + gateway._CODE_MARK + "404", stderr="")
        return SimpleNamespace(rc=0, stdout=json.dumps(out) + gateway._CODE_MARK + "200", stderr="")


def test_etcd3gw_reads_through_curl_on_the_host_with_the_client_certificate():
    h = FakeEtcdHost({"mooncake-store/pd/master_view": "10.0.0.1:50051", "mooncake/ram/10.0.0.21:15001": "{}", "zzz": "x"})
    cli = gateway.client(h.run, "https://10.0.0.11:2379", ["--cacert", "/pki/ca.crt", "--cert", "/pki/c.crt", "--key", "/pki/c.key"])
    keys = gateway.read_prefix(cli, "mooncake")
    assert keys == {"mooncake-store/pd/master_view": {"value": "10.0.0.1:50051", "lease": 255, "mod_revision": 7},
                    "mooncake/ram/10.0.0.21:15001": {"value": "{}", "lease": 255, "mod_revision": 7}}
    assert gateway.lease_ttl(cli, 255) == 4
    assert all("--cert /pki/c.crt --key /pki/c.key" in c and "https://10.0.0.11:2379/" in c for c in h.commands)


def test_etcd3gw_over_curl_fails_when_curl_fails():
    cli = gateway.client(FakeEtcdHost(rc=7).run, "http://10.0.0.11:2479")
    with pytest.raises(AssertionError, match=r"etcd \(ConnectionFailedError\): curl on the host: rc=7 curl: \(7\) Failed to connect"):
        gateway.read_prefix(cli, "mooncake")


# --- what the hosts run ------------------------------------------------------------------------------------------

def test_master_args_from_the_env_file():
    text = ('# Ansible managed\nMOONCAKE_MASTER_ARGS="--rpc_address=172.30.0.11 --rpc_port=50051 --enable_ha=true '
            '--etcd_endpoints=172.30.0.11:2479;172.30.0.12:2479 --cluster_id=pd-mooncake"\nMC_LOG_LEVEL=INFO\n')
    args = conftest.parse_master_args(text)
    assert (args["cluster_id"], args["enable_ha"], args["rpc_port"]) == ("pd-mooncake", "true", "50051")
    assert args["etcd_endpoints"].split(";") == ["172.30.0.11:2479", "172.30.0.12:2479"]
    with pytest.raises(AssertionError, match="no MOONCAKE_MASTER_ARGS"):
        conftest.parse_master_args("MC_LOG_LEVEL=INFO\n")


def test_listening_ports_per_unit():
    ss = ('LISTEN 0 4096 172.30.0.11:2379 0.0.0.0:* users:(("etcd",pid=101,fd=8))\n'
          'LISTEN 0 128 0.0.0.0:15123 0.0.0.0:* users:(("python3",pid=202,fd=30),("python3",pid=203,fd=30))\n'
          'LISTEN 0 128 [::]:22 [::]:*\n')
    assert conftest.parse_listener_pids(ss) == {101: {2379}, 202: {15123}, 203: {15123}}
    cg = ('101 0::/system.slice/etcd.service \n'
          '202 0::/system.slice/system-vllm.slice/vllm@prefill0.service \n'
          '203 0::/user.slice/session-1.scope \n')
    assert conftest.parse_pid_units(cg) == {101: "etcd.service", 202: "vllm@prefill0.service"}
