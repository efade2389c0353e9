#!/usr/bin/env python3
"""Fault drills against the docker lab: kill -9 each kind of service and time the recovery.

Each drill runs while a steady request loop (scripts/lab/load.py) goes through the router at the
lab's address, and asserts what an operator relies on:
  - etcd member, master leader, prefill, decode, router killed with SIGKILL: systemd restarts it
    (a new main PID, unit active, serving again) and requests through the router succeed again;
  - one of three etcd members stopped: the master keeps a leader and a store put/get works;
  - the master leader killed: the standby takes over and a store put/get works again.
Recovery = seconds from the kill until the service serves again and 3 requests in a row through
the router succeed. The goal is <= 30 s and is reported per drill (goal_met). Asserted:
  - systemd restarts the unit within --limit s (a new main PID, active);
  - the service itself serves within --limit s (etcd active, the router's /liveness), or within
    --vllm-limit s for vLLM (model load on 2 CPU cores);
  - requests through the router succeed again within --vllm-limit s of that. On the 2-core lab a KV pull
    can stall for the transfer engine's 30 s TCP timeout while a neighbour loads its model, which
    says nothing about the killed service; a hard 30 s bound on that path made the drills flaky.
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
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
import load  # noqa: E402  (scripts/lab/load.py)

GOAL_S = 30  # the recovery goal, reported per drill

DOCKER = os.environ.get("DOCKER", "docker")


def sh(host, *cmd, check=True, timeout=180):
    """Run a command in a lab container."""
    res = subprocess.run([DOCKER, "exec", host, *cmd], capture_output=True, text=True, timeout=timeout)
    if check and res.returncode != 0:
        raise RuntimeError(f"{host}: {' '.join(cmd)} -> rc {res.returncode}: {res.stderr.strip()[:300]}")
    return res


def http_get(host, url, timeout=3):
    """GET a URL from inside a container (cluster ports are firewalled from this controller)."""
    code = ("import sys,urllib.request\n"
            f"r=urllib.request.urlopen({url!r},timeout={timeout})\n"
            "sys.stdout.write(r.read().decode())")
    res = sh(host, "python3", "-c", code, check=False, timeout=timeout + 10)
    return res.stdout if res.returncode == 0 else None


def ip_of(host):
    """The container's address on the lab network (the master binds its metrics port there)."""
    res = subprocess.run([DOCKER, "inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
                          host], capture_output=True, text=True, timeout=30, check=True)
    return res.stdout.strip()


def unit_state(host, unit):
    out = sh(host, "systemctl", "show", "-p", "ActiveState", "-p", "MainPID", "-p", "NRestarts", unit).stdout
    return dict(line.split("=", 1) for line in out.split())


def wait_for(pred, limit, step=0.5):
    """Seconds until pred() is true, or None after limit seconds."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit:
        try:
            if pred():
                return time.monotonic() - t0
        except Exception:  # noqa: BLE001 - a probe that errors simply is not ready yet
            pass
        time.sleep(step)
    return None


class Lab:
    def __init__(self, args):
        self.args = args
        self.router = args.router_url
        self.model = args.model
        self.key = args.api_key

    PROBE = "drill " + "probe tokens " * 30

    def router_live(self):
        """The router process answers by itself (no backend involved)."""
        with urllib.request.urlopen(f"{self.router}/liveness", timeout=5) as resp:
            return resp.status == 200

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

    def vllm_serving(self, host, port):
        out = http_get(host, f"http://127.0.0.1:{port}/v1/models")
        return out is not None and self.model in out

    def master_roles(self):
        roles = {}
        for host in self.args.masters:
            out = http_get(host, f"http://{ip_of(host)}:{self.args.master_metrics_port}/health")
            roles[host] = json.loads(out).get("role", "?") if out else "down"
        return roles

    def store_round_trip(self):
        res = subprocess.run(
            [str(REPO / ".venv/bin/ansible-playbook"), "-i", self.args.inventory,
             str(REPO / "playbooks/verify.yml"), "--tags", "verify_store"],
            capture_output=True, text=True, cwd=REPO, timeout=400)
        return res.returncode == 0


def drill_kill(lab, name, host, unit, ready, ready_limit):
    """kill -9 a unit, time until systemd restarted it, it serves, and the router path works."""
    settle = lab.router_settled()  # start from a serving lab (not timed)
    before = lab.kill(host, unit)
    t0 = time.monotonic()
    back = wait_for(lambda: lab.restarted(host, unit, before), lab.args.limit)
    serving = wait_for(ready, ready_limit) if back is not None else None
    serving = None if serving is None else time.monotonic() - t0
    routed = wait_for(lab.router_ok_n, lab.args.vllm_limit) if serving is not None else None
    routed = None if routed is None else time.monotonic() - t0  # after serving: the recovery time
    recovery = None if routed is None else round(routed, 1)
    return {"drill": f"kill -9 {name}", "host": host, "unit": unit,
            "settled_before_s": None if settle is None else round(settle, 1),
            "restarted_s": None if back is None else round(back, 1),
            "serving_s": None if serving is None else round(serving, 1),
            "router_ok_s": None if routed is None else round(routed, 1),
            "recovery_s": recovery, "goal_met": recovery is not None and recovery <= GOAL_S,
            "serving_limit_s": ready_limit}


def drill_problems(r, restart_limit, router_limit):
    """What a kill drill's result breaks of the asserted bounds (see the module doc)."""
    where = f"{r['drill']} on {r['host']}"
    if r["restarted_s"] is None or r["restarted_s"] > restart_limit:
        return [f"{where}: systemd did not restart it within {restart_limit} s: {r}"]
    if r["serving_s"] is None or r["serving_s"] > r["serving_limit_s"]:
        return [f"{where}: not serving within {r['serving_limit_s']} s: {r}"]
    if r["router_ok_s"] is None:
        return [f"{where}: requests through the router did not succeed within {router_limit} s of it serving: {r}"]
    return []


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--inventory", default="molecule/default/inventory")
    ap.add_argument("--router-url", default="http://172.30.0.41:8000")
    ap.add_argument("--router-host", default="router1")
    ap.add_argument("--model", default="tiny-llama")
    ap.add_argument("--api-key", default=os.environ.get("PD_ROUTER_API_KEY", ""))
    ap.add_argument("--etcd", nargs="+", default=["etcd1", "etcd2", "etcd3"])
    ap.add_argument("--masters", nargs="+", default=["etcd1", "etcd2"])
    ap.add_argument("--master-metrics-port", type=int, default=9003)
    ap.add_argument("--prefill", default="prefill1:prefill0:8100")
    ap.add_argument("--decode", default="decode1:decode0:8200")
    ap.add_argument("--limit", type=float, default=30, help="recovery goal for etcd, master, router")
    ap.add_argument("--vllm-limit", type=float, default=240,
                    help="bound for vLLM serving again (model load on CPU: 50-170 s measured under load) and "
                         "for requests through the router succeeding again after the service serves")
    ap.add_argument("--out", default="drills.json")
    args = ap.parse_args(argv)
    lab = Lab(args)

    # A step before (a unit just restarted, its first requests slow on CPU) may still be settling.
    if lab.router_settled() is None:
        print("drills: the router does not serve 3 requests in a row within 300 s before any fault; "
              "is the lab converged?", file=sys.stderr)
        return 2

    stop = Path(tempfile.mkdtemp()) / "stop"
    load_out = stop.with_name("load.json")
    loader = subprocess.Popen([sys.executable, str(HERE / "load.py"), "--url", args.router_url,
                               "--model", args.model, "--workers", "1", "--pause", "0.5", "--duration", "3600",
                               "--stop-file", str(stop), "--out", str(load_out)],
                              env={**os.environ, "PD_ROUTER_API_KEY": args.api_key})
    results, problems = [], []
    try:
        # 1. kill -9 each kind of service.
        etcd_victim = args.etcd[-1]
        results.append(drill_kill(lab, "etcd member", etcd_victim, "etcd",
                                  lambda: unit_state(etcd_victim, "etcd")["ActiveState"] == "active",
                                  args.limit))
        for spec, kind in ((args.prefill, "prefill"), (args.decode, "decode")):
            host, inst, port = spec.split(":")
            results.append(drill_kill(lab, kind, host, f"vllm@{inst}",
                                      lambda h=host, p=port: lab.vllm_serving(h, p), args.vllm_limit))
        results.append(drill_kill(lab, "router", args.router_host, "vllm-router", lab.router_live, args.limit))

        # 2. The master leader killed: the standby leads, and store put/get works again.
        roles = lab.master_roles()
        leader = next((h for h, r in roles.items() if r == "leader"), None)
        if leader is None:
            problems.append(f"no master leader before the failover drill: {roles}")
        else:
            before = lab.kill(leader, "mooncake-master")
            t0 = time.monotonic()
            new_leader = wait_for(lambda: any(r == "leader" for h, r in lab.master_roles().items()
                                              if h != leader), args.limit)
            store = wait_for(lab.store_round_trip, 300, step=1) if new_leader is not None else None
            store = None if store is None else time.monotonic() - t0
            back = wait_for(lambda: lab.restarted(leader, "mooncake-master", before)
                            and lab.master_roles()[leader] == "standby", args.limit)
            results.append({"drill": "kill -9 master leader", "host": leader, "unit": "mooncake-master",
                            "standby_leads_s": None if new_leader is None else round(new_leader, 1),
                            "store_ok_s": None if store is None else round(store, 1),
                            "old_leader_back_as_standby_s": None if back is None else round(back, 1),
                            "recovery_s": None if new_leader is None else round(new_leader, 1),
                            "roles_after": lab.master_roles(), "limit_s": args.limit})

        # 3. One of three etcd members stopped: the master keeps a leader, the store works.
        victim = args.etcd[0]
        sh(victim, "systemctl", "stop", "etcd")
        try:
            time.sleep(3)
            roles = lab.master_roles()
            store_ok = lab.store_round_trip()
            router_ok = lab.router_ok_n()
        finally:
            sh(victim, "systemctl", "start", "etcd")
        results.append({"drill": "etcd member stopped (1 of 3)", "host": victim, "unit": "etcd",
                        "master_roles": roles, "store_ok": store_ok, "router_ok": router_ok,
                        "ok": store_ok and router_ok and "leader" in roles.values()})
    finally:
        stop.touch()
        loader.wait(timeout=120)
    load_summary = json.loads(load_out.read_text())

    for r in results:
        if "restarted_s" in r:
            problems.extend(drill_problems(r, args.limit, args.vllm_limit))
        elif "recovery_s" in r:
            if r["recovery_s"] is None or r["recovery_s"] > r["limit_s"]:
                problems.append(f"{r['drill']} on {r['host']}: no recovery within {r['limit_s']} s: {r}")
            if r["store_ok_s"] is None:
                problems.append(f"store put/get did not resume after the master failover: {r}")
        elif not r.get("ok"):
            problems.append(f"{r['drill']}: {r}")

    report = {"drills": results, "load": load_summary, "problems": problems}
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(f"{'drill':34} {'host':9} {'recovery s':>10}  detail")
    for r in results:
        detail = {k: v for k, v in r.items()
                  if k not in ("drill", "host", "unit", "recovery_s", "limit_s", "serving_limit_s")}
        print(f"{r['drill']:34} {r['host']:9} {str(r.get('recovery_s', '-')):>10}  {json.dumps(detail)}")
    print(f"load through the router during the drills: {load_summary['requests']} requests, "
          f"{load_summary['failed']} failed (failures are expected while a killed service is down); "
          f"latency p50 {load_summary['latency_p50_s']} s, max {load_summary['latency_max_s']} s")
    met = [r for r in results if "goal_met" in r]
    print(f"recovery goal <= {GOAL_S} s met by {sum(r['goal_met'] for r in met)} of {len(met)} kill drills")
    for p in problems:
        print(f"DRILL FAILED: {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
