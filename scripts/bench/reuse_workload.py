#!/usr/bin/env python3
"""The reuse workload (issue 31): many conversations, each with its own long opening, several turns; and the
counts that say how much prefill work the fleet's caches saved. Standard library only: it runs on any host
(playbooks/benchmark.yml copies it to a router host) and scripts/lab/reuse.py imports it for the CI step.

  - every turn's prompt is the conversation so far (opening, earlier questions and the model's answers) plus a
    new question, temperature 0; the conversations' turns interleaved (turn 1 of every conversation in a seeded
    shuffled order, then turn 2, ...), `concurrency` conversations in flight, as users' traffic is;
  - computed: the rise of the prefill instances' vllm:prompt_tokens_by_source_total{source="local_compute"};
  - perfect: what a cache that computed every distinct prefix block once would have computed
    (perfect_cache_tokens over vLLM's own token ids, /tokenize on a prefill instance);
  - the store tier's share: the prefills' source="external_kv_transfer" (blocks another prefill computed, loaded
    from the Mooncake store); decode's external_kv_transfer is the P2P hand-off.

As a benchmark driver (one run, one router URL; the playbook starts one router per policy):
    reuse_workload.py --url http://127.0.0.1:8002 --model M --tokenize-url http://P:8100/tokenize \\
        --prefill-metrics http://P:8100/metrics ... --decode-metrics http://D:8200/metrics ... --out run.json
It streams each request (TTFT = first streamed text) and writes the counts, TTFT p50/p99 and requests/s.
"""
import argparse
import json
import math
import os
import random
import re
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

DECISION_RE = re.compile(r'^vllm_router_prefix_routing_decisions_total\{[^}]*outcome="([^"]+)"[^}]*\}\s+(\S+)', re.M)
SOURCE_RE = re.compile(r'^vllm:prompt_tokens_by_source_total\{([^}]*)\}\s+(\S+)', re.M)
BLOCK_RE = re.compile(r'^vllm:cache_config_info\{[^}]*\bblock_size="(\d+)"', re.M)
# Words for the openings: a fixed list, drawn per conversation and run, so each opening is its own text.
WORDS = ("prefill decode cache block tensor router entry fleet engine transfer request token prompt answer "
         "memory segment master store host rack switch fabric queue batch stream latency budget window turn "
         "offset vector layer weight model shard replica region volume ledger harbor orbit signal").split()


def parse_sources(text):
    """{source: tokens} summed over the instance's series (one per model/engine) of a /metrics text."""
    out = {}
    for labels, value in SOURCE_RE.findall(text or ""):
        m = re.search(r'source="([^"]+)"', labels)
        if m:
            out[m.group(1)] = out.get(m.group(1), 0.0) + float(value)
    return out


def decisions(text):
    """{outcome: count} of a router's prefix-routing decisions (prefix_hit, prefix_miss, missing_tokens, ...)."""
    out = {}
    for outcome, value in DECISION_RE.findall(text or ""):
        out[outcome] = out.get(outcome, 0.0) + float(value)
    return out


def decisions_delta(after, before):
    """The decisions a router made between two decisions() readings (outcomes that did not move left out)."""
    return {k: v - before.get(k, 0.0) for k, v in after.items() if v - before.get(k, 0.0)}


def block_size_of(text):
    m = BLOCK_RE.search(text or "")
    return int(m.group(1)) if m else None


def perfect_cache_tokens(prompts, block_size):
    """Tokens a fleet-wide cache that keeps every block computes for these prompts, in order: each prompt's
    length minus its longest run of whole leading blocks seen before (a hit covers at most length - 1 tokens,
    as in vLLM: the last token is always computed). A block is known by its whole prefix (a chained hash)."""
    seen, total = set(), 0
    for ids in prompts:
        chain, key = [], None
        for start in range(0, len(ids) - block_size + 1, block_size):
            key = hash((key, tuple(ids[start:start + block_size])))
            chain.append(key)
        usable, hit = (len(ids) - 1) // block_size, 0
        while hit < min(usable, len(chain)) and chain[hit] in seen:
            hit += 1
        seen.update(chain)
        total += len(ids) - hit * block_size
    return total


def delta(after, before, source):
    """The rise of one source's tokens, summed over instances ({instance: {source: tokens}} snapshots)."""
    return sum(after[k].get(source, 0.0) - before.get(k, {}).get(source, 0.0) for k in after)


def opening(conv, nonce, words):
    rnd = random.Random(f"{nonce}-{conv}")
    return f"Conversation {conv} ({nonce}). " + " ".join(rnd.choice(WORDS) for _ in range(words))


def run(send, conversations, turns, words, nonce, concurrency=1):
    """The interleaved turns, `concurrency` at a time (users in parallel: a router that balances load sees load);
    a round (one turn of every conversation) ends before the next begins. send(prompt) -> (answer, error,
    ttft seconds or None). Returns (prompts in send order, records)."""
    history = {c: opening(c, nonce, words) for c in range(conversations)}
    prompts, records = [], []

    def one(c, t):
        prompt = history[c] + f"\nUser: question {t + 1} of conversation {c}?\nAssistant:"
        t0 = time.monotonic()
        answer, err, ttft = send(prompt)
        return c, prompt, answer, {"conversation": c, "turn": t + 1, "ok": not err, "error": err,
                                   "ttft": None if ttft is None else round(ttft, 4),
                                   "latency": round(time.monotonic() - t0, 2)}
    with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
        for t in range(turns):
            # users do not take turns in a fixed order: each round in its own (seeded, so every run the same)
            # order. A fixed order would hand round_robin a conversation's every turn on one instance by parity.
            order = list(range(conversations))
            random.Random(f"round-{t}").shuffle(order)
            for c, prompt, answer, rec in pool.map(lambda c: one(c, t), order):
                prompts.append(prompt)
                records.append(rec)
                history[c] = prompt + answer
    return prompts, records


def percentile(values, q):
    """The q-th percentile (0-100) by nearest rank; None without values."""
    vals = sorted(v for v in values if v is not None)
    if not vals:
        return None
    return vals[min(len(vals) - 1, max(0, math.ceil(q / 100.0 * len(vals)) - 1))]


def summarize(prompts_ids, records, block, before_p, after_p, before_d, after_d, seconds):
    """The counts of one run (shared by the CI step and the benchmark)."""
    failed = [x for x in records if not x["ok"]]
    r = {"block_size": block, "requests": len(records), "failed": len(failed), "failures": failed[:10],
         "prompt_tokens": sum(len(x) for x in prompts_ids), "perfect_tokens": perfect_cache_tokens(prompts_ids, block),
         "computed_tokens": delta(after_p, before_p, "local_compute"),
         "prefill_cache_hit_tokens": delta(after_p, before_p, "local_cache_hit"),
         # a prefill's external source is the store tier (vllm_store_tier): blocks another prefill computed
         "prefill_store_tokens": delta(after_p, before_p, "external_kv_transfer"),
         "prefill_computed_by_instance": {k: after_p[k].get("local_compute", 0) - before_p.get(k, {}).get("local_compute", 0)
                                          for k in after_p},
         "decode_by_transfer": delta(after_d, before_d, "external_kv_transfer"),
         "decode_local_hit": delta(after_d, before_d, "local_cache_hit"),
         "decode_local_compute": delta(after_d, before_d, "local_compute"),
         "seconds": round(seconds, 1), "requests_per_s": round(len(records) / seconds, 3) if seconds else None,
         "latency_p50_s": percentile([x["latency"] for x in records], 50),
         "ttft_p50_ms": None, "ttft_p99_ms": None}
    ttfts = [x["ttft"] for x in records if x.get("ttft") is not None]
    if ttfts:
        r["ttft_p50_ms"] = round(percentile(ttfts, 50) * 1000, 1)
        r["ttft_p99_ms"] = round(percentile(ttfts, 99) * 1000, 1)
    r["computed_over_perfect"] = round(r["computed_tokens"] / r["perfect_tokens"], 3) if r["perfect_tokens"] else None
    return r


# ---- the benchmark driver: plain HTTP from a fleet host ----------------------------------------------------

def _get(url, timeout=15):
    with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 - the fleet's own cluster URLs
        return resp.read().decode()


def _post(url, body, timeout, headers=None):
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers=dict(headers or {}, **{"Content-Type": "application/json"}))
    return urllib.request.urlopen(req, timeout=timeout)  # noqa: S310


def streaming_sender(url, model, max_tokens, timeout, api_key=""):
    """send(prompt) for run(): a streamed /v1/completions through the router; TTFT is the first text chunk.
    api_key: the routers' worker key, sent as the entry sends it (templates/entry/haproxy.cfg.j2). vllm-router
    0.1.17 passes the request's Authorization on to the prefill's /v1/completions/render: without it the render
    answers 401 and cache_aware routes by load only (its decisions say missing_tokens)."""
    headers = {"Authorization": "Bearer " + api_key} if api_key else {}

    def send(prompt):
        t0 = time.monotonic()
        ttft, parts = None, []
        try:
            with _post(url.rstrip("/") + "/v1/completions",
                       {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                        "stream": True}, timeout, headers) as resp:
                for raw in resp:
                    line = raw.decode().strip()
                    if not line.startswith("data:") or line == "data: [DONE]":
                        continue
                    choices = json.loads(line[5:]).get("choices") or []
                    text = choices[0].get("text", "") if choices else ""
                    if text and ttft is None:
                        ttft = time.monotonic() - t0
                    parts.append(text)
            return "".join(parts), "", ttft
        except Exception as exc:  # noqa: BLE001 - every error is a failed request
            return "", f"{type(exc).__name__}: {str(exc)[:200]}", ttft
    return send


def tokenize(url, prompts, timeout=30):
    """vLLM's own token ids of each prompt (/tokenize, outside /v1: no key)."""
    out = []
    for p in prompts:
        with _post(url, {"prompt": p}, timeout) as resp:
            out.append(json.loads(resp.read())["tokens"])
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description="One run of the reuse workload through one router (benchmark).")
    ap.add_argument("--url", required=True, help="the router (http://host:port)")
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokenize-url", required=True)
    ap.add_argument("--prefill-metrics", nargs="+", required=True)
    ap.add_argument("--decode-metrics", nargs="+", required=True)
    ap.add_argument("--router-metrics", default="", help="the router's /metrics: its prefix-routing decisions")
    ap.add_argument("--conversations", type=int, default=12)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--words", type=int, default=450)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--label", default="")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)

    def snapshot(urls):
        return {u: parse_sources(_get(u)) for u in urls}
    block = block_size_of(_get(args.prefill_metrics[0]))
    if not block:
        print(f"no vllm:cache_config_info block_size at {args.prefill_metrics[0]}", file=sys.stderr)
        return 2
    before_p, before_d = snapshot(args.prefill_metrics), snapshot(args.decode_metrics)
    before_r = decisions(_get(args.router_metrics)) if args.router_metrics else {}
    nonce = f"{args.label}-{time.time_ns()}"
    t0 = time.monotonic()
    # the key from the environment (PD_ROUTER_API_KEY, as the entry's HAProxy reads it): never on argv
    key = os.environ.get("PD_ROUTER_API_KEY", "")
    prompts, records = run(streaming_sender(args.url, args.model, args.max_tokens, args.timeout, key),
                           args.conversations, args.turns, args.words, nonce, args.concurrency)
    seconds = time.monotonic() - t0
    time.sleep(2)  # the counters are updated when a request finishes; give the last one a moment
    after_p, after_d = snapshot(args.prefill_metrics), snapshot(args.decode_metrics)
    r = summarize(tokenize(args.tokenize_url, prompts), records, block, before_p, after_p, before_d, after_d, seconds)
    r.update(label=args.label, conversations=args.conversations, turns=args.turns, concurrency=args.concurrency)
    if args.router_metrics:
        r["router_decisions"] = decisions_delta(decisions(_get(args.router_metrics)), before_r)
    with open(args.out, "w", encoding="utf-8") as fh:
        json.dump(r, fh, indent=2)
    print(json.dumps({k: r[k] for k in ("label", "requests", "failed", "computed_over_perfect", "prefill_store_tokens",
                                        "ttft_p50_ms", "ttft_p99_ms", "requests_per_s", "router_decisions") if k in r}))
    return 1 if r["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
