"""tests/infra helpers must be able to fail: a router key the inventory sets but the host cannot give,
a service bound to the wildcard where the host IP is configured, an outsider container that cannot
start on an existing lab network, a streamed chat through the entry that breaks off before [DONE]."""
import http.server
import importlib.util
import json
import stat
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import load_patch

INFRA = Path(__file__).resolve().parents[1] / "infra"


def _load_infra(file):
    """Load a tests/infra module with tests/infra/conftest.py as its `conftest` (tests/conftest.py is
    the `conftest` of this session); the session's module is put back afterwards."""
    saved = sys.modules.pop("conftest", None)
    sys.path.insert(0, str(INFRA))
    try:
        spec = importlib.util.spec_from_file_location("infra_" + Path(file).stem, INFRA / file)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    finally:
        sys.path.remove(str(INFRA))
        sys.modules.pop("conftest", None)
        if saved is not None:
            sys.modules["conftest"] = saved


conftest = _load_infra("conftest.py")
firewall = _load_infra("test_firewall.py")


# --- router key ----------------------------------------------------------------------------------

class FakeHost:
    def __init__(self, variables, uid="0", cat=(0, "", ""), path="/etc/vllm-router/api-key.env", name="router1"):
        self.ansible = SimpleNamespace(get_variables=lambda: dict(variables, inventory_hostname=name))
        self.uid, self.cat, self.sudo_used, self.path = uid, cat, False, path

    def check_output(self, cmd):
        assert cmd == "id -u"
        return self.uid

    def run(self, cmd):
        assert cmd == "cat " + self.path
        rc, out, err = self.cat
        return SimpleNamespace(rc=rc, stdout=out, stderr=err)

    @contextmanager
    def sudo(self):
        self.sudo_used = True
        yield


MISSING = (1, "", "cat: /etc/vllm-router/api-key.env: No such file or directory")
KEY = {"vllm_router_api_key": "{{ vault_vllm_router_api_key }}"}


def test_router_key_header_from_the_deployed_file():
    h = FakeHost(KEY, cat=(0, "VLLM_ROUTER_API_KEY=lab-123\n", ""))
    assert conftest.router_auth_headers(h) == ["Authorization: Bearer lab-123"]
    h = FakeHost(KEY, uid="1000", cat=(0, "VLLM_ROUTER_API_KEY=lab-123\n", ""))
    assert conftest.router_auth_headers(h) == ["Authorization: Bearer lab-123"] and h.sudo_used


def test_no_header_only_when_no_key_is_configured():
    assert conftest.router_auth_headers(FakeHost({}, cat=MISSING)) == []
    assert conftest.router_auth_headers(FakeHost({"vllm_router_api_key": ""}, cat=MISSING)) == []


def test_configured_key_that_cannot_be_read_fails():
    with pytest.raises(AssertionError, match="is set in the inventory.*cannot be read"):
        conftest.router_auth_headers(FakeHost(KEY, cat=MISSING))
    with pytest.raises(AssertionError, match="cannot be read"):
        conftest.router_auth_headers(FakeHost(KEY, uid="1000", cat=(1, "", "sudo: a password is required")))
    with pytest.raises(AssertionError, match="empty"):
        conftest.router_auth_headers(FakeHost(KEY, cat=(0, "VLLM_ROUTER_API_KEY=\n", "")))
    with pytest.raises(AssertionError, match="no VLLM_ROUTER_API_KEY"):
        conftest.router_auth_headers(FakeHost(KEY, cat=(0, "OTHER=1\n", "")))
    # Not configured, but the file is there and unreadable for another reason: not silently [].
    with pytest.raises(AssertionError, match="cannot be read"):
        conftest.router_auth_headers(FakeHost({}, uid="1000", cat=(1, "", "sudo: a password is required")))


def test_instance_key_header_from_the_instance_host_file():
    """The instances demand the routers' key: read from the instance host's own /etc/vllm/api-key.env."""
    def inst(configured_cat, uid="0"):
        return FakeHost({}, uid=uid, cat=configured_cat, path="/etc/vllm/api-key.env", name="prefill1")
    h = inst((0, "VLLM_API_KEY=lab-123\n", ""), uid="1000")
    assert conftest.instance_auth_headers(h, True) == ["Authorization: Bearer lab-123"] and h.sudo_used
    missing = (1, "", "cat: /etc/vllm/api-key.env: No such file or directory")
    assert conftest.instance_auth_headers(inst(missing), False) == []
    with pytest.raises(AssertionError, match="vllm_router_api_key .* is set in the inventory.*/etc/vllm/api-key.env on prefill1 cannot be read"):
        conftest.instance_auth_headers(inst(missing), True)
    with pytest.raises(AssertionError, match="no VLLM_API_KEY"):
        conftest.instance_auth_headers(inst((0, "VLLM_ROUTER_API_KEY=lab-123\n", "")), True)


# --- listening addresses -------------------------------------------------------------------------

SS = """LISTEN 0 4096 172.30.0.11:2379 0.0.0.0:*
LISTEN 0 4096 127.0.0.1:2379 0.0.0.0:*
LISTEN 0 4096 0.0.0.0:9003 0.0.0.0:*
LISTEN 0 2048 0.0.0.0:8100 0.0.0.0:*
LISTEN 0 4096 [::]:8000 [::]:*
LISTEN 0 4096 *:29000 *:*
LISTEN 0 4096 [fe80::1%eth0]:7000 [::]:*
"""


units = _load_infra("test_units.py")


def _table(*entries):
    """listener_table rows from (port, last, vars, public)."""
    return [(p, last or p, {"port": p, "vars": list(v), "public": pub}) for p, last, v, pub in entries]


def test_listener_outside_the_table_or_a_wildcard_bind_fails():
    table = _table((8100, None, ["vllm_instances[0].port"], False), (443, None, ["entry_port"], True),
                   (15000, 17000, ["mooncake_rpc_port_min..mooncake_rpc_port_max"], False))
    ok = {("172.30.0.21", 8100), ("0.0.0.0", 443), ("0.0.0.0", 16062), ("::", 15550), ("127.0.0.1", 9999),
          ("127.0.0.11", 34501), ("172.30.0.21", 41763)}
    assert units.unlisted_listeners(ok, table, 32768) == ([], [])
    # the vLLM API on the wildcard (the old default), a unit's new port, a wildcard off the table
    bad = ok | {("0.0.0.0", 8100)} | {("172.30.0.21", 9090)} | {("0.0.0.0", 8998)}
    wild, unlisted = units.unlisted_listeners(bad, table, 32768)
    assert wild == ["0.0.0.0:8100 (vllm_instances[0].port)", "0.0.0.0:8998 (not in the table)"]
    assert unlisted == ["172.30.0.21:9090"]
    # a port the operator made public (firewall_public_tcp_ports) may listen anywhere
    assert units.unlisted_listeners({("0.0.0.0", 9090)}, table, 32768, [9090]) == ([], [])


# `ss -Htln` on the lab's prefill1 (two P2P instances, pinned side channels 18100 and 18116), abridged: the workers'
# torch/gloo listeners on high ports of the cluster address (backlog 4096), the transfer engine's (128).
PREFILL_SS = """LISTEN 0      128        0.0.0.0:16416 0.0.0.0:*
LISTEN 0      4096   172.30.0.21:46001 0.0.0.0:*
LISTEN 0      4096    127.0.0.11:34135 0.0.0.0:*
LISTEN 0      2048   172.30.0.21:8998  0.0.0.0:*
LISTEN 0      4096   172.30.0.21:37009 0.0.0.0:*
LISTEN 0      2048   172.30.0.21:8100  0.0.0.0:*
LISTEN 0      100    172.30.0.21:18116 0.0.0.0:*
LISTEN 0      100    172.30.0.21:18100 0.0.0.0:*
LISTEN 0      128              *:15810       *:*
"""
PINNED = {"prefill0": ("172.30.0.21", [18100]), "prefill1": ("172.30.0.21", [18116])}


def test_side_channels_on_their_pinned_ports_pass():
    rows = conftest.parse_ss_rows(PREFILL_SS)
    assert ("172.30.0.21", 18100, 100) in rows and ("::", 15810, 128) in rows
    assert units.side_channel_problems(rows, PINNED) == ([], [])


def test_a_side_channel_that_lost_its_pin_fails_though_the_table_check_cannot_see_it():
    """prefill0's side channel on a random pyzmq port (52111, above the ephemeral start): the table check passes
    it, as it always did; the side-channel check names the pinned port nothing listens on and the stray one."""
    lost = PREFILL_SS.replace("172.30.0.21:18100 ", "172.30.0.21:52111 ")
    table = _table((18100, None, ["vllm_instances[prefill0].side_channel_port"], False),
                   (18116, None, ["vllm_instances[prefill1].side_channel_port"], False),
                   (8100, None, ["vllm_instances[prefill0].port"], False), (8998, None, ["bootstrap"], False),
                   (15000, 17000, ["mooncake_rpc_port_min..mooncake_rpc_port_max"], False))
    assert units.unlisted_listeners(conftest.parse_ss_listeners(lost), table, 32768) == ([], [])
    missing, stray = units.side_channel_problems(conftest.parse_ss_rows(lost), PINNED)
    assert missing == ["prefill0: 172.30.0.21:18100"] and stray == ["172.30.0.21:52111"]


def test_every_pinned_port_of_an_instance_must_listen():
    """TP 2: one port per rank; rank 1 lost its pin (the kernel gave it a port of the ephemeral range)."""
    ss = PREFILL_SS + "LISTEN 0      100    172.30.0.21:40123 0.0.0.0:*\n"
    missing, stray = units.side_channel_problems(conftest.parse_ss_rows(ss), {"prefill0": ("172.30.0.21", [18100, 18101])})
    assert missing == ["prefill0: 172.30.0.21:18101"] and stray == ["172.30.0.21:18116", "172.30.0.21:40123"]
    # the pinned port on another address than the instance's (VLLM_HOST_IP) is no side channel decodes can reach
    moved = PREFILL_SS.replace("172.30.0.21:18116 ", "0.0.0.0:18116 ")
    assert units.side_channel_problems(conftest.parse_ss_rows(moved), PINNED)[0] == ["prefill1: 172.30.0.21:18116"]
    # loopback listeners are the host's own
    assert units.side_channel_problems(conftest.parse_ss_rows(
        PREFILL_SS + "LISTEN 0 100 127.0.0.1:55555 0.0.0.0:*\n"), PINNED) == ([], [])


class _PrefillHost:
    """A prefill host as test_units reads it: its inventory variables, its instances' deployed env files."""

    def __init__(self, instances, connector="MooncakeConnector", base=None):
        variables = {"inventory_hostname": "prefill1", "common_host_ip": "172.30.0.21", "vllm_instances": instances,
                     "groups": {"vllm_prefill": ["prefill1"], "all": ["prefill1"]}}
        if base is not None:
            variables["vllm_side_channel_port_base"] = base
        self.ansible = SimpleNamespace(get_variables=lambda: dict(variables))
        self.connector = connector

    def file(self, path):
        return SimpleNamespace(content_string="SERVE_KV_TRANSFER_CONFIG='%s'\n" % json.dumps({"kv_connector": self.connector}))


def test_pinned_ports_come_from_the_bundle_and_the_role_default():
    import yaml
    base = yaml.safe_load((INFRA.parents[1] / "roles/vllm/defaults/main.yml").read_text())["vllm_side_channel_port_base"]
    stride = conftest.BUNDLE.SIDE_CHANNEL_STRIDE
    insts = [{"name": "prefill0", "port": 8100}, {"name": "prefill1", "port": 8101, "tensor_parallel_size": 2},
             {"name": "prefill2", "port": 8102, "host_ip": "10.0.0.9", "side_channel_port": 20000}]
    assert units.pinned_side_channels(_PrefillHost(insts)) == {
        "prefill0": ("172.30.0.21", [base]), "prefill1": ("172.30.0.21", [base + stride, base + stride + 1]),
        "prefill2": ("10.0.0.9", [20000])}
    assert units.pinned_side_channels(_PrefillHost(insts[:1], base=30000)) == {"prefill0": ("172.30.0.21", [30000])}
    # store mode: no side channel to look for
    assert units.pinned_side_channels(_PrefillHost(insts, connector="MooncakeStoreConnector")) == {}


def test_host_ip_sockets_need_the_exact_address():
    socks = conftest.parse_ss_listeners(SS)
    assert ("172.30.0.11", 2379) in socks and ("fe80::1", 7000) in socks and ("::", 29000) in socks
    assert conftest.listens_as_configured(socks, "172.30.0.11", 2379)
    # Bound to every address where the host IP is configured: the old check accepted this.
    assert not conftest.listens_as_configured(socks, "172.30.0.11", 9003)
    assert not conftest.listens_as_configured(socks, "172.30.0.11", 29000)
    assert not conftest.listens_as_configured(socks, "172.30.0.11", 2380)
    # Configured on the wildcard: a wildcard bind (v4 or v6) is what must be there.
    assert conftest.listens_as_configured(socks, "0.0.0.0", 8100)
    assert conftest.listens_as_configured(socks, "0.0.0.0", 8000)
    assert not conftest.listens_as_configured(socks, "0.0.0.0", 2379)


# --- the firewall's outsider ---------------------------------------------------------------------

def _fake_docker(tmp_path, inspect, run):
    """A docker CLI: `network inspect` and `run` print/exit as given, `rm` succeeds."""
    p = tmp_path / "docker"
    p.write_text("#!/bin/sh\ncase \"$1 $2\" in\n"
                 f"  'network inspect') {inspect} ;;\n"
                 f"  run*) {run} ;;\n"
                 "  *) exit 0 ;;\nesac\n")
    p.chmod(p.stat().st_mode | stat.S_IEXEC)
    return str(p)


SUBNET = "echo '%s'" % json.dumps([{"Subnet": "172.30.0.0/24"}])


def test_outsider_skips_only_without_a_lab(tmp_path):
    none = firewall.start_outsider(None)
    assert isinstance(none, firewall.NoOutsider) and not none.fatal
    gone = firewall.start_outsider(_fake_docker(tmp_path, "echo 'Error: network pd-lab not found' >&2; exit 1",
                                                "exit 0"))
    assert isinstance(gone, firewall.NoOutsider) and not gone.fatal


def test_outsider_that_cannot_start_on_the_lab_network_fails(tmp_path):
    res = firewall.start_outsider(_fake_docker(tmp_path, SUBNET, "echo 'Unable to find image' >&2; exit 125"))
    assert isinstance(res, firewall.NoOutsider) and res.fatal and "Unable to find image" in res.reason
    down = firewall.start_outsider(_fake_docker(tmp_path, "echo 'Cannot connect to the Docker daemon' >&2; exit 1",
                                                "exit 0"))
    assert isinstance(down, firewall.NoOutsider) and down.fatal
    empty = firewall.start_outsider(_fake_docker(tmp_path, "echo '[]'", "exit 0"))
    assert isinstance(empty, firewall.NoOutsider) and empty.fatal


def test_outsider_starts(tmp_path):
    name, ip, subnets = firewall.start_outsider(_fake_docker(tmp_path, SUBNET, "echo abc123"))
    assert name.startswith("pd-fw-outsider-") and ip == firewall.OUTSIDER_IPS[0]
    assert [str(s) for s in subnets] == ["172.30.0.0/24"]


def test_outsider_test_fails_not_skips_on_a_fatal_reason(monkeypatch):
    monkeypatch.setattr(firewall, "enabled", lambda host: True)
    with pytest.raises(pytest.fail.Exception, match="no outsider"):
        firewall.test_outsider_is_refused(object(), firewall.NoOutsider("no outsider container could start", True))
    with pytest.raises(pytest.skip.Exception):
        firewall.test_outsider_is_refused(object(), firewall.NoOutsider("no docker network", False))


# --- etcd TLS refusals need the tool to have run -------------------------------------------------

etcd_tls = _load_infra("test_etcd_tls.py")


class CmdHost:
    """A host whose commands answer from a table of (substring -> (rc, stdout, stderr))."""

    def __init__(self, answers):
        self.answers = answers

    def run(self, cmd):
        rc, out, err = next(a for key, a in self.answers.items() if key in cmd)
        return SimpleNamespace(rc=rc, stdout=out, stderr=err)


MEMBER_VARS = {"common_host_ip": "172.30.0.11", "etcd_client_port": 2379}
NOT_FOUND = (127, "", "bash: line 1: curl: command not found")
REFUSED_CURL = (52, "\n000", "curl: (52) Empty reply from server")
REFUSED_ETCDCTL = (1, "", "http://172.30.0.11:2379 is unhealthy: failed to commit proposal\nError: unhealthy cluster")


def test_plain_http_refusal_needs_curl_and_etcdctl_to_run():
    ok = CmdHost({"curl": REFUSED_CURL, "etcdctl": REFUSED_ETCDCTL})
    etcd_tls.test_plain_http_refused_on_client_port((ok, MEMBER_VARS, {}))
    for answers in ({"curl": NOT_FOUND, "etcdctl": REFUSED_ETCDCTL},
                    {"curl": REFUSED_CURL, "etcdctl": (127, "", "etcdctl: command not found")},
                    {"curl": REFUSED_CURL, "etcdctl": (126, "", "etcdctl: Permission denied")}):
        with pytest.raises(AssertionError, match="did not run"):
            etcd_tls.test_plain_http_refused_on_client_port((CmdHost(answers), MEMBER_VARS, {}))
    # A failure that is not the TLS listener's refusal is not a refusal either.
    with pytest.raises(AssertionError, match="another reason"):
        etcd_tls.test_plain_http_refused_on_client_port(
            (CmdHost({"curl": REFUSED_CURL, "etcdctl": (1, "", "Error: unknown flag: --command-timeout")}),
             MEMBER_VARS, {}))
    with pytest.raises(AssertionError, match="unexpected answer"):
        etcd_tls.test_plain_http_refused_on_client_port(
            (CmdHost({"curl": (7, "\n000", "curl: (7) Failed to connect"), "etcdctl": REFUSED_ETCDCTL}),
             MEMBER_VARS, {}))


# --- the entry path of tests/infra/test_e2e.py ------------------------------------------------------

e2e = _load_infra("test_e2e.py")


def _chunk(**kw):
    return "data: " + json.dumps({"choices": [{"delta": kw}]} if kw else
                                 {"choices": [], "usage": {"prompt_tokens": 300, "completion_tokens": 2}})


class _Sse:
    """A local stand-in for the entry: records each request, answers with LINES and keeps the connection open
    HOLD seconds after them (a reader that waits for the end instead of [DONE] is slow)."""

    def __init__(self, lines, hold=4.0):
        seen = self.seen = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                seen.append((self.path, dict(self.headers),
                             json.loads(self.rfile.read(int(self.headers["Content-Length"])))))
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                for line in lines:
                    self.wfile.write((line + "\n\n").encode())
                    self.wfile.flush()
                time.sleep(hold)

            def log_message(self, *a):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def api(self):
        api = e2e.EntryApi.__new__(e2e.EntryApi)
        api.host, api.base, api.key, api.ctx = None, "http://127.0.0.1:%d" % self.server.server_port, "k-1", None
        return api

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_streamed_chat_through_the_entry_reads_chunks_up_to_done():
    fake = _Sse([_chunk(role="assistant"), _chunk(content="he"), _chunk(content="llo"), _chunk(), "data: [DONE]"])
    try:
        t0 = time.monotonic()
        assert e2e.streamed_chat(fake.api(), "m") == 300
        assert time.monotonic() - t0 < 3, "the reader waited for the connection's end, not for [DONE]"
    finally:
        fake.close()
    path, headers, body = fake.seen[0]
    assert path == "/v1/chat/completions" and body["stream"] is True and body["model"] == "m"
    assert headers["Authorization"] == "Bearer k-1" and headers["Content-Type"] == "application/json"


@pytest.mark.parametrize("lines", [
    [_chunk(content="x"), _chunk()],                       # no [DONE]: the stream broke off
    [_chunk(), "data: [DONE]"],                            # no generated text
    [_chunk(content="x"), "data: [DONE]"],                 # no usage: the prompt tokens are unknown
])
def test_streamed_chat_fails_on_a_broken_stream(lines):
    fake = _Sse(lines, hold=0)
    try:
        with pytest.raises(AssertionError):
            e2e.streamed_chat(fake.api(), "m")
    finally:
        fake.close()


# --- store mode end to end: one try, and the store-lookup wait seen running ---------------------------------

class _Cluster:
    """kv_request's view of a cluster: every request misses the store (the KV does not arrive) unless told
    otherwise; the masters' view changes during the requests listed in failover_during."""

    def __init__(self, monkeypatch, connector="MooncakeStoreConnector", arrives=(), failover_during=()):
        self.sent, self.view, self.arrives, self.failover_during = 0, 1, set(arrives), set(failover_during)
        monkeypatch.setattr(e2e, "deployed_connector", lambda request, host: connector)
        monkeypatch.setattr(e2e, "master_views", lambda request, host: [self.view, self.view])
        monkeypatch.setattr(e2e, "decode_counters", lambda request, host: (0.0, 0.0))
        monkeypatch.setattr(e2e, "assert_kv_arrived", self.arrived)

    def send(self):
        self.sent += 1
        if self.sent in self.failover_during:
            self.view += 1
        return 300

    def arrived(self, request, host, tokens, ext0, local0, what):
        assert self.sent in self.arrives, "%s: decode computed the prompt" % what


def test_a_store_miss_fails_at_once_without_a_retry(monkeypatch):
    """A decode whose store-lookup wait stopped working misses the store: the first miss fails the test (the old
    test sent up to 3 requests and passed when one of them found the blocks by chance)."""
    c = _Cluster(monkeypatch, arrives={2, 3})
    with pytest.raises(AssertionError, match="decode computed the prompt"):
        e2e.kv_request(None, None, c.send, "completion")
    assert c.sent == 1
    c = _Cluster(monkeypatch, arrives={1})
    e2e.kv_request(None, None, c.send, "completion")
    assert c.sent == 1


def test_only_a_master_failover_during_the_request_earns_one_more(monkeypatch, capsys):
    c = _Cluster(monkeypatch, arrives={2}, failover_during={1})
    e2e.kv_request(None, None, c.send, "completion")
    assert c.sent == 2 and "a master failover happened during the request (view [1, 1] -> [2, 2])" in capsys.readouterr().out
    c = _Cluster(monkeypatch, arrives=(), failover_during={1, 2})
    with pytest.raises(AssertionError):
        e2e.kv_request(None, None, c.send, "completion")
    assert c.sent == 1 + e2e.FAILOVER_RETRIES
    c = _Cluster(monkeypatch, connector="MooncakeConnector", arrives={2})  # P2P: no store, one try
    with pytest.raises(AssertionError):
        e2e.kv_request(None, None, c.send, "completion")
    assert c.sent == 1


class _DecodeHost:
    """A store-mode decode host: its instance's env file and its unit's journal of the current run."""

    def __init__(self, env, journal, connector="MooncakeStoreConnector"):
        self.env, self.journal, self.connector, self.ran = env, journal, connector, []
        variables = {"inventory_hostname": "decode1", "groups": {"vllm_decode": ["decode1"]},
                     "vllm_instances": [{"name": "decode0", "port": 8200}], "common_host_ip": "172.30.0.31"}
        self.ansible = SimpleNamespace(get_variables=lambda: dict(variables))

    def file(self, path):
        assert path == "/etc/vllm/decode0.env"
        cfg = json.dumps({"kv_connector": self.connector, "kv_role": "kv_consumer"})
        return SimpleNamespace(content_string="SERVE_KV_TRANSFER_CONFIG='%s'\n%s" % (cfg, self.env))

    def check_output(self, cmd):
        if cmd == "id -u":
            return "0"
        assert cmd == "systemctl show -p InvocationID --value vllm@decode0"
        return "0123abcd"

    def run(self, cmd):
        self.ran.append(cmd)
        assert cmd == "journalctl _SYSTEMD_INVOCATION_ID=0123abcd -o cat --no-pager"
        return SimpleNamespace(rc=0, stdout=self.journal, stderr="")


def _store_wait():
    """plugins/tools/pd_bundle_store_wait.py, as the unit tests of the patch load it (no wait in this process's
    environment: it hooks nothing)."""
    return load_patch("pd_bundle_store_wait")


def test_store_lookup_wait_must_be_seen_active_in_the_decodes_journal():
    sw = _store_wait()
    assert (e2e.store_wait_constant("WAIT_ENV"), e2e.store_wait_constant("ACTIVE")) == (sw.WAIT_ENV, sw.ACTIVE)
    env = "%s=5000\n" % sw.WAIT_ENV
    started = "(EngineCore pid=77) %s: a lookup that finds fewer than the prompt's whole blocks (128 tokens each) is " \
              "retried for up to 5000 ms (%s)\n" % (sw.ACTIVE, sw.WAIT_ENV)
    e2e.test_store_lookup_wait_is_active(_DecodeHost(env, "INFO Starting vLLM\n" + started))
    # a wait that is not hooked (or was renamed away) prints nothing: the env file alone proves nothing
    with pytest.raises(AssertionError, match="vllm@decode0 sets PD_BUNDLE_STORE_LOOKUP_WAIT_MS=5000, but .* no "
                                             "'pd-bundle: store lookup wait active' line"):
        e2e.test_store_lookup_wait_is_active(_DecodeHost(env, "INFO Starting vLLM\n"))
    # a scheduler that waits another time than the env file says
    with pytest.raises(AssertionError, match="retried for up to 5000 ms"):
        e2e.test_store_lookup_wait_is_active(_DecodeHost(env, started.replace("5000 ms", "1000 ms")))


@pytest.mark.parametrize("env, connector", [("PD_BUNDLE_STORE_LOOKUP_WAIT_MS=0\n", "MooncakeStoreConnector"),
                                            ("", "MooncakeStoreConnector"),
                                            ("PD_BUNDLE_STORE_LOOKUP_WAIT_MS=5000\n", "MooncakeConnector")])
def test_no_store_wait_to_see_skips(env, connector):
    host = _DecodeHost(env, "", connector)
    with pytest.raises(pytest.skip.Exception):
        e2e.test_store_lookup_wait_is_active(host)
    assert host.ran == []
