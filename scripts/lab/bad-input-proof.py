#!/usr/bin/env python3
"""Prove on a converged lab that bad inventories change nothing, and that --check --diff is clean.

1. Snapshot every host: sha256, mode and owner of every file the roles write (units and their
   enablement links, configs, certificates, tools, plugins, models, venv markers), each venv's
   installed distributions, the service users, the dpkg package list, and the state and main PID of
   every bundle unit (an unchanged PID proves nothing restarted). Every `docker exec` must succeed,
   and the snapshot must hold what the host's groups deploy (a failed or empty snapshot is no proof).
2. Run site.yml against the lab with each bad input below. Each run must fail, and its FIRST failed
   task must be a `Preflight |` check whose message (not a task or host name) names the input.
3. Snapshot again: identical.
4. `site.yml --check --diff` against the same lab must report changed=0 on every host.

    bad-input-proof.py --inventory molecule/default/inventory
Lab-only (docker exec). The full list of refused inventories is tests/preflight/cases.yml; this is
the subset run against live hosts.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from labinv import Lab  # noqa: E402  (the lab's names, from its inventory)

LAB = Lab()
DOCKER = os.environ.get("DOCKER", "docker")
LAB_INVENTORY = REPO / "molecule" / "default" / "inventory"
LAB_VAULT_PASS = REPO / "molecule" / "default" / "vault-pass-LAB-ONLY"

# Every path the roles write (grep roles/*/tasks for dest:/path:), whole trees: configs, units and
# their enablement links, env files, certificates, rulesets, tools, the vLLM plugins, the models,
# apt sources/keyrings of the rdma role. Venvs are not hashed file by file: see VENVS.
MANAGED = ["/etc/systemd/system", "/etc/etcd", "/etc/default/etcd", "/etc/mooncake", "/etc/vllm",
           "/etc/vllm-router", "/etc/modules-load.d", "/etc/security/limits.d", "/etc/sysctl.d",
           "/etc/nftables.d", "/etc/pd-bundle", "/etc/apt/sources.list.d", "/etc/apt/keyrings",
           "/opt/mooncake/bin", "/srv/models"]
# Role defaults of the paths an inventory may move (roles/*/defaults/main.yml).
PATH_DEFAULTS = {"vllm_venv": "/opt/vllm/venv", "mooncake_venv": "/opt/mooncake/venv",
                 "vllm_router_venv": "/opt/vllm-router/venv", "vllm_model": "/srv/models/model"}
USERS = {"etcd_user": "etcd", "mooncake_master_user": "mooncake", "vllm_user": "vllm",
         "vllm_router_user": "vllm-router"}
UNIT_PATTERNS = ["etcd.service", "mooncake-master.service", "vllm-router.service", "vllm@*.service",
                 "pd-*.service", "pd-*.timer"]
# Oneshot services their timer starts on schedule (the PD canary every vllm_router_canary_interval): their state and
# PID change by design between two snapshots. Their timer's state is compared instead (UNIT_PATTERNS).
TIMER_DRIVEN = ["pd-canary.service"]

# Runs on each host (python3 is there: Ansible needs it). Prints one JSON object {key: value}:
#   file:<path>   sha256, mode, owner of every regular file under the managed trees
#   link:<path>   a symlink's target (units' enablement lives in *.wants/ links)
#   venv:<path>   the venv's installed distributions (sorted *.dist-info names) and pyvenv.cfg, hashed:
#                 what pip changed, without hashing tens of thousands of files
#   user:<name>   the passwd entry, or "absent"
#   dpkg          hash of every installed package and version
#   unit:<id>     LoadState ActiveState SubState MainPID (an unchanged PID proves nothing restarted)
# Any error reading any of it exits non-zero: a snapshot never silently comes back smaller.
SNAPSHOT_PY = r"""
import glob, hashlib, json, os, pwd, subprocess, sys
spec = json.loads(sys.argv[1])
out = {}
def sha(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
def entry(path):
    if os.path.islink(path):
        out["link:" + path] = os.readlink(path)
    elif os.path.isfile(path):
        st = os.stat(path)
        out["file:" + path] = "%s %o %d:%d" % (sha(path), st.st_mode & 0o7777, st.st_uid, st.st_gid)
def fail(err):
    raise err
for top in spec["paths"]:
    if not os.path.lexists(top):
        continue
    if not os.path.isdir(top) or os.path.islink(top):
        entry(top)
        continue
    for root, dirs, files in os.walk(top, onerror=fail):
        for name in files + [d for d in dirs if os.path.islink(os.path.join(root, d))]:
            entry(os.path.join(root, name))
for venv in spec["venvs"]:
    if not os.path.isdir(venv):
        continue
    dists = sorted(os.path.basename(p) for p in glob.glob(venv + "/lib/python3*/site-packages/*.dist-info"))
    if not dists:
        sys.exit("venv %s has no *.dist-info under lib/python3*/site-packages" % venv)
    h = hashlib.sha256(("\n".join(dists) + "\n").encode())
    h.update(open(venv + "/pyvenv.cfg", "rb").read())
    out["venv:" + venv] = "%d dists %s" % (len(dists), h.hexdigest())
for user in spec["users"]:
    try:
        out["user:" + user] = ":".join(str(x) for x in pwd.getpwnam(user))
    except KeyError:
        out["user:" + user] = "absent"
pkgs = subprocess.run(["dpkg-query", "-W", "-f", "${Package} ${Version} ${db:Status-Abbrev}\n"],
                      capture_output=True, check=True).stdout
out["dpkg"] = "%d packages %s" % (len(pkgs.splitlines()), hashlib.sha256(pkgs).hexdigest())
show = subprocess.run(["systemctl", "show", "-p", "Id,LoadState,ActiveState,SubState,MainPID", "--"] + spec["units"],
                      capture_output=True, text=True, check=True).stdout
for block in show.strip().split("\n\n"):
    kv = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
    if kv.get("Id", "").endswith(".timer"):  # its SubState is 'running' while its service runs: loaded and active only
        out["unit:" + kv["Id"]] = "%s %s" % (kv.get("LoadState"), kv.get("ActiveState"))
    elif kv.get("Id") and kv["Id"] not in spec.get("timer_driven", []):
        out["unit:" + kv["Id"]] = "%s %s %s %s" % (kv.get("LoadState"), kv.get("ActiveState"), kv.get("SubState"),
                                                  kv.get("MainPID"))
print(json.dumps(out, sort_keys=True))
"""

# (id, extra vars, needles). Extra vars override the lab inventory. The case passes only when the
# FIRST failed task is a preflight check (or the rdma role's read-only selection) and the message of
# that task, on a host it failed on, contains every needle (the variable and its bad value, or the
# exact fault), names that host and says "Fix:". Task and host names do not count.
CASES = [
    ("wrong_type_port", {"vllm_router_port": "80a"}, ('vllm_router_port="80a"', "is not an integer")),
    ("wrong_type_bool", {"mooncake_master_watchdog": "sometimes"},
     ('mooncake_master_watchdog="sometimes"', "is not a boolean")),
    ("unknown_connector", {"vllm_kv_connector": "NixlConnector"},
     ('vllm_kv_connector="NixlConnector"', "is not one of")),
    ("unknown_protocol", {"mooncake_protocol": "roce"}, ('mooncake_protocol="roce"', "is not one of")),
    ("malformed_size", {"mooncake_check_size": "4 gigs"}, ('mooncake_check_size="4 gigs"', "is not a memory size")),
    ("missing_model", {"vllm_model_src": "/nonexistent/model"},
     ('vllm_model_src="/nonexistent/model"', "not a directory on the controller")),
    # etcd and the master share etcd1/etcd2: the same port for both.
    ("port_collision", {"etcd_client_port": 9003},
     ("Port collision on", "port 9003 is used by etcd_client_port and mooncake_master_metrics_port")),
    # An impossible GPU split: TP 2 over 3 GPUs (on the cuda settings the lab's CPU build is swapped for).
    ("gpu_split_on_cuda", {"vllm_platform": "cuda", "vllm_package": "vllm", "vllm_version": "0.33.0",
                           "mooncake_package": "mooncake-transfer-engine-cuda13",
                           "mooncake_version": "0.3.14", "vllm_lab_cpu_device_guard": False,
                           "vllm_host_gpu_count": 8,
                           "vllm_instances": [{"name": "decode0", "port": 8200, "gpus": [0, 1, 2],
                                               "tensor_parallel_size": 2, "nics": []}]},
     ("vllm_instances[decode0].tensor_parallel_size=2", "differs from its 3 GPUs")),
    # A NIC the host does not have, on protocol rdma. A container has no RDMA port at all, so the rdma
    # role's read-only sysfs check refuses it one check before the NIC selection would.
    ("unknown_nic", {"vllm_instances": [{"name": "decode0", "port": 8200, "gpus": [], "nics": ["mlx5_9"]}],
                     "rdma_enabled": True, "mooncake_protocol": "rdma", "rdma_install_packages": False,
                     "rdma_load_modules": False, "rdma_apply_sysctl": False},
     ("mooncake_protocol=rdma on", "no RDMA port is ACTIVE")),
]
# An even etcd member count needs a different group, so it is an extra inventory source
# (one more etcd member: the lab's first prefill host).
EVEN_ETCD_ID = "even_etcd_count"
EVEN_ETCD = "[etcd]\n{host}\n"
EVEN_ETCD_NEEDLES = ("The group etcd has 4 members", "needs an odd count")
REFUSING_TASK = re.compile(r"\b(Preflight|Select) \|")


class ProofError(Exception):
    """The proof could not look (docker failed, output unreadable): never a pass."""


def docker(host, *argv):
    """stdout of `docker exec host argv...`; raises on a non-zero exit (a stopped container, a
    missing tool, a read error), so that an empty answer is never taken for an empty host."""
    cmd = [DOCKER, "exec", host, *argv]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ProofError(f"docker exec {host}: {e}") from e
    if res.returncode != 0:
        raise ProofError(f"docker exec {host} failed (rc={res.returncode}): {(res.stderr or res.stdout).strip()[-800:]}")
    return res.stdout


def inventory(paths):
    """{host: hostvars} and {group: [hosts]} of the inventory sources (ansible-inventory --list)."""
    cmd = [str(REPO / ".venv/bin/ansible-inventory"), "--list"]
    for inv in paths:
        cmd += ["-i", inv]
    res = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    if res.returncode != 0:
        raise ProofError(f"ansible-inventory rc={res.returncode}: {res.stderr.strip()[-800:]}")
    doc = json.loads(res.stdout)

    def members(group):
        d = doc.get(group, {})
        return set(d.get("hosts", [])).union(*[members(c) for c in d.get("children", [])] or [set()])

    groups = {g: sorted(members(g)) for g in doc if g != "_meta"}
    return doc.get("_meta", {}).get("hostvars", {}), groups


def _truthy(v):
    return str(v).lower() in ("true", "yes", "on", "1")


def host_spec(host, hv, groups):
    """What to snapshot on one host, and what its snapshot must contain (keys of snapshot_host)."""
    v = dict(PATH_DEFAULTS)
    v.update({k: hv[k] for k in PATH_DEFAULTS if k in hv})
    def in_(g):
        return host in groups.get(g, [])
    vllm, master, router = in_("vllm_prefill") or in_("vllm_decode"), in_("mooncake_master"), in_("vllm_router")
    plugins = str(Path(v["vllm_venv"]).parent / "plugins")
    venvs = [v["vllm_venv"], v["mooncake_venv"], v["vllm_router_venv"]]
    paths = MANAGED + [plugins, str(Path(v["vllm_model"]).parent)] + [f"{p}/.pd-bundle-pip.json" for p in venvs]
    # The file the lab shim patches inside the vLLM venv (roles/vllm/vars/main.yml).
    paths += [f"{v['vllm_venv']}/lib/python3.11/site-packages/vllm/distributed/kv_transfer/kv_connector/v1/"
              "mooncake/mooncake_connector.py"]
    users = sorted({hv.get(k, d) for k, d in USERS.items()})
    instances = [i["name"] for i in hv.get("vllm_instances", [])] if vllm else []
    units = UNIT_PATTERNS + [f"vllm@{n}.service" for n in instances]
    need = ["dpkg"]
    running = []
    if in_("etcd"):
        need += ["file:/etc/etcd/etcd.env", "file:/etc/systemd/system/etcd.service",
                 f"user:{hv.get('etcd_user', 'etcd')}"]
        running.append("etcd.service")
    if master or vllm:  # the mooncake role (a dependency of both)
        need += [f"file:{v['mooncake_venv']}/.pd-bundle-pip.json", f"venv:{v['mooncake_venv']}",
                 "file:/opt/mooncake/bin/mooncake-check"]
    if master:
        need += ["file:/etc/mooncake/master.env", "file:/etc/systemd/system/mooncake-master.service"]
        running.append("mooncake-master.service")
    if vllm:
        need += ["file:/etc/systemd/system/vllm@.service", f"file:{plugins}/pd_bundle_drain.py",
                 f"file:{plugins}/sitecustomize.py", f"file:{v['vllm_venv']}/.pd-bundle-pip.json",
                 f"venv:{v['vllm_venv']}"]
        need += [f"file:/etc/vllm/{n}.env" for n in instances]
        running += [f"vllm@{n}.service" for n in instances]
    if router:
        need += ["file:/etc/vllm-router/router.env", "file:/etc/systemd/system/vllm-router.service",
                 f"file:{v['vllm_router_venv']}/.pd-bundle-pip.json", f"venv:{v['vllm_router_venv']}"]
        running.append("vllm-router.service")
    if _truthy(hv.get("firewall_enabled", False)) and (vllm or master or router or in_("etcd")):
        need += ["file:/etc/pd-bundle/firewall.nft", "file:/etc/systemd/system/pd-bundle-firewall.service"]
    return {"paths": paths, "venvs": venvs, "users": users, "units": units,
            "need": need, "running": running, "model_dir": v["vllm_model"] if vllm else None}


def snapshot_host(host, spec):
    out = docker(host, "python3", "-c", SNAPSHOT_PY, json.dumps(
        dict({k: spec[k] for k in ("paths", "venvs", "users", "units")}, timer_driven=TIMER_DRIVEN)))
    try:
        snap = json.loads(out)
    except ValueError as e:
        raise ProofError(f"{host}: unreadable snapshot: {out[:300]!r}") from e
    return snap


def snapshot_problems(host, snap, spec):
    """Why a snapshot cannot be trusted: empty, or without what the host's groups deploy."""
    if not snap or not any(k.startswith("file:") for k in snap):
        return [f"{host}: empty snapshot (no managed file found)"]
    probs = [f"{host}: snapshot lacks {k}" for k in spec["need"] if k not in snap]
    for unit in spec["running"]:
        state = snap.get(f"unit:{unit}", "").split()
        if len(state) != 4 or state[:2] != ["loaded", "active"] or state[3] in ("", "0"):
            probs.append(f"{host}: {unit} is not loaded, active with a main PID: {' '.join(state) or 'absent'}")
    if spec["model_dir"] and not any(k.startswith(f"file:{spec['model_dir']}/") for k in snap):
        probs.append(f"{host}: snapshot has no model file under {spec['model_dir']}")
    return probs


def snapshot(hosts, specs):
    """Every host at once (one docker exec each)."""
    with ThreadPoolExecutor(max_workers=len(hosts) or 1) as pool:
        return dict(zip(hosts, pool.map(lambda h: snapshot_host(h, specs[h]), hosts)))


def diff(a, b):
    """One line per host whose snapshot differs; a host missing from either side is a difference."""
    out = []
    for h in sorted(set(a) | set(b)):
        if h not in a or h not in b:
            out.append(f"{h}: only in the {'second' if h in b else 'first'} snapshot")
            continue
        old, new = a[h], b[h]
        if old == new:
            continue
        gone = sorted(k for k in old if k not in new)
        added = sorted(k for k in new if k not in old)
        changed = sorted(f"{k}: {old[k]} -> {new[k]}" for k in old if k in new and old[k] != new[k])
        out.append(f"{h}: changed {changed[:5]} removed {gone[:5]} added {added[:5]}")
    return out


def playbook(inventory, *extra, check=False):
    """site.yml with the json callback (one document: every task's per-host result)."""
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0",
               ANSIBLE_STDOUT_CALLBACK="ansible.posix.json", ANSIBLE_DEPRECATION_WARNINGS="0")
    cmd = [str(REPO / ".venv/bin/ansible-playbook"), "site.yml"]
    for inv in inventory:
        cmd += ["-i", inv]
    cmd += list(extra)
    if check:
        cmd += ["--check", "--diff"]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)


def run_doc(stdout):
    """The json callback's document (profile_tasks may print timing lines before it)."""
    if stdout.startswith("{"):
        start = 0
    else:
        start = stdout.find("\n{\n") + 1
        if start == 0:
            raise ProofError(f"no json callback output: {stdout[-500:]!r}")
    try:
        doc, _ = json.JSONDecoder().raw_decode(stdout[start:])
    except ValueError as e:
        raise ProofError(f"unreadable json callback output: {e}") from e
    if "plays" not in doc or "stats" not in doc:
        raise ProofError("json callback output without plays/stats")
    return doc


def first_failure(doc):
    """(task name, {host: [failure messages]}) of the first task that failed or was unreachable on
    any host, or (None, {})."""
    for play in doc.get("plays", []):
        for task in play.get("tasks", []):
            fails = {}
            for host, res in task.get("hosts", {}).items():
                if not (res.get("failed") or res.get("unreachable")):
                    continue
                msgs = [str(r.get("msg", "")) for r in res.get("results", []) if r.get("failed")]
                fails[host] = msgs or [str(res.get("msg", ""))]
            if fails:
                return task.get("task", {}).get("name", ""), fails
    return None, {}


def refusal_problem(rc, doc, needles):
    """None when the run was refused as it must be, else why not."""
    if rc == 0:
        return "site.yml succeeded"
    task, fails = first_failure(doc)
    if task is None:
        return f"rc={rc} but no task failed"
    if not REFUSING_TASK.search(task):
        return f"the first failed task {task!r} is not a preflight check"
    changed = sorted(h for h, s in doc.get("stats", {}).items() if s.get("changed"))
    if changed:
        return f"the refused run changed {changed}"
    # The host the message names: preflight's checks run once for the play (run_once), so the failure is reported on
    # the play's first host and its message names the host whose value is refused.
    hosts = set(doc.get("stats", {})) | set(fails)
    for msgs in fails.values():
        for msg in msgs:
            if all(n in msg for n in needles) and any(re.search(r"\b%s\b" % re.escape(h), msg) for h in hosts) \
                    and "Fix:" in msg:
                return None
    return (f"no failure message of {task!r} names {list(needles)}, a host and a Fix: "
            f"{ {h: [m[:300] for m in ms] for h, ms in fails.items()} }")


def check_diff_problem(rc, doc, hosts):
    """None when --check --diff ran on every host, failed nowhere and changed nothing."""
    stats = doc.get("stats", {})
    missing = sorted(set(hosts) - set(stats))
    bad = {h: s for h, s in stats.items() if s.get("changed") or s.get("failures") or s.get("unreachable")}
    if rc != 0 or missing or bad:
        return f"rc={rc}, hosts without a result {missing}, changed/failed {bad}"
    return None


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--inventory", default="molecule/default/inventory")
    ap.add_argument("--hosts", nargs="+",
                    default=LAB.hosts())
    ap.add_argument("--out", default="bad-input-proof.json")
    ap.add_argument("--no-check-diff", dest="check_diff", action="store_false",
                    help="skip the site.yml --check --diff run (it must report changed=0 on every host)")
    ids = [c[0] for c in CASES] + [EVEN_ETCD_ID]
    # CI's lab step runs a few (one per kind of check: an argument spec, a fleet rule, a group count, the rdma role's
    # read-only selection), without the --check run: every refusal's message is proven by tests/preflight. Default:
    # all of them.
    ap.add_argument("--cases", nargs="+", choices=ids, default=ids, help="the bad inputs to run (default: all)")
    args = ap.parse_args(argv)
    if Path(args.inventory).resolve() == LAB_INVENTORY.resolve():
        os.environ.setdefault("ANSIBLE_VAULT_PASSWORD_FILE", str(LAB_VAULT_PASS))
    try:
        return prove(args)
    except ProofError as e:
        print(f"PROOF FAILED: could not look: {e}", file=sys.stderr)
        return 1


def prove(args):
    problems, rows = [], []
    hostvars, groups = inventory([args.inventory])
    unknown = sorted(set(args.hosts) - set(hostvars))
    if unknown:
        raise ProofError(f"hosts not in {args.inventory}: {unknown}")
    specs = {h: host_spec(h, hostvars[h], groups) for h in args.hosts}
    before = snapshot(args.hosts, specs)
    for h in args.hosts:
        problems += snapshot_problems(h, before[h], specs[h])
    if problems:
        raise ProofError("the lab is not converged as the proof expects:\n  " + "\n  ".join(problems))
    tmp = Path(tempfile.mkdtemp())
    even = tmp / "even-etcd.ini"
    even.write_text(EVEN_ETCD.format(host=LAB.hosts("vllm_prefill")[0]))
    runs = [(cid, [args.inventory], ["-e", json.dumps(ev)], needles) for cid, ev, needles in CASES]
    runs.append((EVEN_ETCD_ID, [args.inventory, str(even)], [], EVEN_ETCD_NEEDLES))
    runs = [r for r in runs if r[0] in args.cases]

    def refused(run):
        cid, inv, extra, needles = run
        t0 = time.monotonic()
        res = playbook(inv, *extra)
        try:
            doc = run_doc(res.stdout)
        except ProofError as e:
            doc, why = {}, str(e)
        else:
            why = refusal_problem(res.returncode, doc, needles)
        task, fails = first_failure(doc)
        msg = next((m for ms in fails.values() for m in ms), "")
        row = {"case": cid, "rc": res.returncode, "failed_task": task or "", "refused": why is None,
               "seconds": round(time.monotonic() - t0, 1), "message": msg[:400]}
        return row, None if why is None else f"{cid}: {why}\n{res.stderr[-1500:]}"

    def check_diff():
        t0 = time.monotonic()
        res = playbook([args.inventory], check=True)
        try:
            doc = run_doc(res.stdout)
            why = check_diff_problem(res.returncode, doc, args.hosts)
        except ProofError as e:
            doc, why = {}, str(e)
        if why is not None:
            task, fails = first_failure(doc)
            why = f"--check --diff: {why}; first failure {task!r} {fails}\n{res.stderr[-2000:]}"
        return {"rc": res.returncode, "changed": {h: s.get("changed") for h, s in doc.get("stats", {}).items()},
                "seconds": round(time.monotonic() - t0, 1)}, why

    # None of these runs may change a host, so they run side by side (PROOF_JOBS at a time; the --check
    # run, the longest, first) and one snapshot after all of them must equal the one before.
    with ThreadPoolExecutor(max_workers=int(os.environ.get("PROOF_JOBS", "3"))) as pool:
        check = pool.submit(check_diff) if args.check_diff else None
        for row, why in pool.map(refused, runs):
            rows.append(row)
            if why is not None:
                problems.append(why)
        report_check = check.result() if check else None
    changes = diff(before, snapshot(args.hosts, specs))
    if changes:
        problems.append("hosts changed after the refused runs" + (" and --check" if check else "") + ":\n  "
                        + "\n  ".join(changes))
    report = {"cases": rows, "unchanged_after_refusals": not changes, "problems": problems}
    if report_check:
        report["check_diff"], why = report_check
        if why is not None:
            problems.append(why)

    Path(args.out).write_text(json.dumps(report, indent=2))
    print(f"{'bad input':22} {'refused':8} {'s':>6}  failing task")
    for r in rows:
        print(f"{r['case']:22} {str(r['refused']):8} {r['seconds']:>6}  {r['failed_task']}")
    n = {kind: sum(1 for s in before.values() for k in s if k.startswith(kind + ":"))
         for kind in ("file", "link", "venv", "unit")}
    print(f"snapshot of {len(before)} hosts: {n['file']} managed files checksummed, {n['link']} links, "
          f"{n['venv']} venvs' distributions, {n['unit']} unit states and PIDs, users, dpkg; "
          f"identical after the refused runs: {report['unchanged_after_refusals']}")
    if "check_diff" in report:
        print(f"--check --diff on the converged lab: rc={report['check_diff']['rc']}, "
              f"changed={report['check_diff']['changed']}")
    for p in problems:
        print(f"PROOF FAILED: {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
