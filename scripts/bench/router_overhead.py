#!/usr/bin/env python3
"""Router overhead: the same requests through vllm-router and through direct PD orchestration (and, with
--entry, through the entry: HAProxy behind the VIP, in front of the routers).

Runs on a cluster host (the router host; vLLM ports admit cluster hosts only), standard library only.
The direct path speaks vLLM's P2P MooncakeConnector protocol itself, field for field what
vllm-router 0.1.17 sends (captured on the wire in the lab; docs/benchmarks.md):

  prefill  <- the request with max_tokens=1, min_tokens=1, stream=false and
              kv_transfer_params {do_remote_decode: true, do_remote_prefill: false, transfer_id}
  decode   <- the request with
              kv_transfer_params {do_remote_decode: false, do_remote_prefill: true, transfer_id,
                                  remote_bootstrap_addr: http://P:<bootstrap>, remote_engine_id}

both sent at the same time, sharing transfer_id ("xfer-<uuid4>") and X-Request-Id; remote_engine_id
comes from the prefill's bootstrap server (GET /query, dp rank 0), as the router reads it at start.
Prefill and decode are picked round robin, as the bundle's router is configured.

1. proof: a few direct requests alone; decode's /metrics must show the prompt tokens arriving by
   KV transfer (vllm:prompt_tokens_by_source_total{source="external_kv_transfer"} rises), or exit 3.
2. timing: N rounds, each one request through the router and one direct (and one through the entry),
   the order rotating from round to round, sequential (one request in flight), unique prompts of one
   length (no prefix-cache hits).
Prints one JSON document: p50/p99/mean latency per path, the router/direct ratios and, with --entry, the
entry/router ratios (what HAProxy and the VIP add in front of the router).

  router_overhead.py --router http://127.0.0.1:8000 --prefill http://10.0.0.1:8100=8998 \
      --decode http://10.0.0.3:8200 --model m --requests 40 [--entry https://10.0.0.50:443 --entry-ca ca.crt]

Keys are on no command line: --key-file (a 0600 JSON file {"router": KEY, "entry": KEY}, what the playbook
writes), else the environment (ROUTER_API_KEY, ENTRY_API_KEY). Nothing this script prints or raises holds one.
"""

import argparse
import concurrent.futures
import http.client
import json
import os
import ssl
import sys
import threading
import time
import urllib.parse
import uuid

METRIC = "vllm:prompt_tokens_by_source_total"
BODY = ("The prefill host computes the key value cache for token {i} and the decode host receives it "
        "over the transfer engine.")


# ---- pure parts (tests/unit/test_router_overhead.py) -------------------------------------------

def percentile(values, q):
    """Linear-interpolated percentile (numpy's default), q in 0..100."""
    vals = sorted(values)
    if not vals:
        raise ValueError("no values")
    pos = (len(vals) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(vals) - 1)
    return vals[lo] + (vals[hi] - vals[lo]) * (pos - lo)


def summarize(latencies_s):
    ms = [x * 1000.0 for x in latencies_s]
    return {"n": len(ms), "p50_ms": round(percentile(ms, 50), 2), "p99_ms": round(percentile(ms, 99), 2),
            "mean_ms": round(sum(ms) / len(ms), 2)}


def paired_delta_ms(router_s, direct_s):
    """Median of the per-round differences router - direct (ms): each round ran both back to back, so a
    drift in the hosts' load cancels out of it, unlike out of the two p50s."""
    return round(percentile([(r - d) * 1000.0 for r, d in zip(router_s, direct_s)], 50), 2)


def ratios(router, direct):
    return {k: round(router[k + "_ms"] / direct[k + "_ms"], 4) for k in ("p50", "p99", "mean")}


def round_order(paths, i):
    """The paths of round i, rotated by i: each path goes first (and last) as often as the others, so a path
    gains nothing from where it stands in a round (two paths: alternating)."""
    k = i % len(paths)
    return list(paths[k:]) + list(paths[:k])


def parse_prefill(spec):
    """'http://10.0.0.1:8100=8998' -> (base URL, bootstrap address http://10.0.0.1:8998)."""
    url, sep, port = spec.partition("=")
    if not sep or not port.isdigit():
        raise ValueError("prefill must be URL=BOOTSTRAP_PORT, got %r" % spec)
    host = urllib.parse.urlsplit(url).hostname
    return url.rstrip("/"), "http://%s:%s" % (host, port)


def engine_id_from_query(doc):
    """The engine id of dp rank 0 in a bootstrap /query answer {"0": {"engine_id": ..., "worker_addr": ...}}."""
    entry = doc.get("0", doc.get(0)) if isinstance(doc, dict) else None
    if not entry or not entry.get("engine_id"):
        raise ValueError("bootstrap /query answer has no dp rank 0 engine_id: %r" % (doc,))
    return entry["engine_id"]


def pd_bodies(request, transfer_id, bootstrap_addr, engine_id):
    """(prefill body, decode body) for one request, as vllm-router sends them in mooncake mode."""
    prefill = dict(request, max_tokens=1, min_tokens=1, stream=False,
                   kv_transfer_params={"do_remote_decode": True, "do_remote_prefill": False,
                                       "transfer_id": transfer_id})
    decode = dict(request, kv_transfer_params={"do_remote_decode": False, "do_remote_prefill": True,
                                               "transfer_id": transfer_id,
                                               "remote_bootstrap_addr": bootstrap_addr,
                                               "remote_engine_id": engine_id})
    return prefill, decode


def auth_headers(api_key):
    """The Authorization header for the router and the vLLM instances ({} without a key)."""
    return {"Authorization": "Bearer " + api_key} if api_key else {}


def metric_sum(text, name, labels):
    """Sum of a Prometheus counter's samples whose labels include `labels`."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        lab, _, val = line.partition("} ")
        if all('%s="%s"' % kv in lab for kv in labels.items()):
            total += float(val.split()[0])
    return total


def read_keys(path, router_key="", entry_key=""):
    """(router key, entry key) from the JSON key file {"router": ..., "entry": ...}; a missing or empty field
    keeps the given default."""
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    return doc.get("router") or router_key, doc.get("entry") or entry_key


def make_prompt(nonce, words):
    """A prompt of a fixed shape led by a unique nonce (no prefix-cache hits across requests)."""
    parts = ["Request", "%s." % nonce]
    i = 0
    while len(parts) < words:
        parts.extend(BODY.format(i=i).split())
        i += 1
    return " ".join(parts[:words])


# ---- I/O ---------------------------------------------------------------------------------------

class Http:
    """Keep-alive connections per thread and per host (the router pools its backend connections too)."""

    def __init__(self, timeout, tls=None):
        self.timeout = timeout
        self.tls = tls  # the ssl context of https URLs (the entry's CA), else the system's CAs
        self.local = threading.local()

    def request(self, method, url, body=None, headers=None):
        parts = urllib.parse.urlsplit(url)
        conns = self.local.__dict__.setdefault("conns", {})
        key = (parts.scheme, parts.hostname, parts.port)
        data = None if body is None else json.dumps(body).encode()
        hdrs = {"Content-Type": "application/json"} if data is not None else {}
        hdrs.update(headers or {})
        for attempt in (1, 2):
            conn = conns.get(key)
            if conn is None and parts.scheme == "https":
                conn = conns[key] = http.client.HTTPSConnection(parts.hostname, parts.port, timeout=self.timeout,
                                                                context=self.tls or ssl.create_default_context())
            elif conn is None:
                conn = conns[key] = http.client.HTTPConnection(parts.hostname, parts.port, timeout=self.timeout)
            try:
                conn.request(method, parts.path or "/", body=data, headers=hdrs)
                resp = conn.getresponse()
                payload = resp.read()
            except (http.client.HTTPException, OSError):
                conn.close()
                conns.pop(key, None)
                if attempt == 2:
                    raise
                continue
            if resp.status != 200:
                raise RuntimeError("%s %s -> HTTP %s: %s" % (method, url, resp.status, payload[:300]))
            return payload


class Bench:
    def __init__(self, args):
        self.args = args
        self.http = Http(args.timeout, ssl.create_default_context(cafile=args.entry_ca) if args.entry_ca else None)
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=2)
        self.prefills = []
        for spec in args.prefill:
            url, bootstrap = parse_prefill(spec)
            doc = json.loads(self.http.request("GET", bootstrap + "/query"))
            self.prefills.append((url, bootstrap, engine_id_from_query(doc)))
        self.decodes = [d.rstrip("/") for d in args.decode]
        self.next = 0
        # The routers' key: the router gets it, and so does every vLLM instance, which demands it on /v1/*.
        self.auth = auth_headers(args.api_key)
        # The entry takes a client key of its own (entry_keys) and puts the routers' key on what it forwards.
        self.entry_auth = auth_headers(args.entry_api_key)

    def request(self):
        return {"model": self.args.model, "prompt": make_prompt(uuid.uuid4().hex, self.args.prompt_words),
                "max_tokens": self.args.max_tokens, "temperature": 0.0, "ignore_eos": True}

    def _completion(self, base, auth):
        """(seconds, response) of one completion at base (a router, or the entry) with its auth headers."""
        req = self.request()
        t0 = time.perf_counter()
        out = json.loads(self.http.request("POST", base.rstrip("/") + "/v1/completions", req, auth))
        return time.perf_counter() - t0, out

    def via_router(self):
        return self._completion(self.args.router, self.auth)

    def via_entry(self):
        return self._completion(self.args.entry, self.entry_auth)

    def direct(self):
        p_url, bootstrap, engine_id = self.prefills[self.next % len(self.prefills)]
        d_url = self.decodes[self.next % len(self.decodes)]
        self.next += 1
        xfer = "xfer-%s" % uuid.uuid4()
        headers = {"X-Request-Id": "direct-%s" % uuid.uuid4().hex, **self.auth}
        p_body, d_body = pd_bodies(self.request(), xfer, bootstrap, engine_id)
        t0 = time.perf_counter()
        p_fut = self.pool.submit(self.http.request, "POST", p_url + "/v1/completions", p_body, headers)
        d_fut = self.pool.submit(self.http.request, "POST", d_url + "/v1/completions", d_body, headers)
        out = json.loads(d_fut.result())
        p_fut.result()
        return time.perf_counter() - t0, out

    def decode_counters(self):
        ext = local = 0.0
        for d in self.decodes:
            text = self.http.request("GET", d + "/metrics").decode()
            ext += metric_sum(text, METRIC, {"source": "external_kv_transfer"})
            local += metric_sum(text, METRIC, {"source": "local_compute"})
        return ext, local


def run(args):
    bench = Bench(args)
    send = {"router": bench.via_router, "direct": bench.direct, "entry": bench.via_entry}
    paths = ["router", "direct"] + (["entry"] if args.entry else [])
    for _ in range(args.warmup):
        for path in paths:
            send[path]()

    # 1. proof: the direct path really moves KV (decode computes next to nothing of the prompt)
    ext0, local0 = bench.decode_counters()
    prompt_tokens = 0
    for _ in range(max(1, len(bench.decodes))):
        _, out = bench.direct()
        prompt_tokens += out["usage"]["prompt_tokens"]
    deadline = time.time() + 20
    while True:  # counters are published a moment after the response
        ext1, local1 = bench.decode_counters()
        if ext1 - ext0 >= prompt_tokens - 2 * len(bench.decodes) or time.time() > deadline:
            break
        time.sleep(1)
    proof = {"prompt_tokens": prompt_tokens, "external_kv_transfer": ext1 - ext0, "local_compute": local1 - local0}
    # decode may recompute the last token of each prompt; everything else must arrive by transfer
    proof["ok"] = proof["external_kv_transfer"] >= prompt_tokens - 2 * len(bench.decodes)

    # 2. timing, interleaved: one round = one request per path, the order rotating (round_order)
    lat = {path: [] for path in paths}
    for i in range(args.requests):
        for path in round_order(paths, i):
            seconds, _ = send[path]()
            lat[path].append(seconds)
    router, direct = summarize(lat["router"]), summarize(lat["direct"])
    result = {"requests_per_path": args.requests, "prompt_words": args.prompt_words, "max_tokens": args.max_tokens,
              "router": router, "direct": direct, "ratio_router_over_direct": ratios(router, direct),
              "paired_median_delta_ms": paired_delta_ms(lat["router"], lat["direct"]),
              "kv_proof": proof, "prefills": [p[0] for p in bench.prefills], "decodes": bench.decodes}
    if args.entry:
        entry = summarize(lat["entry"])
        result.update({"entry": entry, "entry_url": args.entry, "ratio_entry_over_router": ratios(entry, router),
                       "paired_median_entry_minus_router_ms": paired_delta_ms(lat["entry"], lat["router"])})
    return result


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--router", required=True, help="router base URL, e.g. http://127.0.0.1:8000")
    ap.add_argument("--prefill", action="append", required=True, help="URL=BOOTSTRAP_PORT, repeatable")
    ap.add_argument("--decode", action="append", required=True, help="URL, repeatable")
    ap.add_argument("--model", required=True)
    ap.add_argument("--requests", type=int, default=40, help="requests per path")
    ap.add_argument("--warmup", type=int, default=2, help="warm-up rounds, not counted")
    ap.add_argument("--prompt-words", type=int, default=200)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--timeout", type=float, default=120, help="seconds per HTTP request")
    ap.add_argument("--api-key", default=os.environ.get("ROUTER_API_KEY", ""),
                    help="the routers' API key, which the vLLM instances demand too (default: $ROUTER_API_KEY)")
    ap.add_argument("--entry", default="", help="the entry's base URL (https://VIP:PORT): time it too")
    ap.add_argument("--entry-ca", default="", help="CA certificate that verifies the entry (default: the system's CAs)")
    ap.add_argument("--entry-api-key", default=os.environ.get("ENTRY_API_KEY", ""),
                    help="a client key of the entry (default: $ENTRY_API_KEY)")
    ap.add_argument("--key-file", default="",
                    help='JSON {"router": KEY, "entry": KEY} (0600): the keys, instead of the environment')
    args = ap.parse_args(argv)
    if args.key_file:
        args.api_key, args.entry_api_key = read_keys(args.key_file, args.api_key, args.entry_api_key)
    result = run(args)
    print(json.dumps(result))
    return 0 if result["kv_proof"]["ok"] else 3


if __name__ == "__main__":
    sys.exit(main())
