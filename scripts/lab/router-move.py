#!/usr/bin/env python3
"""Move the lab's routers between vllm-router and smg under load (issue 52 item 7), on the docker lab.

While the official `openai` SDK client (scripts/lab/load.py) sends requests through the entry:
1. `playbooks/router.yml -e vllm_router_implementation=smg`: every router still on vllm-router moves to smg, one at a
   time, drained at the entry first (roles/vllm_router/tasks/restart.yml); a router already on smg is not touched;
2. `playbooks/router.yml` with the inventory: each router goes back to what the inventory says (the lab's
   vllm_router_implementation per router host).

Fails (exit 1) when a goal is missed: a request failed; a playbook failed; a router that moves did not restart or does
not run the program it should (its main process: smg names itself smg::router); a router that does not move restarted.

    scripts/lab/router-move.py --out lab-results/router-move.json
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import labinv  # noqa: E402
import load  # noqa: E402


def sh(host, *cmd):
    return subprocess.run([os.environ.get("DOCKER", "docker"), "exec", host, *cmd], capture_output=True, text=True,
                          check=True, timeout=60).stdout.strip()


def router_state(routers):
    """{router: (main PID, program)} of each router's unit: program smg when its process names itself smg::router."""
    out = {}
    for r in routers:
        pid = sh(r, "systemctl", "show", "-p", "MainPID", "--value", "vllm-router")
        comm = sh(r, "cat", "/proc/%s/comm" % pid) if pid not in ("", "0") else ""
        out[r] = (pid, "smg" if comm.startswith("smg::") else "vllm-router" if comm else "")
    return out


def move_problems(name, before, after, want):
    """The goals one move missed: every router whose program changes restarted onto it, the others kept their PID.
    before/after: router_state; want: {router: program}."""
    out = []
    for r, program in sorted(want.items()):
        moves = before[r][1] != program
        if after[r][1] != program:
            out.append("%s: %s runs %r, not %s" % (name, r, after[r][1], program))
        elif moves and after[r][0] == before[r][0]:
            out.append("%s: %s did not restart onto %s" % (name, r, program))
        elif not moves and after[r][0] != before[r][0]:
            out.append("%s: %s restarted (PID %s -> %s) though it already ran %s" % (
                name, r, before[r][0], after[r][0], program))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(REPO, "lab-results", "router-move.json"))
    args = ap.parse_args(argv)
    lab = labinv.Lab()
    routers = lab.hosts("vllm_router")
    inv = os.path.join(REPO, "molecule", "default", "inventory")
    inventory_program = {r: lab.host_vars(r).get("vllm_router_implementation", lab.var("vllm_router_implementation"))
                         for r in routers}
    env = dict(os.environ, PD_CLIENT_CA=os.environ.get("PD_CLIENT_CA") or lab.client_ca(),
               PD_CLIENT_KEY=os.environ.get("PD_CLIENT_KEY") or lab.client_key())
    os.environ.update(PD_CLIENT_CA=env["PD_CLIENT_CA"], PD_CLIENT_KEY=env["PD_CLIENT_KEY"])  # load.py's TLS reads them
    model, client = lab.var("vllm_served_model_name"), lab.client_url()
    if load.until_serving(client, model, env["PD_CLIENT_KEY"], prompt="warm up " * 40) is None:
        print("[router-move] the lab does not serve before the test", file=sys.stderr)
        return 1
    results = os.path.dirname(os.path.abspath(args.out))
    os.makedirs(results, exist_ok=True)
    stop = tempfile.mktemp()
    load_out = os.path.join(results, "router-move-load.json")
    loader = subprocess.Popen([sys.executable, os.path.join(HERE, "load.py"), "--url", client, "--model", model,
                               "--workers", "1", "--pause", "0.5", "--duration", "3600", "--stop-file", stop,
                               "--out", load_out], env=env)
    time.sleep(5)
    steps, problems = [], []
    for name, extra, want in [("to smg", ["-e", "vllm_router_implementation=smg"], {r: "smg" for r in routers}),
                              ("back to the inventory", [], inventory_program)]:
        before = router_state(routers)
        t0 = time.time()
        log = os.path.join(results, "router-move-%s.log" % name.replace(" ", "-"))
        with open(log, "w") as fh:
            rc = subprocess.run([os.path.join(REPO, ".venv", "bin", "ansible-playbook"), "-i", inv,
                                 os.path.join(REPO, "playbooks", "router.yml")] + extra,
                                stdout=fh, stderr=subprocess.STDOUT, cwd=REPO).returncode
        after = router_state(routers)
        step = {"name": name, "rc": rc, "playbook_s": round(time.time() - t0, 1), "log": log,
                "before": before, "after": after, "want": want}
        step["problems"] = (["%s: playbook rc=%d (%s)" % (name, rc, log)] if rc else []) + \
            move_problems(name, before, after, want)
        problems += step["problems"]
        steps.append(step)
        print("[router-move] %s: playbook %.0f s, rc %d; %s" % (
            name, step["playbook_s"], rc, ", ".join("%s %s -> %s" % (r, before[r][1], after[r][1]) for r in routers)),
            flush=True)
    time.sleep(5)
    open(stop, "w").close()
    loader.wait(timeout=300)
    summary = json.load(open(load_out))
    if summary.get("failed"):
        problems.append("%d of %d requests failed: %s" % (summary["failed"], summary["requests"],
                                                         summary.get("failures", [])[:5]))
    out = {"steps": steps, "requests": summary.get("requests"), "failed": summary.get("failed"),
           "latency_max_s": summary.get("latency_max_s"), "problems": problems}
    with open(args.out, "w") as fh:
        json.dump(out, fh, indent=2)
    print("[router-move] requests through the entry: %s, failed: %s, slowest %.2f s" % (
        out["requests"], out["failed"], out["latency_max_s"] or 0))
    for p in problems:
        print("ROUTER-MOVE FAILED: " + p, file=sys.stderr)
    if not problems:
        print("[router-move] passed: every goal met")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
