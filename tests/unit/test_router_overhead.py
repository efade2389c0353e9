"""Unit tests for the pure parts of scripts/bench/router_overhead.py."""

from __future__ import annotations

import importlib.util
import os

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
_spec = importlib.util.spec_from_file_location("router_overhead",
                                               os.path.join(REPO, "scripts", "bench", "router_overhead.py"))
ro = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ro)


def test_percentile_interpolates_like_numpy():
    vals = [4.0, 1.0, 3.0, 2.0]
    assert ro.percentile(vals, 0) == 1.0
    assert ro.percentile(vals, 50) == 2.5
    assert ro.percentile(vals, 100) == 4.0
    assert ro.percentile(list(range(1, 101)), 99) == pytest.approx(99.01)
    with pytest.raises(ValueError):
        ro.percentile([], 50)


def test_summarize_and_ratios_in_milliseconds():
    router = ro.summarize([0.101, 0.102, 0.103])
    direct = ro.summarize([0.100, 0.100, 0.100])
    assert router == {"n": 3, "p50_ms": 102.0, "p99_ms": 102.98, "mean_ms": 102.0}
    assert ro.ratios(router, direct) == {"p50": 1.02, "p99": 1.0298, "mean": 1.02}


def test_paired_delta_is_the_median_of_round_differences():
    # a load spike in round 3 hits both paths; the paired median ignores it
    router = [0.110, 0.111, 2.000, 0.112]
    direct = [0.100, 0.100, 1.990, 0.101]
    assert ro.paired_delta_ms(router, direct) == pytest.approx(10.5)


def test_parse_prefill_derives_the_bootstrap_address_from_the_url_host():
    assert ro.parse_prefill("http://10.0.0.1:8100=8998") == ("http://10.0.0.1:8100", "http://10.0.0.1:8998")
    with pytest.raises(ValueError):
        ro.parse_prefill("http://10.0.0.1:8100")


def test_engine_id_from_bootstrap_query():
    doc = {"0": {"engine_id": "prefill1-prefill0", "worker_addr": {"0": {"0": "tcp://172.30.0.21:38087"}}}}
    assert ro.engine_id_from_query(doc) == "prefill1-prefill0"
    with pytest.raises(ValueError):
        ro.engine_id_from_query({})


def test_pd_bodies_match_what_the_router_sends():
    req = {"model": "m", "prompt": "p", "max_tokens": 16, "temperature": 0.0}
    prefill, decode = ro.pd_bodies(req, "xfer-1", "http://10.0.0.1:8998", "h-prefill0")
    assert prefill == {"model": "m", "prompt": "p", "max_tokens": 1, "min_tokens": 1, "temperature": 0.0,
                       "stream": False,
                       "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False,
                                              "transfer_id": "xfer-1"}}
    assert decode == {"model": "m", "prompt": "p", "max_tokens": 16, "temperature": 0.0,
                      "kv_transfer_params": {"do_remote_decode": False, "do_remote_prefill": True,
                                             "transfer_id": "xfer-1",
                                             "remote_bootstrap_addr": "http://10.0.0.1:8998",
                                             "remote_engine_id": "h-prefill0"}}
    assert req == {"model": "m", "prompt": "p", "max_tokens": 16, "temperature": 0.0}


def test_metric_sum_matches_labels():
    text = "\n".join([
        "# HELP vllm:prompt_tokens_by_source_total x",
        'vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="external_kv_transfer"} 241.0',
        'vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="local_compute"} 3.0',
        'vllm:prompt_tokens_by_source_total{engine="1",model_name="m",source="external_kv_transfer"} 9.0',
    ])
    assert ro.metric_sum(text, ro.METRIC, {"source": "external_kv_transfer"}) == 250.0
    assert ro.metric_sum(text, ro.METRIC, {"source": "local_compute"}) == 3.0
    assert ro.metric_sum(text, ro.METRIC, {"source": "local_cache_hit"}) == 0.0


def test_prompts_share_a_shape_but_not_a_prefix():
    a, b = ro.make_prompt("aaaa", 50), ro.make_prompt("bbbb", 50)
    assert len(a.split()) == len(b.split()) == 50
    assert a.split()[2:] == b.split()[2:] and a.split()[:2] != b.split()[:2]


def test_direct_path_sends_the_key_to_prefill_and_decode():
    """The instances demand the routers' key on /v1/*: the direct requests carry it, as the router's do."""
    sent = []

    class FakeHttp:
        def request(self, method, url, body=None, headers=None):
            sent.append((url, dict(headers or {})))
            return b'{"usage": {"prompt_tokens": 300}}'

    def bench(key):
        b = ro.Bench.__new__(ro.Bench)
        b.args = ro.argparse.Namespace(model="m", prompt_words=5, max_tokens=2, router="http://r:8000")
        b.http, b.pool, b.next = FakeHttp(), ro.concurrent.futures.ThreadPoolExecutor(max_workers=2), 0
        b.prefills, b.decodes = [("http://p:8100", "http://p:8998", "p-prefill0")], ["http://d:8200"]
        b.auth = ro.auth_headers(key)
        return b

    b = bench("k-123")
    b.direct()
    b.via_router()
    assert sorted(u for u, _ in sent) == ["http://d:8200/v1/completions", "http://p:8100/v1/completions",
                                          "http://r:8000/v1/completions"]
    assert all(h.get("Authorization") == "Bearer k-123" for _, h in sent), sent
    assert all(h["X-Request-Id"].startswith("direct-") for u, h in sent if "/r:" not in u)
    sent.clear()
    bench("").direct()
    assert len(sent) == 2 and not any("Authorization" in h for _, h in sent)


def test_round_order_rotates_so_no_path_always_goes_first():
    assert [ro.round_order(["router", "direct"], i) for i in range(3)] == [
        ["router", "direct"], ["direct", "router"], ["router", "direct"]]
    three = [ro.round_order(["router", "direct", "entry"], i) for i in range(3)]
    assert three == [["router", "direct", "entry"], ["direct", "entry", "router"], ["entry", "router", "direct"]]
    assert sorted(o[0] for o in three) == ["direct", "entry", "router"]


class _FakeBench:
    """Bench without hosts: fixed latencies per path, a decode whose counters show every prompt moved."""
    seconds = {"router": 0.110, "direct": 0.100, "entry": 0.121}

    def __init__(self, args):
        self.calls, self.ext = [], 0.0
        self.prefills, self.decodes = [("http://p:8100", "http://p:8998", "p-prefill0")], ["http://d:8200"]

    def _send(self, path):
        self.calls.append(path)
        if path == "direct":
            self.ext += 300
        return self.seconds[path], {"usage": {"prompt_tokens": 300}}

    def via_router(self):
        return self._send("router")

    def direct(self):
        return self._send("direct")

    def via_entry(self):
        return self._send("entry")

    def decode_counters(self):
        return self.ext, 0.0


def _args(*extra):
    return ["--router", "http://r:8000", "--prefill", "http://p:8100=8998", "--decode", "http://d:8200",
            "--model", "m", "--requests", "4", "--warmup", "0"] + list(extra)


def test_run_with_an_entry_times_it_against_the_router(monkeypatch, capsys):
    monkeypatch.setattr(ro, "Bench", _FakeBench)
    monkeypatch.setenv("ENTRY_API_KEY", "e-key")
    assert ro.main(_args("--entry", "https://10.0.0.50:443")) == 0
    out = ro.json.loads(capsys.readouterr().out)
    assert out["entry"]["n"] == out["router"]["n"] == out["direct"]["n"] == 4
    assert out["ratio_entry_over_router"]["p50"] == 1.1 and out["ratio_router_over_direct"]["p50"] == 1.1
    assert out["paired_median_entry_minus_router_ms"] == 11.0
    assert out["entry_url"] == "https://10.0.0.50:443"


def test_run_without_an_entry_has_no_entry_path(monkeypatch, capsys):
    monkeypatch.setattr(ro, "Bench", _FakeBench)
    assert ro.main(_args()) == 0
    out = ro.json.loads(capsys.readouterr().out)
    assert "entry" not in out and "ratio_entry_over_router" not in out


def test_entry_path_sends_the_entry_key_over_https_with_the_entry_ca(monkeypatch):
    """The entry gets a client key of its own (ENTRY_API_KEY), never the routers' key, over a TLS connection
    verified with --entry-ca."""
    made, sent = [], []

    class Conn:
        def __init__(self, host, port, timeout=None, context=None):
            made.append((type(self).__name__, host, port, context))

        def request(self, method, path, body=None, headers=None):
            sent.append((path, dict(headers)))

        def getresponse(self):
            return ro.argparse.Namespace(status=200, read=lambda: b'{"usage": {"prompt_tokens": 300}}')

    class HTTPSConnection(Conn):
        pass

    monkeypatch.setattr(ro.http.client, "HTTPSConnection", HTTPSConnection)
    ctx = ro.ssl.create_default_context()
    b = ro.Bench.__new__(ro.Bench)
    b.args = ro.argparse.Namespace(model="m", prompt_words=5, max_tokens=2, entry="https://10.0.0.50:443")
    b.http = ro.Http(5, ctx)
    b.auth, b.entry_auth = ro.auth_headers("router-key"), ro.auth_headers("entry-key")
    b.via_entry()
    assert made == [("HTTPSConnection", "10.0.0.50", 443, ctx)]
    assert sent[0][0] == "/v1/completions" and sent[0][1]["Authorization"] == "Bearer entry-key"


def test_keys_come_from_the_key_file(tmp_path, monkeypatch, capsys):
    f = tmp_path / "keys.json"
    f.write_text('{"router": "r-key", "entry": "e-key"}')
    assert ro.read_keys(str(f)) == ("r-key", "e-key")
    f.write_text('{"router": "r-key", "entry": ""}')
    assert ro.read_keys(str(f), "", "env-entry") == ("r-key", "env-entry")
    seen = []

    class Recording(_FakeBench):
        def __init__(self, args):
            super().__init__(args)
            seen.append((args.api_key, args.entry_api_key))

    monkeypatch.setattr(ro, "Bench", Recording)
    f.write_text('{"router": "r-key", "entry": "e-key"}')
    assert ro.main(_args("--key-file", str(f), "--entry", "https://10.0.0.50:443")) == 0
    assert seen == [("r-key", "e-key")]
    assert "r-key" not in capsys.readouterr().out
