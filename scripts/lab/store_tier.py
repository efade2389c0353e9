#!/usr/bin/env python3
"""The store as a reuse tier (issue 31): a prefix one prefill instance computed is loaded by another from the store.

The proof, on the lab's two prefill instances (A and B, vllm_store_tier: MultiConnector with MooncakeConnector and
MooncakeStoreConnector):
  1. a prompt no instance has seen (a per-run nonce, --words long) goes to A (its API, with the routers' key):
     A computes it and its store connector puts every whole block into the store;
  2. once A's store puts for it are counted (vllm:mooncake_store_operation_keys_total on A rises by the prompt's
     whole blocks, or --put-wait s pass), the same prompt goes to B;
  3. B's vllm:prompt_tokens_by_source_total{source="external_kv_transfer"} must rise by the prompt's whole blocks
     (the tokens vLLM can load: at most the prompt's length minus one, in whole blocks), and B computes only the
     tail. Missed: exit 1.
With --ssd (vllm_store_ssd: the host's mooncake-store-client owns the memory tier, a small one in the lab, and the SSD
tier behind it), filler prompts go to A between 2 and 3 until the master leader has evicted from memory at least
twice the objects memory holds plus the prompt's blocks (master_evicted_key_count_mem, mem_cache_nums_; nothing looks
A's prompt up meanwhile, so its blocks are the oldest); B must then load them all and the master count at least that
many hits served from SSD (file_cache_hit_nums_).
With --master-kill, the master leader is killed (SIGKILL) between 2 and 3 (after the fillers), and B asks once another
master leads and every segment owner is back on it (its /metrics: active clients, segments mounted or remounted; with
SSD the owners are the hosts' store clients, the instances give no memory): the index must have survived the failover (mooncake_master_oplog) for B to find A's blocks.
Counts, not times: the goal is deterministic. Both requests go to the instances directly (not through a router:
the routers' cache_aware would rightly send the second to A).

    store_tier.py --scenario default --out lab-results/store-tier.json
Lab-only: it reads each instance's /metrics and sends the requests with `docker exec` on the instance's host (the
cluster ports are firewalled from the controller); the key is read there (drills.INSTANCE_KEY_FILE).
"""
import argparse
import functools
import json
import random
import re
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "bench"))
from lablib import DOCKER, INSTANCE_KEY_FILE, complete, http_get, master_roles, metrics  # noqa: E402,F401
from labinv import Lab  # noqa: E402
from reuse_workload import WORDS, block_size_of, parse_sources  # noqa: E402  (scripts/bench)

STORE_KEYS_RE = re.compile(r'^vllm:mooncake_store_operation_keys_total\{([^}]*)\}\s+(\S+)', re.M)


def store_keys(text):
    """{(operation, status): keys} summed over the instance's series."""
    out = {}
    for labels, value in STORE_KEYS_RE.findall(text):
        op = re.search(r'operation="([^"]+)"', labels)
        st = re.search(r'status="([^"]+)"', labels)
        k = (op.group(1) if op else "", st.group(1) if st else "")
        out[k] = out.get(k, 0.0) + float(value)
    return out


def put_keys(keys):
    """Keys the instance put successfully (every operation whose name says put, status ok/success)."""
    return sum(v for (op, st), v in keys.items() if "put" in op.lower() and st.lower() in ("ok", "success", "succeeded"))


def loadable_tokens(n_tokens, block):
    """Tokens vLLM can load for a prompt of n_tokens: whole blocks of at most n_tokens - 1 (it computes the last)."""
    return ((n_tokens - 1) // block) * block if n_tokens > 0 and block > 0 else 0


def tier_problems(r):
    """What the proof missed: B must load every loadable block of the prompt from the store; with the SSD proof
    (r["ssd"]) they must have been evicted from memory first and served from SSD."""
    out = []
    ssd = r.get("ssd")
    if ssd:
        if ssd["evicted_mem"] < ssd["evict_goal"]:
            out.append(f"the fillers evicted {ssd['evicted_mem']:.0f} objects from memory, not the {ssd['evict_goal']:.0f} "
                       f"that push the prompt's blocks out ({ssd['fillers']} fillers)")
        if ssd["file_hits"] < r["loadable_tokens"] // max(r["block_size"], 1):
            out.append(f"the master served {ssd['file_hits']:.0f} hits from SSD, not the prompt's "
                       f"{r['loadable_tokens'] // max(r['block_size'], 1)} blocks")
    if r["failed"]:
        out.append(f"requests failed: {r['failed']}")
    if r["loadable_tokens"] <= 0:
        out.append(f"the prompt ({r['prompt_tokens']} tokens) holds no whole block of {r['block_size']}: nothing to prove")
    elif r["b_external_tokens"] < r["loadable_tokens"]:
        out.append(f"{r['b']} loaded {r['b_external_tokens']:.0f} tokens from the store, not the prompt's "
                   f"{r['loadable_tokens']} loadable ones (computed {r['b_computed_tokens']:.0f}; "
                   f"{r['a']} put {r['a_put_keys']:.0f} keys)")
    return out


MASTER_COUNTER_RE = re.compile(r'^([a-z_]+)\s+(\S+)', re.M)


def master_counters(text):
    """{name: value} of a master's unlabelled series (active clients, mounts, memory evictions, SSD hits)."""
    return {name: float(value) for name, value in MASTER_COUNTER_RE.findall(text or "")}


def segments_back(text, owners):
    """Whether a master's /metrics says every segment owner is back: `owners` active clients, each of whose segment it
    mounted or remounted (a new leader knows the index from the OpLog, the segments from their owners). A client
    that gives no memory (an instance behind an SSD store client: standalone-store) is not counted as active."""
    vals = master_counters(text)
    mounted = vals.get("master_mount_segment_requests_total", 0) + vals.get("master_remount_segment_requests_total", 0)
    return vals.get("master_active_clients", 0) >= owners and mounted >= owners


def leader_of(lab):
    masters, port = lab.hosts("mooncake_master"), lab.var("mooncake_master_metrics_port")
    return next((h for h, r in master_roles(masters, port, ip=lab.ips.get).items() if r == "leader"), None)


def leader_counters(lab, host):
    return master_counters(http_get(host, f"http://{lab.ips[host]}:{lab.var('mooncake_master_metrics_port')}/metrics"))


def evict_with_fillers(lab, host, ip, port, model, blocks, words, limit):
    """Send fresh prompts to one instance until the master leader has evicted from memory twice what memory holds
    plus `blocks` (the prompt's blocks, the oldest objects: nothing looked them up since). Returns the counts."""
    leader = leader_of(lab)
    c0 = leader_counters(lab, leader)
    goal = 2 * c0.get("mem_cache_nums_", 0) + blocks
    fillers, evicted, t0 = 0, 0.0, time.monotonic()
    while time.monotonic() - t0 < limit:
        evicted = leader_counters(lab, leader).get("master_evicted_key_count_mem", 0) - c0.get("master_evicted_key_count_mem", 0)
        if evicted >= goal:
            break
        rnd = random.Random(f"filler-{time.time()}-{fillers}")
        ok, _ = complete(host, ip, port, model, f"Filler {fillers} {time.time()}. "
                         + " ".join(rnd.choice(WORDS) for _ in range(words)))
        fillers += 1
        if not ok:
            break
        time.sleep(0.5)  # the puts finish after the answer
    return {"leader": leader, "evict_goal": goal, "evicted_mem": evicted, "fillers": fillers,
            "mem_objects_before": c0.get("mem_cache_nums_", 0), "seconds": round(time.monotonic() - t0, 1)}


def master_failover(lab, limit, owners):
    """Kill -9 the master leader; wait until another master leads and every store client's segment is back on it.
    Returns what happened (raises if no master leads, or the segments do not come back, within limit s)."""
    masters, port = lab.hosts("mooncake_master"), lab.var("mooncake_master_metrics_port")
    roles = functools.partial(master_roles, port=port, ip=lab.ips.get)
    leader = next((h for h, r in roles(masters).items() if r == "leader"), None)
    if leader is None:
        raise RuntimeError(f"no master leads before the kill: {roles(masters)}")
    subprocess.run([DOCKER, "exec", leader, "systemctl", "kill", "--signal=SIGKILL", "mooncake-master"],
                   check=True, capture_output=True, timeout=60)
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit:
        new = next((h for h, r in roles(masters).items() if r == "leader" and h != leader), None)
        if new:
            break
        time.sleep(0.5)
    else:
        raise RuntimeError(f"no other master leads {limit} s after {leader} was killed: {roles(masters)}")
    led = round(time.monotonic() - t0, 1)
    while time.monotonic() - t0 < limit:
        if segments_back(http_get(new, f"http://{lab.ips[new]}:{port}/metrics"), owners):
            break
        time.sleep(0.5)
    else:
        raise RuntimeError(f"the store clients' segments are not back on {new} {limit} s after {leader} was killed")
    back = round(time.monotonic() - t0, 1)
    # the lab as it was for the steps after this one: systemd restarts the killed master, which comes back standby
    while time.monotonic() - t0 < limit + 60:
        if roles([leader]).get(leader) == "standby":
            return {"killed": leader, "new_leader": new, "led_s": led, "segments_back_s": back,
                    "old_leader_standby_s": round(time.monotonic() - t0, 1)}
        time.sleep(1)
    raise RuntimeError(f"{leader} is not back as standby {limit + 60} s after its kill")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default="default")
    ap.add_argument("--words", type=int, default=400, help="prompt length in words (about 3 tokens each)")
    ap.add_argument("--put-wait", type=float, default=30.0, help="seconds to wait for A's store puts")
    ap.add_argument("--master-kill", action="store_true",
                    help="kill -9 the master leader between the two requests: the index must survive the failover")
    ap.add_argument("--failover-wait", type=float, default=60.0, help="seconds for another master to lead")
    ap.add_argument("--ssd", action="store_true",
                    help="evict A's blocks from the memory tier with filler prompts first: B must load them from SSD")
    ap.add_argument("--evict-wait", type=float, default=300.0, help="seconds the fillers may take")
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    lab = Lab(args.scenario)
    model = lab.var("vllm_served_model_name")
    prefills = lab.instances(("vllm_prefill",))
    if len(prefills) < 2:
        print("STORE TIER FAILED: the proof needs two prefill instances", file=sys.stderr)
        return 1
    (ha, na, pa), (hb, nb, pb) = prefills[0], prefills[1]
    block = block_size_of(metrics(ha, pa, lab))
    nonce = f"{int(time.time())}-{random.randrange(10 ** 6)}"
    rnd = random.Random(nonce)
    prompt = f"Store tier proof {nonce}. " + " ".join(rnd.choice(WORDS) for _ in range(args.words))

    a0, b0 = metrics(ha, pa, lab), metrics(hb, pb, lab)
    ok_a, usage_a = complete(ha, lab.ips[ha], pa, model, prompt)
    n_tokens = int(usage_a.get("prompt_tokens", 0)) if ok_a else 0
    want_keys = loadable_tokens(n_tokens, block) // block
    t0, a_put = time.monotonic(), 0.0
    while ok_a and time.monotonic() - t0 < args.put_wait:
        a_put = put_keys(store_keys(metrics(ha, pa, lab))) - put_keys(store_keys(a0))
        if a_put >= want_keys:
            break
        time.sleep(0.5)
    put_s = round(time.monotonic() - t0, 1)
    ssd = evict_with_fillers(lab, ha, lab.ips[ha], pa, model, want_keys, args.words, args.evict_wait) \
        if args.ssd and ok_a else None
    # With SSD offload the segments are the hosts' store clients' (one per prefill host); the instances own none, and
    # the master counts only segment owners as active clients.
    owners = len({h for h, _, _ in prefills}) if args.ssd else len(prefills)
    failover = master_failover(lab, args.failover_wait, owners) if args.master_kill and ok_a else None
    leader = leader_of(lab) if ssd else None
    f0 = leader_counters(lab, leader).get("file_cache_hit_nums_", 0) if leader else 0
    ok_b, usage_b = complete(hb, lab.ips[hb], pb, model, prompt)
    time.sleep(1)  # the counters move when the request finishes
    b1 = metrics(hb, pb, lab)
    if ssd:
        ssd["file_hits"] = leader_counters(lab, leader).get("file_cache_hit_nums_", 0) - f0
    sb0, sb1 = parse_sources(b0), parse_sources(b1)
    r = {"a": f"{ha}/{na}", "b": f"{hb}/{nb}", "block_size": block, "prompt_tokens": n_tokens,
         "loadable_tokens": loadable_tokens(n_tokens, block), "a_put_keys": a_put, "a_put_wait_s": put_s,
         "b_external_tokens": sb1.get("external_kv_transfer", 0.0) - sb0.get("external_kv_transfer", 0.0),
         "b_computed_tokens": sb1.get("local_compute", 0.0) - sb0.get("local_compute", 0.0),
         "b_local_hit_tokens": sb1.get("local_cache_hit", 0.0) - sb0.get("local_cache_hit", 0.0),
         "failed": [d for ok, d in ((ok_a, usage_a), (ok_b, usage_b)) if not ok],
         "a_store_ops": {f"{k[0]}/{k[1]}": v for k, v in store_keys(metrics(ha, pa, lab)).items()},
         "master_failover": failover, "ssd": ssd}
    problems = tier_problems(r)
    r["problems"] = problems
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(r, indent=2) + "\n")
    print(f"store tier: {r['a']} computed a {n_tokens}-token prompt and put {a_put:.0f} keys in {put_s} s; "
          f"{r['b']} loaded {r['b_external_tokens']:.0f} of its {r['loadable_tokens']} loadable tokens from the store "
          f"and computed {r['b_computed_tokens']:.0f} (block {block})")
    if ssd:
        print(f"  between the two: {ssd['fillers']} filler prompts to {r['a']} evicted {ssd['evicted_mem']:.0f} objects "
              f"from the memory tier (goal {ssd['evict_goal']:.0f}) in {ssd['seconds']} s; the master served "
              f"{ssd.get('file_hits', 0):.0f} of B's hits from SSD")
    if failover:
        print(f"  between the two: the master leader {failover['killed']} killed (SIGKILL); {failover['new_leader']} "
              f"led {failover['led_s']} s later, every store client's segment back on it at {failover['segments_back_s']} s")
    for p in problems:
        print("STORE TIER FAILED: " + p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
