#!/usr/bin/env python3
"""The broken-path drills (issue 52), one family of the lab's drills: a path between the prefill host and one decode
cut while every process stays up and answers /health, under the client users run (load.OpenLoop: the official
openai SDK through the entry, keep-alive, no retries, a request every 0.5 s, a 60 s client timeout).

Two variants, each on the lab's first decode and the host of its first prefill:
  - "on prefill host": every packet from the decode host dropped on the prefill host for 40 s;
  - "on decode host": every packet from the prefill host dropped on the decode host for 90 s.
The pool's first router's canary (plugins/tools/pd_canary.py, Ejector) must find the broken path and take the
instance out of every router's rotation (POST /pd-bundle/eject: /health 503 "ejected"), and put it back once its
pairs pass again. Goals (each one missed fails the drill):
  - requests sent more than EJECT_GOAL_S after the cut starts: 0 failed and none slower than FAST_S;
  - requests sent earlier: none reaches the client's CLIENT_TIMEOUT_S (item 6 of the issue: a request inside the cut
    path must end within 30 s);
  - within BACK_GOAL_S of the path's return the instance is back in rotation (nothing out in the decider's state) and
    a canary that started after the return passed through every pair of it with tokens by transfer;
  - the canary took an instance out during the cut (the lever, not luck).
Also alone: make lab-partition (both variants, or --variant).

Lab harness, not a bundle feature: the cut is an nft rule in a table of its own (pd_drill_drop), removed after.
"""
import argparse
import importlib.util
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import load  # noqa: E402  (scripts/lab/load.py)
from labinv import Lab as LabInventory  # noqa: E402
from lablib import canary_state, ip_of, sh, stamped_lines, wait_for  # noqa: E402

# The issue's goals.
EJECT_GOAL_S = 20
FAST_S = 10
CLIENT_TIMEOUT_S = 60
BACK_GOAL_S = 60
# The two variants: (name, the host the rule is on, the host whose packets it drops, seconds).
VARIANTS = {"prefill": 40, "decode": 90}
# The load runs this long before the cut, and this long after the instance is back.
WARM_S = 10
AFTER_S = 10
DROP_TABLE = "pd_drill_drop"
EJECT_LINE = "canary eject: took "
BACK_LINE = "canary eject: put "


def drop_from(host, peer_ip, on):
    """Drop (on) or stop dropping every packet HOST receives from PEER_IP. Returns the rule's packet count when
    removed."""
    if on:
        sh(host, "nft", "-f", "-", input=f"table inet {DROP_TABLE} {{\n chain in {{ type filter hook input priority 0; "
                                          f"ip saddr {peer_ip} counter drop; }}\n}}\n")
        return ""
    res = sh(host, "bash", "-c", f"nft list table inet {DROP_TABLE} | grep -o 'packets [0-9]*' || true; "
                                 f"nft delete table inet {DROP_TABLE} 2>/dev/null || true", check=False)
    return res.stdout.strip()


def out_of_rotation(state):
    return sorted(((state.get("ejected") or {}).get("out") or {}))


def passed_since(state, name, since):
    """A canary run that started at or after SINCE passed through every pair of instance NAME with tokens by
    transfer."""
    if state.get("started", 0) < since:
        return False
    mine = [o for key, o in (state.get("last") or {}).items() if name in key.split("|")]
    return bool(mine) and all(o.get("result") == "pass" and o.get("tokens", 0) > 0 for o in mine)


def eject_lines(router, since, until=None):
    """(epoch, line) of the decider's ejection journal lines (out and back) since SINCE."""
    text = sh(router, "journalctl", "-u", "pd-canary", "--no-pager", "-o", "short-unix", "--since", f"@{int(since)}",
              check=False).stdout
    return [(t, rest.split(": ", 1)[-1]) for t, rest in stamped_lines(text)
            if (EJECT_LINE in rest or BACK_LINE in rest) and (until is None or t <= until)]


def _abort_mark():
    """The start of the message a request ended by the canary's abort carries (plugins/tools/pd_bundle_drain.py's
    ABORT_BODY, read there: one place)."""
    spec = importlib.util.spec_from_file_location("pd_bundle_drain", HERE.parents[1] / "plugins" / "tools" /
                                                  "pd_bundle_drain.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return json.loads((module.ABORT_BODY % b"x").decode())["error"]["message"].split(" (")[0]


ABORT_MARK = _abort_mark()


def aborted_early(failures, start_epoch, r, since=float("-inf")):
    """Of another load's failures ({t: seconds from start_epoch, error}), those a drill's goals allow: sent at or after
    no later than EJECT_GOAL_S into its cut (one sent before it may be inside the path too), and ended by the canary's abort with its clear, retryable error
    (issue 52 item 6), after SINCE (the previous drill's end). drills.py bounds its own load's failures in the drill's
    window by this count."""
    cut = r["kill_epoch"]
    return len([f for f in failures if since < start_epoch + f["t"] <= cut + EJECT_GOAL_S
                and ABORT_MARK in (f.get("error") or "")])


def classify(records, cut_epoch):
    """The load's records split by the goals: sent in the first EJECT_GOAL_S of the cut or before and still open at
    the cut (early), sent later (late)."""
    early = [r for r in records if r["sent"] <= cut_epoch + EJECT_GOAL_S and r["ended"] >= cut_epoch]
    late = [r for r in records if r["sent"] > cut_epoch + EJECT_GOAL_S]
    return early, late


def problems(r):
    """The goals a drill's result missed (text lines; empty: every goal met)."""
    out = []
    name = r["drill"]
    if r["late_failed"]:
        out.append(f"{name}: {r['late_failed']} of {r['late']} requests sent more than {EJECT_GOAL_S} s after the cut "
                   f"failed ({r['late_errors'][:3]})")
    if r["late_slow"]:
        out.append(f"{name}: {r['late_slow']} requests sent more than {EJECT_GOAL_S} s after the cut took over "
                   f"{FAST_S} s (slowest {r['late_max_s']} s)")
    if r["early_timeouts"]:
        out.append(f"{name}: {r['early_timeouts']} requests sent before {EJECT_GOAL_S} s into the cut reached the "
                   f"client's {CLIENT_TIMEOUT_S} s timeout (slowest {r['early_max_s']} s)")
    if not r["ejected"]:
        out.append(f"{name}: the canary took nothing out of rotation during the cut")
    if r["back_s"] is None:
        out.append(f"{name}: {r['out_after']} not back in rotation with passing pairs within {BACK_GOAL_S} s of the "
                   f"path's return")
    return out


def drill(inv, decider, variant, cut_s, prefill_host, decode_host, decode_name, client_url, model, key):
    """One variant; returns its result (problems(result) has its missed goals)."""
    on, peer = (prefill_host, decode_host) if variant == "prefill" else (decode_host, prefill_host)
    def serving(since):  # one read of the decider's state per poll
        state = canary_state(decider)
        return passed_since(state, decode_name, since) and not out_of_rotation(state)

    ready = wait_for(lambda: serving(time.time() - 30), 90, step=2)
    loop = load.OpenLoop(client_url, model, key, every=0.5, timeout=CLIENT_TIMEOUT_S, tag=f"cut-{variant}").start()
    time.sleep(WARM_S)
    cut_epoch = time.time()
    drop_from(on, ip_of(peer), True)
    try:
        time.sleep(cut_s)
    finally:
        dropped = drop_from(on, ip_of(peer), False)
    back_epoch = time.time()
    back = wait_for(lambda: serving(back_epoch), BACK_GOAL_S, step=2)
    out_after = out_of_rotation(canary_state(decider))
    time.sleep(AFTER_S)
    records = loop.stop(drain_s=CLIENT_TIMEOUT_S + 5)
    lines = eject_lines(decider, cut_epoch - 1)
    took = [(round(t - cut_epoch, 1), ln[:200]) for t, ln in lines if EJECT_LINE in ln and t <= back_epoch]
    early, late = classify(records, cut_epoch)
    lat = lambda rs: [r["ended"] - r["sent"] for r in rs]  # noqa: E731
    return {"drill": f"cut {variant} host ({on} drops {peer}, {cut_s} s)", "kind": "partition", "host": on,
            "variant": variant, "cut_s": cut_s, "dropped": dropped, "canary_ready": ready is not None,
            "ejected": took, "first_out_s": took[0][0] if took else None,
            "ejection_lines": [(round(t - cut_epoch, 1), ln[:200]) for t, ln in lines],
            "back_s": None if back is None else round(back, 1), "out_after": out_after,
            "requests": len(records), "failed": len([r for r in records if not r["ok"]]),
            "early": len(early), "early_failed": len([r for r in early if not r["ok"]]),
            "early_timeouts": len([r for r in early if r["ended"] - r["sent"] >= CLIENT_TIMEOUT_S - 0.5]),
            "early_max_s": round(max(lat(early), default=0), 1),
            "late": len(late), "late_failed": len([r for r in late if not r["ok"]]),
            "late_errors": [r["error"][:120] for r in late if not r["ok"]][:5],
            "late_slow": len([x for x in lat(late) if x > FAST_S]), "late_max_s": round(max(lat(late), default=0), 1),
            "kill_epoch": cut_epoch, "recovery_epoch": back_epoch + (back or 0), "end_epoch": time.time()}


def run(variants, out=None):
    """The drills named (a list of VARIANTS' keys) on the lab; returns (results, problems)."""
    inv = LabInventory()
    decider = inv.hosts("vllm_router")[0]  # the pool's first router decides (roles/vllm_router: the canary's eject)
    phost = next(iter(inv.instances(["vllm_prefill"])))[0]
    dhost, dinst, _ = next(iter(inv.instances(["vllm_decode"])))
    results = []
    for variant in variants:
        results.append(drill(inv, decider, variant, VARIANTS[variant], phost, dhost, f"{dhost}/{dinst}",
                             inv.client_url(), inv.var("vllm_served_model_name"),
                             os.environ.get("PD_CLIENT_KEY") or inv.client_key()))
    found = [p for r in results for p in problems(r)]
    if out:
        Path(out).write_text(json.dumps({"drills": results, "problems": found}, indent=2))
    return results, found


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variant", choices=sorted(VARIANTS), action="append",
                    help="prefill (40 s on the prefill host) or decode (90 s on the decode host); default both")
    ap.add_argument("--out", default="partition.json")
    args = ap.parse_args(argv)
    os.environ.setdefault("PD_CLIENT_CA", LabInventory().client_ca())
    results, found = run(args.variant or ["prefill", "decode"], args.out)
    for r in results:
        print(json.dumps({k: v for k, v in r.items() if k not in ("kill_epoch", "recovery_epoch", "end_epoch")}))
    for p in found:
        print(f"DRILL FAILED: {p}", file=sys.stderr)
    print("partition: " + ("FAILED" if found else "every goal met"))
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())
