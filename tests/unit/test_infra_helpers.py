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
