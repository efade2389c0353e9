#!/usr/bin/env python3
"""Steady request load through the entry (or the router), counting failures.

Used by the fault drills and the rolling-restart proof: a few workers send completions in a
loop until the duration ends or the stop file appears, and every request is recorded with its
start time, latency and outcome. A request fails on any transport error, a non-200 status, or a
200 without generated text.

The client is what users run (--client sdk, the default): the official `openai` SDK, one client per
worker, so its connections are kept alive between requests (httpx's pool), with max_retries=0 (a
failure the SDK would hide by retrying is counted), every other request streamed (SSE read to its
end). --client urllib opens a new connection per request (stdlib; the probes below use it: a probe
must not ride on a connection the fault left half-dead).

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


def sdk_client(url, timeout, api_key=None):
    """The official SDK's client for the entry (or a router): keep-alive pool, no retries, the entry's CA."""
    import openai  # the lab controller's venv pins it (requirements.txt)
    verify = _tls() if url.startswith("https:") else True
    return openai.OpenAI(base_url=f"{url}/v1", api_key=api_key or "none", max_retries=0, timeout=timeout,
                         http_client=openai.DefaultHttpx2Client(verify=verify, timeout=timeout))


def sdk_request(client, model, prompt, max_tokens, stream=False):
    """Send one completion through the SDK (streamed: every SSE chunk read up to the end); (ok, detail)."""
    try:
        if stream:
            text = "".join((chunk.choices[0].text or "") for chunk in
                           client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens,
                                                     temperature=0, stream=True) if chunk.choices)
        else:
            out = client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens, temperature=0)
            text = out.choices[0].text if out.choices else ""
    except Exception as exc:  # noqa: BLE001 - every SDK error (connection, status, decoding) is a failure
        # The SDK's "Connection error." hides why; its cause says (refused, reset, closed without an answer).
        cause = f" ({type(exc.__cause__).__name__}: {exc.__cause__})" if exc.__cause__ else ""
        return False, f"{type(exc).__name__}: {str(exc)[:200]}{cause[:200]}"
    return (True, "") if text else (False, "no text in response")


# The body of every load prompt, after a tag: over 256 tokens, so whole KV blocks move (CPU block size 128).
PROMPT_BODY = "the prefill host computes the KV cache and ships it " * 40


class OpenLoop:
    """A new completion every `every` s whatever the ones before are doing (a paced client: a hung request does
    not hold the next one back), all through one SDK client, so they share its keep-alive pool as one
    application's threads do; every other one streamed. records: dicts with sent/ended (epoch s), ok, error."""

    def __init__(self, url, model, api_key, every=0.5, timeout=60, max_tokens=8, tag="paced"):
        self.client = sdk_client(url, timeout, api_key)
        self.model, self.every, self.max_tokens, self.tag = model, every, max_tokens, tag
        self.records, self._lock, self._stop = [], threading.Lock(), threading.Event()
        self._threads, self._pacer = [], threading.Thread(target=self._pace, daemon=True)

    def _one(self, n):
        prompt = f"{self.tag} {n} " + PROMPT_BODY
        sent = time.time()
        ok, err = sdk_request(self.client, self.model, prompt, self.max_tokens, stream=n % 2 == 1)
        with self._lock:
            self.records.append({"sent": sent, "ended": time.time(), "ok": ok, "error": err, "stream": n % 2 == 1})

    def _pace(self):
        n = 0
        while not self._stop.wait(0 if n == 0 else self.every):
            t = threading.Thread(target=self._one, args=(n,), daemon=True)
            t.start()
            self._threads.append(t)
            n += 1

    def start(self):
        self._pacer.start()
        return self

    def stop(self, drain_s=90):
        """Stop sending, wait up to drain_s for the requests in flight, return the records."""
        self._stop.set()
        self._pacer.join()
        deadline = time.monotonic() + drain_s
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        with self._lock:
            return sorted(self.records, key=lambda r: r["sent"])


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
        "failures": [{"t": round(r["t"], 2), "latency": round(r.get("latency", 0), 2), "error": r["error"],
                      "stream": bool(r.get("stream"))} for r in failed][:200],
        "streamed": len([r for r in records if r.get("stream")]),
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
    ap.add_argument("--client", choices=("sdk", "urllib"), default="sdk",
                    help="sdk: the official openai SDK, keep-alive, every other request streamed; "
                         "urllib: a new connection per request")
    ap.add_argument("--prompts", type=int, default=0,
                    help="repeat K prompts (0: every prompt new), as users repeat a system prompt or a conversation")
    ap.add_argument("--spans", action="store_true", help="also write every request's [sent, ended, ok]")
    ap.add_argument("--out", required=True, help="JSON summary written here")
    args = ap.parse_args(argv)

    records, lock = [], threading.Lock()
    start, start_wall = time.monotonic(), time.time()
    deadline = start + args.duration

    def running():
        return time.monotonic() < deadline and not (args.stop_file and os.path.exists(args.stop_file))

    key = os.environ.get("PD_CLIENT_KEY", "")

    def worker(wid):
        n = 0
        client = sdk_client(args.url, args.timeout, key) if args.client == "sdk" else None
        while running():
            # --prompts K: every worker cycles through the same K prompts (prefix-cache hits on every instance).
            tag = f"{n % args.prompts}" if args.prompts else f"{wid}-{n}"
            prompt = f"load {tag} " + PROMPT_BODY
            stream = client is not None and n % 2 == 1
            t0 = time.monotonic()
            if client is not None:
                ok, err = sdk_request(client, args.model, prompt, args.max_tokens, stream=stream)
            else:
                ok, err = one_request(args.url, args.model, prompt, args.max_tokens, args.timeout, key)
            with lock:
                records.append({"t": t0 - start, "latency": time.monotonic() - t0, "ok": ok, "error": err,
                                "stream": stream})
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
    if args.spans:  # every request's [sent, ended, ok, streamed], relative to start_epoch (the drills' classes)
        summary["spans"] = [[round(r["t"], 2), round(r["t"] + r["latency"], 2), r["ok"], bool(r.get("stream"))]
                            for r in records]
    with open(args.out, "w", encoding="utf-8") as fh:
        json.dump(summary, fh, indent=2)
    print(json.dumps({k: v for k, v in summary.items() if k not in ("failures", "slow", "spans")}
                     | {"slow_over_%ds" % SLOW_S: len(summary["slow"])}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
