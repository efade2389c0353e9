#!/usr/bin/env python3
"""The reuse workload: many conversations, each with its own long opening, several turns, through the entry.

How much prefill work the fleet's routing saves, counted, not timed (issue 31):
  - every turn's prompt is the conversation so far (opening, earlier questions and the model's answers) plus a
    new question, sent with the official openai SDK (one keep-alive client, temperature 0), the conversations'
    turns interleaved (turn 1 of every conversation, then turn 2 of every one, ...), as users' traffic is;
  - computed: what the prefill instances computed themselves, the rise of their
    vllm:prompt_tokens_by_source_total{source="local_compute"} over the run;
  - perfect: what a cache that computed every distinct prefix block once would have computed. Each prompt is
    tokenized by vLLM itself (/tokenize on a prefill instance); a prompt's cached part is its longest run of
    whole blocks (the instances' own block size, vllm:cache_config_info) already seen in an earlier prompt of
    the run, counted as vLLM counts a hit (at most the prompt's length minus one token);
  - the goal (--goal, default 1.15): computed <= goal x perfect. Missed: exit 1.
The openings carry a per-run nonce, so nothing cached by an earlier run counts. Also reported: decode's tokens
by transfer and by its own cache, and the time per turn (only reported: the machine is noisy).

    reuse.py --scenario default --out lab-results/reuse.json [--conversations 8 --turns 3 --goal 1.15]
Lab-only: it reads each instance's /metrics and /tokenize with `docker exec` (the cluster ports are firewalled
from the controller) and sends the workload where users do (labinv client-url).
"""
import argparse
import json
import os
import random
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import load  # noqa: E402  (scripts/lab/load.py: the SDK client)
from drills import DOCKER, http_get  # noqa: E402  (the docker client; a GET from inside a lab container)
from labinv import Lab  # noqa: E402

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


def reuse_problems(r, goal):
    """The run against its goal: [] when prefill computed at most goal x the perfect cache."""
    if r.get("failed"):
        return [f"{r['failed']} of {r['requests']} requests failed: {r['failures'][:3]}"]
    if not r.get("perfect_tokens"):
        return ["no perfect-cache count (no prompt was tokenized)"]
    if r.get("computed_tokens") is None:
        return ["no prefill metrics were read"]
    ratio = r["computed_tokens"] / r["perfect_tokens"]
    if ratio > goal:
        return [f"prefill computed {r['computed_tokens']:.0f} prompt tokens, {ratio:.2f}x the perfect cache's "
                f"{r['perfect_tokens']} (goal <= {goal}x, policy {r.get('policy')})"]
    return []


def metrics(host, port, lab):
    """The /metrics text at host's own address and port, read inside host (drills.http_get); raises if unread."""
    text = http_get(host, f"http://{lab.ips[host]}:{port}/metrics", timeout=10)
    if text is None:
        raise RuntimeError(f"{host}: no answer from :{port}/metrics")
    return text


def tokenize(host, port, lab, prompts):
    """vLLM's own token ids of each prompt (/tokenize, outside /v1: no key), asked on the instance's host."""
    ip = lab.ips[host]
    code = ("import json,sys,urllib.request\n"
            "out=[]\n"
            "for p in json.load(sys.stdin):\n"
            f"    r=urllib.request.Request('http://{ip}:{port}/tokenize',data=json.dumps({{'prompt':p}}).encode(),"
            "headers={'Content-Type':'application/json'})\n"
            "    out.append(json.loads(urllib.request.urlopen(r,timeout=30).read())['tokens'])\n"
            "json.dump(out,sys.stdout)")
    res = subprocess.run([DOCKER, "exec", "-i", host, "python3", "-c", code], input=json.dumps(prompts),
                         capture_output=True, text=True, timeout=300)
    if res.returncode != 0:
        raise RuntimeError(f"{host}: /tokenize: {res.stderr.strip()[-300:]}")
    return json.loads(res.stdout)


def opening(conv, nonce, words):
    rnd = random.Random(f"{nonce}-{conv}")
    return f"Conversation {conv} ({nonce}). " + " ".join(rnd.choice(WORDS) for _ in range(words))


def run(client, model, conversations, turns, words, max_tokens, nonce, concurrency=1):
    """The interleaved turns, `concurrency` at a time (users in parallel: a router that balances load sees load);
    a round (one turn of every conversation) ends before the next begins. Returns (prompts in send order,
    records)."""
    history = {c: opening(c, nonce, words) for c in range(conversations)}
    prompts, records = [], []

    def one(c, t):
        prompt = history[c] + f"\nUser: question {t + 1} of conversation {c}?\nAssistant:"
        t0 = time.monotonic()
        try:
            out = client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens, temperature=0)
            answer, err = (out.choices[0].text if out.choices else ""), ""
        except Exception as exc:  # noqa: BLE001 - every SDK error is a failed request
            answer, err = "", f"{type(exc).__name__}: {str(exc)[:200]}"
        return c, prompt, answer, {"conversation": c, "turn": t + 1, "ok": not err, "error": err,
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


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default="default")
    ap.add_argument("--conversations", type=int, default=12)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--words", type=int, default=450, help="opening length in words (about 3 tokens each with the lab tokenizer)")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--concurrency", type=int, default=4, help="conversations in flight at once")
    ap.add_argument("--goal", type=float, default=1.15)
    ap.add_argument("--no-goal", action="store_true", help="report only (the benchmark's other policies)")
    ap.add_argument("--label", default="")
    ap.add_argument("--policy", default="", help="the routers' prefill policy when a converge set it with -e (else the inventory's)")
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    lab = Lab(args.scenario)
    model = lab.var("vllm_served_model_name")
    prefills = lab.instances(("vllm_prefill",))
    decodes = lab.instances(("vllm_decode",))

    def snapshot(insts):
        return {f"{h}:{p}": parse_sources(metrics(h, p, lab)) for h, _, p in insts}
    block = block_size_of(metrics(prefills[0][0], prefills[0][2], lab))
    routers = lab.hosts("vllm_router")

    def router_decisions():
        return {h: decisions(metrics(h, lab.var("vllm_router_prometheus_port"), lab)) for h in routers}
    before_r = router_decisions()
    before_p, before_d = snapshot(prefills), snapshot(decodes)
    os.environ.setdefault("PD_CLIENT_CA", lab.client_ca())
    client = load.sdk_client(lab.client_url(), 120, lab.client_key())
    nonce = f"{int(time.time())}"
    t0 = time.monotonic()
    prompts, records = run(client, model, args.conversations, args.turns, args.words, args.max_tokens, nonce,
                           args.concurrency)
    elapsed = time.monotonic() - t0
    time.sleep(2)  # the instances' counters are updated when a request finishes; give the last one a moment
    after_p, after_d = snapshot(prefills), snapshot(decodes)
    after_r = router_decisions()

    def delta(after, before, source):
        return sum(after[k].get(source, 0.0) - before[k].get(source, 0.0) for k in after)
    ids = tokenize(prefills[0][0], prefills[0][2], lab, prompts)
    failed = [x for x in records if not x["ok"]]
    r = {"label": args.label, "concurrency": args.concurrency, "policy": args.policy or lab.var("vllm_router_prefill_policy"),
         "block_size": block,
         "conversations": args.conversations, "turns": args.turns, "requests": len(records),
         "failed": len(failed), "failures": failed[:10],
         "prompt_tokens": sum(len(x) for x in ids), "perfect_tokens": perfect_cache_tokens(ids, block),
         "computed_tokens": delta(after_p, before_p, "local_compute"),
         "prefill_cache_hit_tokens": delta(after_p, before_p, "local_cache_hit"),
         # a prefill's external source is the store tier (vllm_store_tier): blocks another prefill computed
         "prefill_store_tokens": delta(after_p, before_p, "external_kv_transfer"),
         "prefill_computed_by_instance": {k: after_p[k].get("local_compute", 0) - before_p[k].get("local_compute", 0)
                                          for k in after_p},
         "decode_by_transfer": delta(after_d, before_d, "external_kv_transfer"),
         "decode_local_hit": delta(after_d, before_d, "local_cache_hit"),
         "decode_local_compute": delta(after_d, before_d, "local_compute"),
         # each router's prefill decisions in the run: a missing_tokens one routed by load (no render answer)
         "router_decisions": {h: {k: v - before_r[h].get(k, 0.0) for k, v in after_r[h].items()
                                  if v - before_r[h].get(k, 0.0)} for h in after_r},
         "seconds": round(elapsed, 1), "requests_per_s": round(len(records) / elapsed, 2),
         "latency_p50_s": sorted(x["latency"] for x in records)[len(records) // 2]}
    r["computed_over_perfect"] = round(r["computed_tokens"] / r["perfect_tokens"], 3) if r["perfect_tokens"] else None
    problems = [] if args.no_goal else reuse_problems(r, args.goal)
    r["problems"] = problems
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(r, indent=2) + "\n")
    print(f"reuse ({r['policy']}{', ' + args.label if args.label else ''}): {r['requests']} requests, "
          f"prompt {r['prompt_tokens']} tokens, perfect cache {r['perfect_tokens']}, prefill computed "
          f"{r['computed_tokens']:.0f} = {r['computed_over_perfect']}x perfect (own cache {r['prefill_cache_hit_tokens']:.0f}, "
          f"store {r['prefill_store_tokens']:.0f}); per instance "
          f"{r['prefill_computed_by_instance']}; decode by transfer {r['decode_by_transfer']:.0f}, "
          f"own hits {r['decode_local_hit']:.0f}; router decisions {r['router_decisions']}; {r['seconds']} s")
    for p in problems:
        print("REUSE FAILED: " + p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
