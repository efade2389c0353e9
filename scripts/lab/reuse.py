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
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "bench"))
from reuse_workload import block_size_of, decisions, decisions_delta, parse_sources, perfect_cache_tokens, run, summarize  # noqa: E402,F401
import load  # noqa: E402  (scripts/lab/load.py: the SDK client)
from lablib import DOCKER, http_get, metrics  # noqa: E402,F401  (the docker client; a GET and /metrics from inside a lab container)
from labinv import Lab  # noqa: E402


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


def sdk_sender(client, model, max_tokens):
    """send(prompt) for reuse_workload.run(): the official openai SDK (one keep-alive client)."""
    def send(prompt):
        try:
            out = client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens, temperature=0)
            return (out.choices[0].text if out.choices else ""), "", None
        except Exception as exc:  # noqa: BLE001 - every SDK error is a failed request
            return "", f"{type(exc).__name__}: {str(exc)[:200]}", None
    return send


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
    prompts, records = run(sdk_sender(client, model, args.max_tokens), args.conversations, args.turns, args.words,
                           nonce, args.concurrency)
    elapsed = time.monotonic() - t0
    time.sleep(2)  # the instances' counters are updated when a request finishes; give the last one a moment
    after_p, after_d = snapshot(prefills), snapshot(decodes)
    after_r = router_decisions()
    ids = tokenize(prefills[0][0], prefills[0][2], lab, prompts)
    r = {"label": args.label, "concurrency": args.concurrency,
         "policy": args.policy or lab.var("vllm_router_prefill_policy"),
         "conversations": args.conversations, "turns": args.turns}
    r.update(summarize(ids, records, block, before_p, after_p, before_d, after_d, elapsed))
    # each router's prefill decisions in the run: a missing_tokens one routed by load (no render answer)
    r["router_decisions"] = {h: decisions_delta(after_r[h], before_r[h]) for h in after_r}
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
