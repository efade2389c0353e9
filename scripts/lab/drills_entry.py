"""The entry's drills (one family of scripts/lab/drills.py's, issue 52 item 8): HAProxy and keepalived stopped on the
VIP holder, the holder frozen (docker pause), and how their goals are read from the load's spans and keepalived's
journal. Imports the shared library only (lablib); drills.py runs them and re-exports their names.
"""
import re
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import load  # noqa: E402  (scripts/lab/load.py)
from lablib import DOCKER, sh, stamped_lines, wait_for  # noqa: E402

# keepalived stopped on the VIP holder: the other entry holds the VIP within this (issue 13's goal).
VIP_MOVE_GOAL_S = 3.0
# The VIP holder's HAProxy stopped (keepalived's check: every 1 s, fall 2) or the holder frozen (no advert for
# 3 x advert_int + skew, 3.6 s): the other entry holds the VIP within this (issue 30: <= 5 s; 3-4 s expected).
VIP_DETECT_GOAL_S = 5.0
# The frozen-holder drill: how long the holder stays frozen, and how long after its resume the VIP must stay
# where it moved (a flip-back within this is a failure: it cuts every connection on the new holder).
FREEZE_S = 25
RESUME_WATCH_S = 15


def vip_taken_from_journal(text, since_epoch, state="MASTER"):
    """The first "Entering <state> STATE" at or after since_epoch in `journalctl -o short-unix` text, or None.
    state may be a tuple: the first of any of them (BACKUP or FAULT: the host gave the VIP up)."""
    states = (state,) if isinstance(state, str) else tuple(state)
    for t, rest in stamped_lines(text):
        if t >= since_epoch and any(f"Entering {st} STATE" in rest for st in states):
            return t
    return None


def vrrp_state_from_journal(text):
    """The last "Entering <STATE> STATE" of keepalived's journal text (MASTER, BACKUP, FAULT, ...), or None."""
    states = re.findall(r"Entering (\w+) STATE", text or "")
    return states[-1] if states else None


def drill_entry_stop(lab, unit, kind, goal_s):
    """UNIT (haproxy or keepalived) stopped on the entry host that holds the VIP: the other entry takes the VIP
    (goal_s) and requests through the VIP succeed again. haproxy: keepalived's check sees it (every 1 s, fall 2);
    keepalived: a stopping keepalived hands the VIP over at once (priority 0), as when its host stops. The unit
    is started again afterwards and the lab settles (the VIP may move back) before the next drill."""
    holder = lab.vip_holder()
    r = {"drill": f"{unit} stopped on the VIP holder", "kind": kind, "host": holder or "-", "unit": unit,
         "limit_s": goal_s, "vip_moved_s": None, "recovery_s": None, "recovery_epoch": None}
    if holder is None:
        r.update(end_epoch=time.time(), error="no entry host holds the VIP before the drill")
        return r
    others = [h for h in lab.args.entry if h != holder]
    lab.router_settled()
    r["standbys_ready_s"] = lab.standbys_ready(others)
    before = time.time()
    sh(holder, "systemctl", "stop", unit)
    t0, epoch = time.monotonic(), time.time()
    attempt = {}
    try:
        moved = wait_for(lambda: any(lab.holds_vip(h) for h in others), lab.args.limit, step=0.1)

        def serves():
            attempt["sent"] = time.monotonic()
            return lab.router_ok_n()
        routed = wait_for(serves, lab.args.limit) if moved is not None else None
        routed = None if routed is None else attempt["sent"] - t0
        # from the moment `systemctl stop` returned (a keepalived that stops hands the VIP over while it stops: 0)
        _, moved, _, fields = lab.vip_move(moved, before, epoch)
        r.update(fields, router_ok_s=None if routed is None else round(routed, 1),
                 # the failures before the VIP moved are the in-flight ones; after it, every request must succeed
                 recovery_s=None if moved is None else round(moved, 1),
                 recovery_epoch=None if moved is None else epoch + moved)
    finally:
        sh(holder, "systemctl", "start", unit)
    r["settled_after_s"] = lab.router_settled()
    r["end_epoch"] = time.time()
    return r


def docker_pause(host, on, tries=5):
    """docker pause (on) or unpause HOST, retried: runc's cgroup-v1 freezer gives up ("unable to freeze") when a
    process of the container sits in an uninterruptible sleep at that instant, which a busy host meets now and then
    (stop 49's CI: one failed pause ended the run). A try that fails leaves the container running (runc thaws it), so
    trying again is safe; the last failure raises with docker's own words."""
    want, err = ("true" if on else "false"), ""
    for attempt in range(tries):
        res = subprocess.run([DOCKER, "pause" if on else "unpause", host], capture_output=True, text=True,
                             timeout=60, check=False)
        if res.returncode == 0:
            return attempt
        err = res.stderr.strip()[:300]
        state = subprocess.run([DOCKER, "inspect", "-f", "{{.State.Paused}}", host], capture_output=True, text=True,
                               timeout=60, check=False).stdout.strip()
        if state == want:  # the daemon did it although the call reported an error
            return attempt
        time.sleep(1)
    raise RuntimeError(f"docker {'pause' if on else 'unpause'} {host} failed {tries} times: {err}")


def drill_entry_freeze(lab, freeze_s, watch_s, goal_s):
    """The entry host that holds the VIP frozen for freeze_s (docker pause freezes every process in it, as a hung
    kernel or a stalled hypervisor does), then resumed, while a paced load (load.OpenLoop: the official SDK, one
    keep-alive pool, a new request every 0.5 s) calls the VIP. The other entry must take the VIP within goal_s,
    and keep it after the resume (sampled for watch_s): a resumed holder is still MASTER in its own eyes, and
    taking the VIP back cuts every connection on the other host. No request sent after the VIP moved may fail;
    those that went to the frozen host (sent before the move, open at the freeze) may."""
    holder = lab.vip_holder()
    r = {"drill": f"VIP holder frozen {freeze_s} s", "kind": "entry frozen", "host": holder or "-",
         "unit": "(host)", "limit_s": goal_s, "vip_moved_s": None, "recovery_s": None, "recovery_epoch": None}
    if holder is None:
        r.update(end_epoch=time.time(), error="no entry host holds the VIP before the drill")
        return r
    others = [h for h in lab.args.entry if h != holder]
    lab.router_settled()
    r["standbys_ready_s"] = lab.standbys_ready(others)
    paced = load.OpenLoop(lab.router, lab.model, lab.key, every=0.5, timeout=60, tag="freeze").start()
    time.sleep(5)  # the client's pool holds warm connections to the holder, as a long-running client's does
    before = time.time()
    try:
        r["pause_retries"] = docker_pause(holder, True)
    except RuntimeError as exc:
        paced.stop()
        r.update(end_epoch=time.time(), error=str(exc))
        return r
    t0, freeze_epoch = time.monotonic(), time.time()
    try:
        moved = wait_for(lambda: any(lab.holds_vip(h) for h in others), freeze_s, step=0.1)
        time.sleep(max(0.0, freeze_s - (time.monotonic() - t0)))
    finally:
        docker_pause(holder, False)
    resume_epoch = time.time()
    holders, end = [], time.monotonic() + watch_s
    while time.monotonic() < end:
        try:
            now = [h for h in lab.args.entry if lab.holds_vip(h)]
        except RuntimeError:  # docker could not ask; the journal check below still sees a real move
            time.sleep(0.2)
            continue
        if not holders or holders[-1][1] != now:
            holders.append((round(time.time() - resume_epoch, 1), now))
        time.sleep(0.2)
    records = paced.stop()
    new_holder, moved, taken, fields = lab.vip_move(moved, before, freeze_epoch)
    # The new holder's own word that it gave the VIP up again (a flip-back the sampling could miss; FAULT: its
    # HAProxy check failed, which drops the VIP as surely).
    gave_up = lab.vip_taken_at(new_holder, taken, ("BACKUP", "FAULT")) if taken else None
    moved_epoch = None if moved is None else freeze_epoch + moved
    r.update(fields, new_holder_gave_up_s=None if gave_up is None else round(gave_up - freeze_epoch, 1),
             freeze_epoch=freeze_epoch, moved_epoch=moved_epoch, resumed_s=round(resume_epoch - freeze_epoch, 1),
             holders_after_resume=holders, recovery_s=None if moved is None else round(moved, 1),
             recovery_epoch=moved_epoch, paced=paced_classes(records, freeze_epoch, moved_epoch))
    r["settled_after_s"] = lab.router_settled()
    r["end_epoch"] = time.time()
    return r


def paced_classes(records, freeze_epoch, moved_epoch):
    """The paced load's requests split by where they went: to the frozen host (sent before the VIP moved and
    still open at the freeze) or after the move (every one must succeed)."""
    moved = float("inf") if moved_epoch is None else moved_epoch
    to_frozen = [x for x in records if x["sent"] < moved and x["ended"] > freeze_epoch]
    after = [x for x in records if x["sent"] >= moved]
    return {"requests": len(records), "failed": len([x for x in records if not x["ok"]]),
            "to_frozen_host": len(to_frozen), "to_frozen_host_failed": len([x for x in to_frozen if not x["ok"]]),
            "after_move": len(after),
            "failed_after_move": [{"t_after_move": round(x["sent"] - moved, 1), "error": x["error"]}
                                  for x in after if not x["ok"]][:20],
            "failed_before_freeze": len([x for x in records if not x["ok"] and x["ended"] <= freeze_epoch])}


def bound_from_spans(spans, start_epoch, freeze_epoch, moved_epoch):
    """The steady load's requests that went to the frozen host: sent before the VIP moved, open at the freeze."""
    moved = float("inf") if moved_epoch is None else moved_epoch
    return len([1 for span in spans if start_epoch + span[0] < moved and start_epoch + span[1] > freeze_epoch])


# `docker exec systemctl kill` returns up to this long after the signal landed (the loaded lab).
KILL_SLACK_S = 3


def streams_open_at(spans, start_epoch, kill_epoch):
    """The steady load's streamed requests open when a router was killed: sent before the kill (kill_epoch is when
    `systemctl kill` returned) and not ended before it. Their answer had begun on the killed router, which no proxy
    can replay; every other request must succeed (STREAMS_ONLY)."""
    return len([1 for span in spans if len(span) > 3 and span[3]
                and start_epoch + span[0] <= kill_epoch and start_epoch + span[1] >= kill_epoch - KILL_SLACK_S])


def freeze_problems(r):
    """The frozen-holder drill against its goals (issue 30)."""
    where = f"{r['drill']} on {r['host']}"
    if r.get("error"):
        return [f"{where}: {r['error']}"]
    out = []
    if r["vip_moved_s"] is None or r["vip_moved_s"] > r["limit_s"]:
        out.append(f"{where}: the VIP did not move to another entry host within {r['limit_s']} s: {r}")
    flips = [h for _, h in r["holders_after_resume"] if h != [r["new_holder"]]]
    if r["new_holder"] in (None, r["host"]) or flips or r.get("new_holder_gave_up_s") is not None:
        out.append(f"{where}: after the resume the VIP did not stay on one other entry host "
                   f"(holders from the resume on: {r['holders_after_resume']}; the new holder's journal: "
                   f"BACKUP/FAULT at {r.get('new_holder_gave_up_s')} s after the freeze)")
    paced = r["paced"]
    if paced["failed_after_move"]:
        out.append(f"{where}: {len(paced['failed_after_move'])} paced requests sent after the VIP moved failed: "
                   f"{paced['failed_after_move']}")
    if paced["failed_before_freeze"]:
        out.append(f"{where}: {paced['failed_before_freeze']} paced requests failed before the freeze")
    if paced["failed"] > paced["to_frozen_host"]:
        out.append(f"{where}: {paced['failed']} paced requests failed, more than the {paced['to_frozen_host']} that "
                   f"went to the frozen host")
    return out


def entry_problems(r):
    where = f"{r['drill']} on {r['host']}"
    if r.get("error"):
        return [f"{where}: {r['error']}"]
    if r["vip_moved_s"] is None or r["vip_moved_s"] > r["limit_s"]:
        return [f"{where}: the VIP did not move to another entry host within {r['limit_s']} s: {r}"]
    if r.get("router_ok_s") is None:
        return [f"{where}: requests through the VIP did not succeed after the VIP moved: {r}"]
    return []
