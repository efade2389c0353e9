#!/usr/bin/env python3
"""Fault drills against the docker lab: kill -9 each kind of service and time the recovery.

Each drill runs while a steady request loop (scripts/lab/load.py) goes where users send requests (the
entry's VIP over https with a client key when the lab has an entry, else the router), and asserts what an
operator relies on:
  - etcd member, master leader, prefill, decode, each router, the active HAProxy killed with SIGKILL:
    systemd restarts it (a new main PID, unit active, serving again) and requests succeed again;
  - HAProxy, then keepalived, stopped on the entry host that holds the VIP: the other entry takes the VIP
    (HAProxy stopped: within VIP_DETECT_GOAL_S; keepalived stopped: within VIP_MOVE_GOAL_S) and requests through
    the VIP succeed again. Each entry fault starts once every other entry host is a BACKUP in keepalived's journal
    (standbys_ready_s): right after the HAProxy drill the former holder is FAULT until its check rises, and a fault
    then measured that wait (3.1 s once), not the takeover by a healthy standby that the goal is about;
  - the entry host that holds the VIP frozen for FREEZE_S (docker pause: a hung kernel, a stalled hypervisor, a
    live migration), then resumed, under a paced load (load.OpenLoop, a new request every 0.5 s): the other entry
    takes the VIP within VIP_DETECT_GOAL_S, keeps it after the resume (no flip-back), and no request sent after
    the VIP moved fails;
  - one of three etcd members stopped: the master keeps a leader and a store put/get works;
  - the master leader killed: the standby takes over, etcd's view names it, the old leader comes back as standby;
  - the store tier's gray failures (issue 44; also alone: --gray-only, make lab-gray): both Mooncake masters stopped,
    then 2 of 3 etcd members stopped (quorum lost), STORE_OUTAGE_S each, every other process up. The store tier fails
    open (plugins/tools/pd_bundle_store_breaker.py): no request sent after STORE_GRACE_S of the stop may fail, and a
    store hit (a fresh prompt computed on one prefill loaded from the store by the other) must come back within
    STORE_HIT_GOAL_S of the units' return, with no restart;
  - a gray failure (issue 44; alone: --heal-only, make lab-heal; not in CI's sequence since stop 54): every
    packet one prefill instance sends to one decode host dropped for PARTITION_S
    (a net_cls class for the instance's processes, an nft rule on the prefill host; every process stays up and
    answers /health), then the path restored. On the lab that wedges the pair for good ("Timeout waiting for P side
    ready") until its prefill restarts. Goals: no request of the load fails (the other pairs serve, and one routed
    into the cut pair is recomputed by decode within the timeout budget, vllm_kv_load_failure_policy recompute),
    and within PARTITION_HEAL_GOAL_S of the path's return a canary that started after it passes through the pair
    with tokens by transfer, with no person: the canary (plugins/tools/pd_canary.py) found the pair broken and had
    its prefill drain and restart. Before the cut, every router's canary journal since the lab began (or
    --canary-since) must hold no pair broken (3 failures in a row: PDPairBroken) and no heal: no false alarm on a
    healthy lab through every step and drill before it.
  - alone only (--store-mode, make lab-store-mode, on a lab in store mode): both masters stopped, then etcd quorum
    lost, STORE_OUTAGE_S each. Store mode needs the store, so the outage's requests are measured (outage_spans); the
    goal is the router serving 3 requests in a row within STORE_MODE_BACK_GOAL_S of the units' return, and no request
    failing after that.
Recovery = seconds from the kill until the service serves again and 3 requests in a row through
the router succeed. Every goal fails the run when missed (drill_problems, FAILED_BOUND):
  - etcd member and router: recovery <= 30 s (GOAL_S); a killed etcd member serves again when etcd itself says
    so (`etcdctl endpoint health` on that member), not when its unit is active;
  - master leader: the standby leads within 30 s, etcd names it, the old leader comes back as standby within
    30 s of that (systemd restarts it after mooncake_master_restart_sec); the masters' roles are sampled every
    0.5 s and a failure shows that timeline. That the store still serves what was stored before the kill is the
    store-tier step's proof (scripts/lab/store_tier.py --master-kill: vLLM's own store clients, real blocks);
  - one etcd member stopped: a master leads and a store put/get through the bundle's check succeeds within
    --store-limit s (one ansible-playbook run, 20-40 s of it overhead);
  - prefill and decode vLLM: recovery <= --vllm-limit s (240 s on the 2-core lab, whose floor is a
    model load: 50-170 s measured under load);
  - failed requests of the steady load, counted per drill (from the previous drill's end to this
    one's): none after the drill's recovery point, and at most FAILED_BOUND[kind] before it (see
    there why each bound is what it is);
  - after the last drill, with the load stopped, no vLLM instance holds a request within HELD_GOAL_S (held_problems:
    a wedged one's stacks are dumped into lab-results first).
Each drill starts from a serving lab (3 requests in a row through the router, not timed).

    drills.py --inventory molecule/default/inventory --out drills.json
Lab-only: it talks to containers with `docker exec` and to the router at its lab address.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
import load  # noqa: E402  (scripts/lab/load.py)
import partition  # noqa: E402  (scripts/lab/partition.py: the broken-path drills)
from labinv import Lab as LabInventory, role_var  # noqa: E402  (the lab's names and addresses, from its inventory)
import runpy  # noqa: E402
# The shared library (scripts/lab/lablib.py), re-exported here for the callers and tests that reach them in drills.
from lablib import (DOCKER, INSTANCE_KEY_FILE, RECOMPUTE_MARK, complete, http_get, ip_of, master_roles,  # noqa: E402,F401
                    metrics, recomputed, sh, stamped_lines, unit_state, wait_for)
# The entry family (scripts/lab/drills_entry.py), re-exported for main and the tests.
from drills_entry import (  # noqa: E402,F401
    VIP_MOVE_GOAL_S, VIP_DETECT_GOAL_S, FREEZE_S, RESUME_WATCH_S, vip_taken_from_journal, vrrp_state_from_journal,
    drill_entry_stop, docker_pause, drill_entry_freeze, paced_classes, bound_from_spans, KILL_SLACK_S,
    streams_open_at, freeze_problems, entry_problems)
# The canary family (scripts/lab/drills_canary.py), re-exported for main and the tests.
from drills_canary import (  # noqa: E402,F401
    PARTITION_S, PARTITION_HEAL_GOAL_S, PARTITION_AFTERMATH_S, PARTITION_CANARY_S, CUT_CLASSID, CUT_TABLE,
    CUT_CGROUP, CANARY_STATE, cut_pair, canary_state, canary_passed_since, canary_heals,
    BROKEN_LINE, alarms_in, canary_alarms, DRILL_TIMER_DROPIN, canary_every, drill_partition,
    partition_problems, whole_run_alarms)
# The store family (scripts/lab/drills_store.py), re-exported for main and the tests.
from drills_store import (  # noqa: E402,F401
    STORE_OUTAGE_S, STORE_GRACE_S, STORE_HIT_GOAL_S, STORE_MODE_BACK_GOAL_S, HELD_GOAL_S, HELD_RE,
    BREAKER_OPEN, BREAKER_CLOSED, store_hit, stop_for, drill_store_outage, store_outage_problems,
    drill_store_mode_outage, outage_spans, store_mode_problems, held, instances_holding, held_problems)
# The masters' HA key in etcd (plugins/filter/mooncake_etcd.py, which status.yml and tests/infra read too).
_SIBLINGS = runpy.run_path(str(REPO / "plugins" / "filter" / "siblings.py"))["load"]
MOONCAKE_ETCD = _SIBLINGS("mooncake_etcd", REPO / "plugins" / "filter")

GOAL_S = 30  # the recovery goal of every service whose start is not a model load

# Failed requests of the steady load (1 worker, 0.5 s pause) allowed per drill, before recovery.
# etcd and the masters are not on the P2P request path: a failure there is a real regression.
# A killed router refuses connections until systemd restarts it (RestartSec + start, 6-10 s):
# each refused request fails at once and the loop retries every 0.5 s, hence up to ~2 per second.
# A killed vLLM fails the requests in flight on it and those routed to it before the router's
# health check (every 2 s, vllm_router_health_*) marks it down.
# HAProxy stopped on the entry that holds the VIP: its connections close, and new ones are refused until
# keepalived's check (every 1 s, fall 2) drops its priority and the other entry takes the VIP (about 3-4 s).
# Behind the entry (HAProxy retries a refused connection or an empty answer on the other router), a killed
# router costs no request but the streams whose answer had begun on it (STREAMS_ONLY). A kill -9 of the active HAProxy drops the request in flight (1 at the
# load's pace); keepalived stopped on the VIP holder: the in-flight ones are reported, bound 3, and every
# request sent after the VIP moved must succeed (failure_problems).
# Store mode's outages (--store-mode): measured, see STORE_MODE_BACK_GOAL_S.
STORE_MODE_KINDS = ("store mode: masters down", "store mode: etcd quorum lost")
FAILED_BOUND = {"etcd member": 0, "master leader": 0, "etcd member stopped": 0,
                "router": 25, "router behind entry": 0, "prefill": 5, "decode": 5,
                "entry haproxy": 1, "entry": 12, "entry vip": 3,
                # the frozen holder: the requests that went to it (sent before the VIP moved, open at the freeze),
                # counted per run from the load's spans (bound_from_spans); none sent after the move may fail
                "entry frozen": 0,
                # the cut pair: its requests are recomputed within the budget, the others never touch it
                "partition": 0,
                # the store tier's outages: the requests sent in the first STORE_GRACE_S (bound_from_spans), none after
                "masters down": 0, "etcd quorum lost": 0,
                # store mode needs the store: its outage's requests are measured (outage_spans), none after it serves
                # again may fail (failure_problems: failed_after_recovery)
                **{k: float("inf") for k in STORE_MODE_KINDS}}
# A router killed behind the entry: HAProxy retries every request on the other router (retry-on, with the whole
# request buffered), except a streamed one whose answer had begun on the killed router. So the bound is the load's
# streams open at the kill (streams_open_at), and no non-streamed request and none sent after the kill may fail.
STREAMS_ONLY = {"router behind entry"}
# Besides FAILED_BOUND: connections refused while systemd restarts the killed unit (RestartSec + start). Nothing
# reached a router, and clients retry them (the OpenAI SDKs retry connection errors by default). CI's loaded
# 2 cores took over 0.5 s to restart HAProxy, so a second request (sent 0.5 s after the first failed) was
# refused: bound 1 alone measured the machine, not the entry. Bounded: 5 s of the load's 2 requests/s.
REFUSED_BOUND = {"entry haproxy": 10}
class Lab:
    def __init__(self, args):
        self.args = args
        self.router = args.client_url        # what users call: the entry's VIP when the lab has one
        self.model = args.model
        self.key = os.environ.get("PD_CLIENT_KEY", "")

    PROBE = "drill " + "probe tokens " * 30

    def router_live(self, host):
        """A router's process answers by itself (no backend involved), asked on its own host: with an
        entry, the router port takes the entry hosts only."""
        return http_get(host, f"http://{ip_of(host)}:{self.args.router_port}/liveness") is not None

    def holds_vip(self, host, tries=3):
        """Whether host carries the VIP. A `docker exec` that itself fails (the loaded lab, a container that just
        resumed) is asked again, not read as "no VIP": an empty answer must mean `ip` said so."""
        for _ in range(tries):
            res = sh(host, "ip", "-o", "addr", "show", "to", self.args.entry_vip, check=False)
            if res.returncode == 0:
                return bool(res.stdout.strip())
            time.sleep(0.2)
        raise RuntimeError(f"{host}: cannot read its addresses: {res.stderr.strip()[:200]}")

    def vip_holder(self):
        """The entry host that carries the VIP now (None: none does; several: the first)."""
        return next((h for h in self.args.entry if self.holds_vip(h)), None)

    def vip_taken_at(self, host, since_epoch, state="MASTER"):
        """When `host` took the VIP (state BACKUP: gave it up) after since_epoch, by keepalived's own journal
        ("Entering MASTER STATE", epoch seconds; the containers share the controller's clock), else None. Exact
        where polling with `docker exec` adds its own latency (0.3-7 s on the loaded lab, the most right after a
        container resumes), so the VIP-move bounds measure keepalived, not docker."""
        res = sh(host, "journalctl", "-u", "keepalived", "-o", "short-unix", "--no-pager",
                 "--since", "@%d" % int(since_epoch), check=False, timeout=30)
        return vip_taken_from_journal(res.stdout, since_epoch, state)

    def vip_move(self, polled, since_epoch, from_epoch):
        """Where the VIP went after a fault at from_epoch, and when: polled is when polling saw another host hold it
        (None: never); keepalived's journal ("Entering MASTER STATE" after since_epoch) gives the exact time where it
        has one. Returns (new holder, seconds from from_epoch, the journal time or None, the fields both entry drills
        report)."""
        new_holder = self.vip_holder()
        taken = self.vip_taken_at(new_holder, since_epoch) if polled is not None and new_holder else None
        moved = polled if taken is None else max(0.0, taken - from_epoch)
        return new_holder, moved, taken, {
            "vip_seen_s": None if polled is None else round(polled, 1), "vip_moved_by": "journal" if taken else "polling",
            "vip_moved_s": None if moved is None else round(moved, 1), "new_holder": new_holder}

    def standbys_ready(self, others, limit=30):
        """Seconds until every entry host in others is a BACKUP that can take the VIP (keepalived's journal), or None.
        A standby whose HAProxy just came back is FAULT until its check rises (rise 2, 1 s apart): a fault on the
        holder then would measure that, not the takeover the goal is about (a healthy standby takes the VIP)."""
        def ready():
            return all(vrrp_state_from_journal(sh(h, "journalctl", "-u", "keepalived", "-o", "cat", "--no-pager",
                                                  "-n", "1000", check=False, timeout=30).stdout) == "BACKUP"
                       for h in others)
        return wait_for(ready, limit, step=0.5)

    def router_ok_n(self, n=3):
        return load.serves(self.router, self.model, self.key, n, prompt=self.PROBE)

    def router_settled(self):
        """Seconds until the router serves 3 requests in a row (up to 300 s), or None."""
        return load.until_serving(self.router, self.model, self.key, prompt=self.PROBE)

    def kill(self, host, unit):
        before = unit_state(host, unit)
        sh(host, "systemctl", "kill", "--signal=SIGKILL", unit)
        return before

    def restarted(self, host, unit, before):
        now = unit_state(host, unit)
        return now["ActiveState"] == "active" and now["MainPID"] not in ("0", before["MainPID"])

    def etcd_member_healthy(self, host):
        """etcd itself says the member serves (`etcdctl endpoint health`: a quorum read through that member),
        asked on its host over the plain listener the masters use; an active unit is not enough."""
        res = sh(host, "etcdctl", f"--endpoints=http://{ip_of(host)}:{self.args.etcd_mooncake_port}",
                 "endpoint", "health", check=False, timeout=15)
        return res.returncode == 0 and "is healthy" in (res.stdout + res.stderr)

    def vllm_serving(self, host, port):
        # the instance binds its address (roles/vllm: vllm_bind_host empty), not loopback
        out = http_get(host, f"http://{ip_of(host)}:{port}/v1/models", key_file=INSTANCE_KEY_FILE)
        return out is not None and self.model in out

    def master_roles(self):
        return master_roles(self.args.masters, self.args.master_metrics_port)

    def etcd_master_view(self):
        """The masters' HA key as etcd holds it ('ip:port' of the leader's RPC address; '' when absent), read
        with etcdctl on the first etcd member that answers, over the plain listener the masters use."""
        key = MOONCAKE_ETCD.master_view_key(self.args.cluster_id)
        for host in self.args.etcd:
            res = sh(host, "etcdctl", f"--endpoints=http://{ip_of(host)}:{self.args.etcd_mooncake_port}",
                     "get", key, "--print-value-only", check=False, timeout=15)
            if res.returncode == 0:
                return res.stdout.strip()
        return None

    def store_round_trip(self):
        res = subprocess.run(
            [str(REPO / ".venv/bin/ansible-playbook"), "-i", self.args.inventory,
             str(REPO / "playbooks/verify.yml"), "--tags", "verify_store"],
            capture_output=True, text=True, cwd=REPO, timeout=400)
        if res.returncode != 0:  # kept for the report: which task failed, and how
            self.store_error = [line for line in res.stdout.splitlines() if "fatal:" in line or "msg" in line][-3:]
        return res.returncode == 0

    store_error = None


class RoleWatch:
    """Samples the masters' roles every `step` s in a thread; keeps each change with its time."""

    def __init__(self, sample, t0, step=0.5):
        self.sample, self.t0, self.step = sample, t0, step
        self.changes, self._last, self._stop = [], {}, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            self.record(self.sample(), time.monotonic() - self.t0)
            self._stop.wait(self.step)

    def record(self, roles, t):
        if roles != self._last:
            self.changes.append((round(t, 1), roles))
            self._last = roles

    def now(self):
        return self._last

    def start(self):
        self.record(self.sample(), time.monotonic() - self.t0)
        self._thread.start()

    def stop(self):
        self._stop.set()
        self._thread.join(timeout=10)

    def timeline(self):
        """'0.3s etcd1:down etcd2:standby | 4.1s etcd1:down etcd2:leader | ...'"""
        return " | ".join(f"{t}s " + " ".join(f"{h}:{r}" for h, r in sorted(roles.items()))
                          for t, roles in self.changes)


def drill_kill(lab, name, host, unit, ready, ready_limit, recovery_limit):
    """kill -9 a unit, time until systemd restarted it, it serves, and the router path works."""
    settle = lab.router_settled()  # start from a serving lab (not timed)
    before = lab.kill(host, unit)
    t0, kill_epoch = time.monotonic(), time.time()
    back = wait_for(lambda: lab.restarted(host, unit, before), lab.args.limit)
    serving = wait_for(ready, ready_limit) if back is not None else None
    serving = None if serving is None else time.monotonic() - t0
    # The recovery point is when the first of the n router requests that all succeed was SENT: the lab serves
    # again from then on. One of them may still take ~31 s: Mooncake's TCP transport stalls a pull for its 30 s
    # status timeout on the starved 2-core lab (docs/tcp-stall.md); that is latency, listed as probe_s, and
    # the load loop reports every request over 30 s. Only a failing request moves the recovery point.
    attempt = {}

    def router_ok():
        attempt['sent'] = time.monotonic()
        return lab.router_ok_n()
    routed = wait_for(router_ok, lab.args.vllm_limit) if serving is not None else None
    probe = None if routed is None else round(time.monotonic() - attempt['sent'], 1)
    routed = None if routed is None else attempt['sent'] - t0  # after serving: the recovery time
    recovery = None if routed is None else round(routed, 1)
    return {"drill": f"kill -9 {name}", "kind": name, "host": host, "unit": unit, "kill_epoch": kill_epoch,
            "end_epoch": time.time(), "recovery_epoch": None if routed is None else kill_epoch + routed,
            "settled_before_s": None if settle is None else round(settle, 1),
            "restarted_s": None if back is None else round(back, 1),
            "serving_s": None if serving is None else round(serving, 1),
            "router_ok_s": None if routed is None else round(routed, 1), "probe_s": probe,
            "recovery_s": recovery, "serving_limit_s": ready_limit, "recovery_limit_s": recovery_limit}


def drill_problems(r, restart_limit, router_limit):
    """What a kill drill's result breaks of the asserted bounds (see the module doc)."""
    where = f"{r['drill']} on {r['host']}"
    if r["restarted_s"] is None or r["restarted_s"] > restart_limit:
        return [f"{where}: systemd did not restart it within {restart_limit} s: {r}"]
    if r["serving_s"] is None or r["serving_s"] > r["serving_limit_s"]:
        return [f"{where}: not serving within {r['serving_limit_s']} s: {r}"]
    if r["router_ok_s"] is None:
        return [f"{where}: requests through the router did not succeed within {router_limit} s of it serving: {r}"]
    if r["recovery_s"] > r["recovery_limit_s"]:
        return [f"{where}: recovered in {r['recovery_s']} s, goal <= {r['recovery_limit_s']} s: {r}"]
    return []


def failover_problems(r):
    """The master failover: the standby leads in time, etcd names it, the old leader is standby (that the store serves
    what was stored before the kill is the store-tier step's proof)."""
    where = f"{r['drill']} on {r['host']}"
    roles = f" (master roles after the kill: {r.get('roles_timeline', '?')})"
    out = []
    if r["recovery_s"] is None or r["recovery_s"] > r["limit_s"]:
        out.append(f"{where}: the standby did not lead within {r['limit_s']} s{roles}: {r}")
    if r["old_leader_back_as_standby_s"] is None:
        out.append(f"{where}: the old leader did not come back as standby{roles}: {r}")
    if r.get("etcd_names_new_leader_s") is None or r["etcd_names_new_leader_s"] > r["limit_s"]:
        out.append(f"{where}: etcd's master view did not name the new leader ({r.get('new_leader_expected')}) "
                   f"within {r['limit_s']} s of the kill; it holds {r.get('etcd_view_after')!r}: {r}")
    return out


def attribute_failures(results, load_summary):
    """Count the load's failures per drill: (previous drill's end, this drill's end]. Each result
    gains 'failed' (all in its window) and 'failed_after_recovery' (started after its recovery point;
    a request that starts after the service is back must succeed). Failures before the first drill
    are returned apart: the lab was serving then, so there must be none."""
    t0 = load_summary["start_epoch"]
    fails = sorted((t0 + f["t"], f.get("error", "")) for f in load_summary["failures"])
    plain = {t0 + f["t"] for f in load_summary["failures"] if not f.get("stream")}
    start = float("-inf")
    for r in results:
        end = r["end_epoch"]
        window = [(t, err) for t, err in fails if start < t <= end]
        r["failed"] = len(window)
        rec = r.get("recovery_epoch")
        r["failed_after_recovery"] = len([t for t, _ in window if rec is None or t > rec])
        if r["kind"] in STREAMS_ONLY:
            r["failed_plain"] = len([t for t, _ in window if t in plain])
            r["failed_sent_after_kill"] = len([t for t, _ in window if t > r["kill_epoch"]])
        if r["kind"] in REFUSED_BOUND:
            # Sent between the kill and systemd's restart, and refused by the kernel (no listener). kill_epoch is
            # taken when `docker exec systemctl kill` returned: the signal landed up to a few seconds before.
            back = r["kill_epoch"] + (r.get("restarted_s") or 0)
            r["refused_while_down"] = len([t for t, err in window
                                           if r["kill_epoch"] - 3 <= t <= back and "Connection refused" in err])
        start = end
    return len([t for t, _ in fails if t > start])


def failure_problems(r):
    """A drill's failed requests against FAILED_BOUND (see there why each is what it is)."""
    bound = r.get("bound", FAILED_BOUND[r["kind"]])
    out = []
    if r["kind"] in STREAMS_ONLY:
        if r.get("failed_plain"):
            out.append(f"{r['drill']} on {r['host']}: {r['failed_plain']} non-streamed requests failed (HAProxy must "
                       f"retry them on the other router: option http-buffer-request, retry-on)")
        if r.get("failed_sent_after_kill"):
            out.append(f"{r['drill']} on {r['host']}: {r['failed_sent_after_kill']} requests sent after the kill failed")
    refused = r.get("refused_while_down", 0)
    if refused > REFUSED_BOUND.get(r["kind"], 0):
        out.append(f"{r['drill']} on {r['host']}: {refused} connections refused while it was down, "
                   f"bound {REFUSED_BOUND.get(r['kind'], 0)}")
    if r["failed"] - refused > bound:
        out.append(f"{r['drill']} on {r['host']}: {r['failed'] - refused} failed requests"
                   f"{f' (and {refused} refused while it was down)' if refused else ''}, bound {bound}")
    if r["failed_after_recovery"] and bound:  # bound 0 is already covered above
        out.append(f"{r['drill']} on {r['host']}: {r['failed_after_recovery']} requests failed after recovery")
    return out


# A standby master logs its poll of the view every second, and every master its metrics line.
JOURNAL_NOISE = ("Master runtime state -> candidate, role=standby", "Master runtime state -> standby, role=standby",
                 "Master Admin Metrics")


def keep_master_journals(masters, since_epoch, out):
    """The masters' and their watchdogs' journals since the drills began, kept beside the report when a
    master drill failed (the lab, and its journals, are destroyed right after)."""
    parts = []
    for host in masters:
        res = sh(host, "journalctl", "-u", "mooncake-master", "-u", "mooncake-master-watchdog", "--no-pager",
                 "-o", "short-precise", "--since", "@%d" % int(since_epoch - 60), check=False)
        parts.append("===== %s (rc %d)\n%s%s" % (host, res.returncode, res.stdout[-200000:], res.stderr[-2000:]))
    out.write_text("\n".join(parts))
    print(f"drills: the masters' journals are in {out}; their last lines:")
    for part in parts:  # CI keeps only the output; a standby's once-a-second poll lines are left out
        lines = [line for line in part.splitlines() if not any(n in line for n in JOURNAL_NOISE)]
        print("\n".join(lines[:1] + lines[-25:]))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    inv = LabInventory()
    first = {g: next(iter(inv.instances([g])), None) for g in ("vllm_prefill", "vllm_decode")}
    ap.add_argument("--inventory", default="molecule/default/inventory")
    ap.add_argument("--client-url", default=inv.client_url(), help="what users call (the entry's VIP, else the router)")
    ap.add_argument("--routers", nargs="+", default=inv.hosts("vllm_router"))
    ap.add_argument("--router-port", type=int, default=int(inv.var("vllm_router_port")))
    ap.add_argument("--model", default=inv.var("vllm_served_model_name"))
    ap.add_argument("--entry", nargs="*", default=inv.hosts("entry"))
    ap.add_argument("--entry-vip", default=inv.group_vars("entry").get("entry_vip", "") if inv.has_entry() else "")
    ap.add_argument("--etcd", nargs="+", default=inv.hosts("etcd"))
    ap.add_argument("--masters", nargs="+", default=inv.hosts("mooncake_master"))
    ap.add_argument("--master-metrics-port", type=int, default=int(inv.var("mooncake_master_metrics_port")))
    ap.add_argument("--master-rpc-port", type=int, default=int(inv.var("mooncake_master_rpc_port")))
    ap.add_argument("--etcd-mooncake-port", type=int, default=int(inv.var("etcd_mooncake_client_port")))
    ap.add_argument("--cluster-id", default=inv.var("mooncake_cluster_id"))
    ap.add_argument("--prefill", default=":".join(map(str, first["vllm_prefill"])))
    ap.add_argument("--decode", default=":".join(map(str, first["vllm_decode"])))
    ap.add_argument("--limit", type=float, default=GOAL_S, help="recovery goal for etcd, master, router (and systemd's restart of any unit)")
    ap.add_argument("--vllm-limit", type=float, default=240,
                    help="recovery bound for a killed vLLM: its start-up is a model load on 2 CPU cores "
                         "(50-170 s measured under load)")
    ap.add_argument("--store-limit", type=float, default=150,
                    help="bound for the store put/get with one etcd member stopped (one ansible-playbook run)")
    ap.add_argument("--partition", default=None,
                    help="PREFILL_HOST:INSTANCE:PORT whose packets to --partition-decode are cut (default: the last "
                         "prefill instance, whose pairs the other drills leave alone)")
    ap.add_argument("--partition-decode", default=":".join(map(str, first["vllm_decode"])))
    ap.add_argument("--heal-only", action="store_true",
                    help="run the heal drill alone (issue 44: one prefill instance's path to a decode cut, healed by "
                         "restart; not in CI's sequence)")
    ap.add_argument("--gray-only", action="store_true",
                    help="run the gray-failure drills alone: masters down, etcd quorum lost, the partition")
    ap.add_argument("--no-gray", action="store_true",
                    help="the kills, the entry's faults, the etcd member and the master failover only (make test's drills "
                         "step: its gray step runs --gray-only after the rolling restart)")
    ap.add_argument("--store-mode", action="store_true",
                    help="on a lab in store mode: both masters down, then etcd quorum lost, measured (the store is "
                         "needed there); goal: serving again within %d s of the return" % STORE_MODE_BACK_GOAL_S)
    ap.add_argument("--canary-since", type=float, default=0,
                    help="epoch from which the canary must have raised no alarm before the cut (0: the lab's life)")
    ap.add_argument("--canary-alarms", metavar="DRILLS_JSON", nargs="+", default=None,
                    help="only check that no router's canary raised an alarm (a pair broken, a heal) over the lab's "
                         "whole life, outside the partition drill's window in DRILLS_JSON (its report); exit 1 if any")
    ap.add_argument("--out", default="drills.json")
    args = ap.parse_args(argv)
    if args.canary_alarms:
        return whole_run_alarms(args.routers, [Path(p) for p in args.canary_alarms])
    prefills = list(inv.instances(["vllm_prefill"]))
    args.partition = args.partition or ":".join(map(str, prefills[-1]))
    # The pool's first router decides and heals (roles/vllm_router: the canary's heal config).
    healer = args.routers[0]
    # The client's key and CA (the entry's, from the lab's vault and CA directory): in the environment only,
    # which the load loop inherits; never on a command line.
    os.environ.setdefault("PD_CLIENT_KEY", inv.client_key())
    os.environ.setdefault("PD_CLIENT_CA", inv.client_ca())
    lab = Lab(args)
    if args.store_mode:
        dhost, dinst = args.decode.split(":")[:2]
        if sh(dhost, "grep", "-q", "MooncakeStoreConnector", f"/etc/vllm/{dinst}.env", check=False).returncode != 0:
            print(f"drills: --store-mode needs the lab in store mode ({dhost}/{dinst} does not load from the store): "
                  "converge it with -e vllm_kv_connector=MooncakeStoreConnector first (docs/reliability.md)",
                  file=sys.stderr)
            return 2

    # A step before (a unit just restarted, its first requests slow on CPU) may still be settling.
    if lab.router_settled() is None:
        print("drills: the router does not serve 3 requests in a row within 300 s before any fault; "
              "is the lab converged?", file=sys.stderr)
        return 2

    stop = Path(tempfile.mkdtemp()) / "stop"
    load_out = stop.with_name("load.json")
    loader = subprocess.Popen([sys.executable, str(HERE / "load.py"), "--url", args.client_url,
                               "--model", args.model, "--workers", "1", "--pause", "0.5", "--duration", "3600",
                               "--stop-file", str(stop), "--out", str(load_out), "--spans"],
                              env=os.environ)
    results, problems = [], []
    try:
        if args.store_mode:
            results.append(drill_store_mode_outage(lab, "masters down", args.masters, "mooncake-master",
                                                   STORE_OUTAGE_S, STORE_MODE_BACK_GOAL_S))
            results.append(drill_store_mode_outage(lab, "etcd quorum lost", args.etcd[1:], "etcd",
                                                   STORE_OUTAGE_S, STORE_MODE_BACK_GOAL_S))
        if not (args.heal_only or args.gray_only or args.store_mode):
            # 1. kill -9 each kind of service.
            etcd_victim = args.etcd[-1]
            results.append(drill_kill(lab, "etcd member", etcd_victim, "etcd",
                                      lambda: lab.etcd_member_healthy(etcd_victim), args.limit, args.limit))
            for spec, kind in ((args.prefill, "prefill"), (args.decode, "decode")):
                host, inst, port = spec.split(":")
                results.append(drill_kill(lab, kind, host, f"vllm@{inst}",
                                          lambda h=host, p=port: lab.vllm_serving(h, p), args.vllm_limit,
                                          args.vllm_limit))
            # Each router in turn: behind the entry, HAProxy sends a refused request to the other one (bound 0).
            for router in args.routers:
                results.append(drill_kill(lab, "router behind entry" if args.entry else "router", router, "vllm-router",
                                          lambda r=router: lab.router_live(r), args.limit, args.limit))
            # 1b. The entry (2+ entry hosts): kill -9 of the active HAProxy (systemd restarts it), HAProxy stopped
            #     where the VIP is (keepalived's check moves the VIP), keepalived stopped there (as if the host stopped).
            if len(args.entry) > 1:
                holder = lab.vip_holder()
                if holder is None:
                    problems.append(f"no entry host holds the VIP {args.entry_vip} before the entry drills")
                else:
                    results.append(drill_kill(lab, "entry haproxy", holder, "haproxy",
                                              lambda h=holder: unit_state(h, "haproxy")["ActiveState"] == "active",
                                              args.limit, args.limit))
                    # Frozen first: the holder has held the VIP for long (since the converge or an earlier step), as
                    # a production holder has; the takeover bonus (roles/entry) decides who keeps it at the resume.
                    results.append(drill_entry_freeze(lab, FREEZE_S, RESUME_WATCH_S, VIP_DETECT_GOAL_S))
                    results.append(drill_entry_stop(lab, "haproxy", "entry", VIP_DETECT_GOAL_S))
                    results.append(drill_entry_stop(lab, "keepalived", "entry vip", VIP_MOVE_GOAL_S))

            # 2. The master leader killed: the standby leads, etcd names it, the old leader comes back as standby (HA
            #    restored). The masters' roles are sampled every 0.5 s throughout; a failure message carries that
            #    timeline.
            lab.router_settled()
            roles = lab.master_roles()
            leader = next((h for h, r in roles.items() if r == "leader"), None)
            if leader is None:
                problems.append(f"no master leader before the failover drill: {roles}")
            else:
                before = lab.kill(leader, "mooncake-master")
                t0, kill_epoch = time.monotonic(), time.time()
                watch = RoleWatch(lab.master_roles, t0)
                watch.start()
                try:
                    new_leader = wait_for(lambda: any(r == "leader" for h, r in watch.now().items()
                                                      if h != leader), args.limit)
                    # etcd agrees: the masters' key names the new leader's RPC address (what vLLM's store
                    # clients and a restarted master read to find the leader).
                    now_leader = next((h for h, r in watch.now().items() if r == "leader"), None)
                    want = f"{ip_of(now_leader)}:{args.master_rpc_port}" if now_leader else None
                    etcd_named = wait_for(lambda: want is not None and lab.etcd_master_view() == want, args.limit) \
                        if new_leader is not None else None
                    etcd_named = None if etcd_named is None else time.monotonic() - t0
                    back = wait_for(lambda: lab.restarted(leader, "mooncake-master", before)
                                    and watch.now().get(leader) == "standby", args.limit) \
                        if new_leader is not None else None
                    back = None if back is None else time.monotonic() - t0
                    # No store round trip here: the lab's store-tier step (scripts/lab/store_tier.py --master-kill) kills
                    # the leader between a prefill's put and another prefill's lookup and proves the store serves the
                    # stored blocks after the failover, with vLLM's own store clients.
                finally:
                    watch.stop()
                results.append({"drill": "kill -9 master leader", "kind": "master leader", "host": leader,
                                "unit": "mooncake-master",
                                "standby_leads_s": None if new_leader is None else round(new_leader, 1),
                                "old_leader_back_as_standby_s": None if back is None else round(back, 1),
                                "etcd_names_new_leader_s": None if etcd_named is None else round(etcd_named, 1),
                                "etcd_view_after": lab.etcd_master_view(), "new_leader_expected": want,
                                "recovery_s": None if new_leader is None else round(new_leader, 1),
                                "recovery_epoch": None if new_leader is None else kill_epoch + new_leader,
                                "end_epoch": time.time(), "roles_timeline": watch.timeline(),
                                "roles_after": lab.master_roles(), "limit_s": args.limit})

            # 3. One of three etcd members stopped: the masters keep (or re-elect) a leader, the store
            #    works again and requests are unaffected. The first member also hosts a master; when that
            #    master leads, losing its local etcd can cost it the lease (a failover, and the store's
            #    in-memory objects with it), so the store round trip is retried within --store-limit.
            victim = args.etcd[0]
            lab.router_settled()
            roles_before = lab.master_roles()
            sh(victim, "systemctl", "stop", "etcd")
            t0 = time.monotonic()
            try:
                leader = wait_for(lambda: "leader" in lab.master_roles().values(), args.limit)
                store = wait_for(lab.store_round_trip, args.store_limit, step=1) if leader is not None else None
                store = None if store is None else time.monotonic() - t0
                roles = lab.master_roles()
                router_ok = lab.router_ok_n()
            finally:
                sh(victim, "systemctl", "start", "etcd")
            results.append({"drill": "etcd member stopped (1 of 3)", "kind": "etcd member stopped", "host": victim,
                            "unit": "etcd", "master_roles_before": roles_before, "master_roles": roles,
                            "leader_s": None if leader is None else round(leader, 1),
                            "store_ok_s": None if store is None else round(store, 1), "router_ok": router_ok,
                            "store_error": None if store is not None else lab.store_error,
                            "ok": leader is not None and store is not None and router_ok,
                            "end_epoch": time.time(), "recovery_epoch": None})
        # 4. The store tier's gray failures (issue 44): every process up, the store unable to answer. It must fail open.
        #    In CI's sequence (make test's drills step) and alone (--gray-only, make lab-gray). At stops 48 and 49 the
        #    second prefill instance (the one store_hit makes load from the store) kept requests after them, and the
        #    next step's rolling restart timed out its drain; not reproduced since (stop 52: twice alone, and in the
        #    sequence's order). held_problems below now fails the drills on such an instance, with its stacks.
        if not (args.heal_only or args.store_mode or args.no_gray):
            results.append(drill_store_outage(lab, inv, "masters down", args.masters, "mooncake-master",
                                              STORE_OUTAGE_S, STORE_HIT_GOAL_S))
            results.append(drill_store_outage(lab, inv, "etcd quorum lost", args.etcd[1:], "etcd",
                                              STORE_OUTAGE_S, STORE_HIT_GOAL_S))
        # 5. The broken paths (issue 52; scripts/lab/partition.py): the canary takes the cut path out of every
        #    router's rotation and ends the requests stuck in it, then puts it back. In CI's sequence (--gray-only)
        #    and alone (make lab-partition). The heal drill (issue 44: one instance's path cut, its prefill healed by
        #    restart) left CI's sequence at stop 54, for these two (its time bought theirs): --heal-only, make
        #    lab-heal.
        if args.heal_only:
            results.append(drill_partition(lab, args.partition, args.partition_decode, healer, PARTITION_S,
                                           PARTITION_HEAL_GOAL_S, args.routers, args.canary_since))
        elif not (args.store_mode or args.no_gray):
            results.extend(partition.run(["prefill", "decode"])[0])
    finally:
        stop.touch()
        loader.wait(timeout=120)
    load_summary = json.loads(load_out.read_text())
    spans = load_summary.pop("spans", [])
    for r in results:
        if r["kind"] == "entry frozen" and r.get("freeze_epoch"):
            r["bound"] = bound_from_spans(spans, load_summary["start_epoch"], r["freeze_epoch"], r["moved_epoch"])
        if r["kind"] in STREAMS_ONLY:
            r["bound"] = streams_open_at(spans, load_summary["start_epoch"], r["kill_epoch"])
        if r["kind"] in ("masters down", "etcd quorum lost"):
            # the requests open in the first STORE_GRACE_S of the stop (sent before its end, still open at the stop)
            r["bound"] = bound_from_spans(spans, load_summary["start_epoch"], r["kill_epoch"], r["recovery_epoch"])
        if r["kind"] in STORE_MODE_KINDS:
            r["outage"] = outage_spans(spans, load_summary["start_epoch"], r)
    prev_end = float("-inf")
    for r in results:
        if r["kind"] == "partition" and "variant" in r:
            # The broken-path drills' goal for this load too: a request sent in the cut's first 20 s may end with the
            # abort's clear error; any other failure in the window counts against bound 0 (partition.problems has
            # the rest of the goals, on its own SDK load).
            r["bound"] = partition.aborted_early(load_summary["failures"], load_summary["start_epoch"], r, prev_end)
        prev_end = r["end_epoch"]
    after_last = attribute_failures(results, load_summary)

    for r in results:
        if "restarted_s" in r:
            problems.extend(drill_problems(r, args.limit, args.vllm_limit))
        elif "standby_leads_s" in r:
            problems.extend(failover_problems(r))
        elif r["kind"] in ("entry", "entry vip"):
            problems.extend(entry_problems(r))
        elif r["kind"] == "entry frozen":
            problems.extend(freeze_problems(r))
        elif r["kind"] == "partition" and "variant" in r:
            problems.extend(partition.problems(r))
        elif r["kind"] == "partition":
            problems.extend(partition_problems(r))
        elif r["kind"] in ("masters down", "etcd quorum lost"):
            problems.extend(store_outage_problems(r))
        elif r["kind"] in STORE_MODE_KINDS:
            problems.extend(store_mode_problems(r))
        elif not r.get("ok"):
            problems.append(f"{r['drill']}: {r}")
        problems.extend(failure_problems(r))
    if after_last:
        problems.append(f"{after_last} requests failed after the last drill")
    if results:
        problems.extend(held_problems(inv, inv.ips, HELD_GOAL_S, Path(args.out).resolve().parent,
                                      load_summary["start_epoch"]))

    report = {"drills": results, "load": load_summary, "failed_bound": FAILED_BOUND, "problems": problems}
    Path(args.out).write_text(json.dumps(report, indent=2))
    if any("master" in p for p in problems):
        keep_master_journals(args.masters, min((r.get("kill_epoch") or time.time() for r in results), default=time.time()),
                             Path(args.out).with_name("master-journals.txt"))
    print(f"{'drill':30} {'host':9} {'recovery s':>10} {'goal s':>6} {'failed':>6} {'bound':>5}  detail")
    for r in results:
        goal = r.get("recovery_limit_s", r.get("limit_s", "-"))
        detail = {k: v for k, v in r.items()
                  if k not in ("drill", "kind", "host", "unit", "recovery_s", "limit_s", "serving_limit_s",
                               "recovery_limit_s", "failed", "kill_epoch", "end_epoch", "recovery_epoch")}
        print(f"{r['drill']:30} {r['host']:9} {str(r.get('recovery_s', '-')):>10} {goal:>6} "
              f"{r['failed']:>6} {r.get('bound', FAILED_BOUND[r['kind']]):>5}  {json.dumps(detail)}")
    print(f"load through the router during the drills: {load_summary['requests']} requests, "
          f"{load_summary['failed']} failed; latency p50 {load_summary['latency_p50_s']} s, "
          f"max {load_summary['latency_max_s']} s")
    for p in problems:
        print(f"DRILL FAILED: {p}", file=sys.stderr)
    print("drills: " + ("FAILED" if problems else "every goal met"))
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
