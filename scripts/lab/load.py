#!/usr/bin/env python3
"""Steady request load through the router, counting failures (stdlib only).

Used by the fault drills and the rolling-restart proof: a few workers send completions in a
loop until the duration ends or the stop file appears, and every request is recorded with its
start time, latency and outcome. A request fails on any transport error, a non-200 status, or a
200 without generated text.

    PD_CLIENT_KEY=... PD_CLIENT_CA=ca.crt load.py --url https://172.30.0.50 --model tiny-llama --workers 2 \\
        --stop-file /tmp/stop --out /tmp/load.json

The key (Bearer) comes from the environment only, so it is on no command line; an https URL is verified
against PD_CLIENT_CA (the entry's CA) when set, else the system's CAs.
"""
import argparse
import functools
import json
import os
import ssl
import threading
import time
import urllib.error
import urllib.request


@functools.lru_cache(maxsize=4)
def _tls_for(ca):
    return ssl.create_default_context(cafile=ca or None)


def _tls():
    """The TLS context of https URLs: PD_CLIENT_CA (the entry's CA) when set, else the system's CAs."""
    return _tls_for(os.environ.get("PD_CLIENT_CA", ""))


def one_request(url, model, prompt, max_tokens, timeout, api_key=None):
    """Send one completion; return (ok, detail)."""
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens,
                       "temperature": 0}).encode()
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    req = urllib.request.Request(f"{url}/v1/completions", data=body, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=_tls() if url.startswith("https:") else None) as resp:
            data = json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return False, f"HTTP {exc.code}: {exc.read()[:200]!r}"
    except Exception as exc:  # noqa: BLE001 - every transport error counts as a failure
        return False, f"{type(exc).__name__}: {exc}"
    choices = data.get("choices") or []
    if not choices or not choices[0].get("text"):
        return False, f"no text in response: {str(data)[:200]}"
    return True, ""


def serves(url, model, api_key="", n=3, prompt="probe " * 40, timeout=60):
    """n requests in a row succeed (a short prompt, 4 tokens each)."""
    return all(one_request(url, model, prompt, 4, timeout, api_key)[0] for _ in range(n))


def until_serving(url, model, api_key="", limit=300, step=5, prompt="probe " * 40):
    """Seconds until serves() is true, or None after limit seconds: a step before (a unit just
    restarted, its first requests slow on CPU) may still be settling."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit:
        if serves(url, model, api_key, prompt=prompt):
            return time.monotonic() - t0
        time.sleep(step)
    return None


SLOW_S = 30  # a request slower than this is listed (the transfer engine's TCP status timeout)


def summarize(records):
    """Totals, latency percentiles of the successful requests, the failures and the slow ones."""
    failed = [r for r in records if not r["ok"]]
    lat = sorted(r["latency"] for r in records if r["ok"] and "latency" in r)

    def pct(q):
        return round(lat[min(len(lat) - 1, int(q * len(lat)))], 2) if lat else None
    return {
        "requests": len(records),
        "failed": len(failed),
        "succeeded": len(records) - len(failed),
        "latency_p50_s": pct(0.50),
        "latency_p99_s": pct(0.99),
        "latency_max_s": round(lat[-1], 2) if lat else None,
        "slow": [{"t": round(r["t"], 2), "latency": round(r["latency"], 2)}
                 for r in records if r["ok"] and r.get("latency", 0) > SLOW_S][:50],
        "failures": [{"t": round(r["t"], 2), "error": r["error"]} for r in failed][:200],
    }


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--duration", type=float, default=600, help="upper bound in seconds")
    ap.add_argument("--stop-file", help="stop as soon as this file exists")
    ap.add_argument("--max-tokens", type=int, default=8)
    # Above two of the transfer engine's 30 s TCP timeouts: on the 2-core lab a KV pull can stall
    # while a neighbour vLLM loads its model, then be recomputed; slow is reported, not failed.
    ap.add_argument("--timeout", type=float, default=120)
    ap.add_argument("--pause", type=float, default=0.2, help="seconds between a worker's requests")
    ap.add_argument("--out", required=True, help="JSON summary written here")
    args = ap.parse_args(argv)

    records, lock = [], threading.Lock()
    start, start_wall = time.monotonic(), time.time()
    deadline = start + args.duration

    def running():
        return time.monotonic() < deadline and not (args.stop_file and os.path.exists(args.stop_file))

    def worker(wid):
        n = 0
        while running():
            # Over 256 tokens, so whole KV blocks move (CPU block size 128).
            prompt = f"load {wid}-{n} " + "the prefill host computes the KV cache and ships it " * 40
            t0 = time.monotonic()
            ok, err = one_request(args.url, args.model, prompt, args.max_tokens, args.timeout, os.environ.get("PD_CLIENT_KEY", ""))
            with lock:
                records.append({"t": t0 - start, "latency": time.monotonic() - t0, "ok": ok, "error": err})
            n += 1
            time.sleep(args.pause)

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(args.workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    summary = summarize(records)
    summary["seconds"] = round(time.monotonic() - start, 1)
    summary["start_epoch"] = start_wall  # failures' t is relative to it (the drills attribute them)
    with open(args.out, "w", encoding="utf-8") as fh:
        json.dump(summary, fh, indent=2)
    print(json.dumps({k: v for k, v in summary.items() if k not in ("failures", "slow")}
                     | {"slow_over_%ds" % SLOW_S: len(summary["slow"])}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
