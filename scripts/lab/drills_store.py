"""The store tier's drills (one family of scripts/lab/drills.py's, issue 52 item 8): both masters stopped, etcd
quorum lost (the store tier fails open), the same in store mode (measured), and the check that no instance still
holds requests after the drills. Imports the shared library only (lablib); drills.py runs them and re-exports their
names.
"""
import re
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from lablib import complete, http_get, metrics, sh, wait_for  # noqa: E402

# The store tier's gray failures (issue 44): both masters stopped, or 2 of 3 etcd members stopped, for STORE_OUTAGE_S.
# No request sent after STORE_GRACE_S of the stop may fail, and a store hit must come back within STORE_HIT_GOAL_S of
# the units' return.
STORE_OUTAGE_S = 60
STORE_GRACE_S = 5
STORE_HIT_GOAL_S = 60
# Store mode (--store-mode, make lab-store-mode on a lab converged with vllm_kv_connector=MooncakeStoreConnector):
# decode loads every prompt's KV from the store, so the store is needed by design and the requests of the outage are
# measured, not bounded. Goals: the router serves again (3 requests in a row) within STORE_MODE_BACK_GOAL_S of the
# units' return, with no person, and no request sent after that fails.
STORE_MODE_BACK_GOAL_S = 120
# After the last drill, with the load stopped, every vLLM instance must hold no request (vllm:num_requests_running +
# waiting, what the rolling restart's drain waits on) within HELD_GOAL_S. One that still does is wedged (a KV load that
# never returned): its stacks go to its journal (SIGUSR1, plugins/tools/pd_bundle_stack_dump.py) and into
# lab-results/held-HOST-INSTANCE.txt, and the drills fail naming it.
HELD_GOAL_S = 90
HELD_RE = re.compile(r"^vllm:num_requests_(?:running|waiting)\{[^}]*\} ([0-9.e+-]+)$", re.M)


BREAKER_OPEN = "pd-bundle: store breaker open"  # plugins/tools/pd_bundle_store_breaker.py's lines
BREAKER_CLOSED = "pd-bundle: store breaker closed"


def store_hit(inv, model, words=200):
    """One proof that the store tier reuses again: a fresh prompt computed on the first prefill instance (its store
    connector puts its blocks), then sent to the second, which must load some of it from the store (its
    prompt_tokens_by_source external_kv_transfer grows). (ok, detail)."""
    import random  # noqa: PLC0415
    sys.path.insert(0, str(HERE.parent / "bench"))
    from reuse_workload import WORDS, parse_sources  # noqa: PLC0415  (scripts/bench)
    (ha, _, pa), (hb, _, pb) = list(inv.instances(["vllm_prefill"]))[:2]
    nonce = f"{time.time()}-{random.randrange(10 ** 6)}"
    prompt = f"Store back {nonce}. " + " ".join(random.Random(nonce).choice(WORDS) for _ in range(words))
    ok_a, usage = complete(ha, inv.ips[ha], pa, model, prompt, timeout=30)
    if not ok_a:
        return False, usage
    time.sleep(1.5)  # the store connector puts after the answer
    b0 = parse_sources(metrics(hb, pb, inv)).get("external_kv_transfer", 0.0)
    ok_b, usage = complete(hb, inv.ips[hb], pb, model, prompt, timeout=30)
    time.sleep(1)  # the counters move when the request finishes
    got = parse_sources(metrics(hb, pb, inv)).get("external_kv_transfer", 0.0) - b0
    return ok_b and got > 0, f"{hb} loaded {got:.0f} tokens from the store"


def stop_for(hosts, unit, outage_s):
    """UNIT stopped on every one of HOSTS for outage_s, then started again (also when interrupted); returns the epochs
    of the stop and of the return."""
    fault_epoch = time.time()
    for host in hosts:
        sh(host, "systemctl", "stop", unit)
    try:
        time.sleep(outage_s)
    finally:
        for host in hosts:
            sh(host, "systemctl", "start", unit, check=False)
    return fault_epoch, time.time()


def drill_store_outage(lab, inv, kind, hosts, unit, outage_s, hit_goal_s):
    """A gray failure of the store tier (issue 44): UNIT stopped on HOSTS (both masters; or 2 of 3 etcd members, so
    etcd loses quorum) for outage_s, every other process up. The store tier must fail open: no request sent after
    STORE_GRACE_S of the stop may fail (the breaker's bound plus the requests already waiting on the store), and a
    store hit (store_hit) must come back within hit_goal_s of the units' return, with no restart."""
    lab.router_settled()
    hit_before = wait_for(lambda: store_hit(inv, lab.model)[0], 60, step=1)
    prefills = list(inv.instances(["vllm_prefill"]))
    fault_epoch, _ = stop_for(hosts, unit, outage_s)
    detail = {}

    def hit():
        ok, detail["last"] = store_hit(inv, lab.model)
        return ok
    hit_back = wait_for(hit, hit_goal_s, step=2)
    breaker = {}
    for host, inst, _ in prefills:
        text = sh(host, "journalctl", "-u", f"vllm@{inst}", "--no-pager", "-o", "cat", "--since", f"@{int(fault_epoch)}",
                  check=False).stdout
        breaker[f"{host}/{inst}"] = [ln[:160] for ln in text.splitlines() if BREAKER_OPEN in ln or BREAKER_CLOSED in ln][:4]
    lab.router_settled()
    return {"drill": f"{kind} ({outage_s} s)", "kind": kind, "host": ",".join(hosts), "unit": unit,
            "outage_s": outage_s, "store_hit_before": hit_before is not None,
            "store_hit_back_s": None if hit_back is None else round(hit_back, 1), "hit_goal_s": hit_goal_s,
            "store_hit_detail": detail.get("last"), "breaker": breaker,
            "kill_epoch": fault_epoch, "recovery_epoch": fault_epoch + STORE_GRACE_S, "end_epoch": time.time()}


def store_outage_problems(r):
    out = []
    if not r["store_hit_before"]:
        out.append(f"{r['drill']}: no store hit before the fault (the store tier does not reuse on this lab)")
    if r["store_hit_back_s"] is None:
        out.append(f"{r['drill']}: no store hit within {r['hit_goal_s']} s of the units' return ({r['store_hit_detail']}; "
                   f"breaker lines: {r['breaker']})")
    return out


def drill_store_mode_outage(lab, kind, hosts, unit, outage_s, back_goal_s):
    """Store mode (MooncakeStoreConnector on both sides) in a store outage: UNIT stopped on HOSTS for outage_s. The
    requests of the outage are measured (outage_spans). Goal: the router serves 3 requests in a row within back_goal_s
    of the units' return, with no restart of anything; failure_problems then holds every later request to 0 failed."""
    lab.router_settled()
    fault_epoch, back_epoch = stop_for(hosts, unit, outage_s)
    serving = wait_for(lab.router_ok_n, back_goal_s, step=1)
    return {"drill": f"store mode: {kind} ({outage_s} s)", "kind": f"store mode: {kind}", "host": ",".join(hosts),
            "unit": unit, "outage_s": outage_s, "back_epoch": back_epoch,
            "serving_back_s": None if serving is None else round(serving, 1), "back_goal_s": back_goal_s,
            "kill_epoch": fault_epoch, "recovery_epoch": None if serving is None else back_epoch + serving,
            "end_epoch": time.time()}


def outage_spans(spans, start_epoch, r):
    """What the load's requests saw from a store-mode drill's stop until it served again: sent, failed, the slowest,
    and the failures' times after the stop."""
    end = r["recovery_epoch"] or r["end_epoch"]
    inside = [sp for sp in spans if r["kill_epoch"] <= start_epoch + sp[0] <= end
              or start_epoch + sp[0] < r["kill_epoch"] < start_epoch + sp[1]]
    failed = [sp for sp in inside if not sp[2]]
    return {"sent": len(inside), "failed": len(failed), "ok": len(inside) - len(failed),
            "slowest_s": round(max((sp[1] - sp[0] for sp in inside), default=0), 1),
            "failed_at_s": [round(start_epoch + sp[1] - r["kill_epoch"], 1) for sp in failed][:10]}


def store_mode_problems(r):
    if r["serving_back_s"] is None:
        return [f"{r['drill']}: the router did not serve 3 requests in a row within {r['back_goal_s']} s of the "
                f"units' return"]
    return []


def held(text):
    """Requests an instance holds, from its /metrics text (running + waiting); None when unread."""
    return None if text is None else sum(float(v) for v in HELD_RE.findall(text))


def instances_holding(inv, ips):
    """{host/instance: requests held} of every vLLM instance holding any (an unread /metrics counts as holding)."""
    out = {}
    for host, inst, port in inv.instances(["vllm_prefill", "vllm_decode"]):
        n = held(http_get(host, f"http://{ips[host]}:{port}/metrics", timeout=5))
        if n is None or n > 0:
            out[f"{host}/{inst}"] = n
    return out


def held_problems(inv, ips, goal_s, out_dir, since_epoch):
    """After the drills: wait up to goal_s for every instance to hold nothing; for each that still does, its stacks
    (SIGUSR1) and journal since since_epoch into out_dir/held-HOST-INSTANCE.txt, and one problem naming it."""
    last = {}

    def none_held():
        last.clear()
        last.update(instances_holding(inv, ips))
        return not last
    if wait_for(none_held, goal_s, step=3) is not None:
        return []
    out = []
    for name, n in sorted(last.items()):
        host, inst = name.split("/")
        sh(host, "systemctl", "kill", "-s", "USR1", f"vllm@{inst}", check=False)
        time.sleep(3)
        text = sh(host, "journalctl", "-u", f"vllm@{inst}", "--no-pager", "-o", "short-precise", "--since",
                  f"@{int(since_epoch)}", check=False).stdout
        path = Path(out_dir) / f"held-{host}-{inst}.txt"
        path.write_text(text[-400000:])
        out.append(f"{name} still holds {n} requests {goal_s} s after the drills' load stopped (a wedged instance: "
                   f"its stacks and journal in {path})")
    return out
