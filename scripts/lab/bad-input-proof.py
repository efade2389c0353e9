#!/usr/bin/env python3
"""Prove on a converged lab that bad inventories change nothing, and that --check --diff is clean.

1. Snapshot every host: sha256 of every file the bundle manages, and the state and main PID of
   every bundle unit (an unchanged PID proves nothing restarted).
2. Run site.yml against the lab with each bad input below. Each run must fail, in a
   `Preflight |` task, naming the variable.
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
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCKER = os.environ.get("DOCKER", "docker")
# Everything the roles write (configs, units, env files, tools, models, venvs' pins).
MANAGED = ["/etc/systemd/system", "/etc/etcd", "/etc/default/etcd", "/etc/mooncake", "/etc/vllm",
           "/etc/vllm-router", "/etc/modules-load.d", "/etc/security/limits.d", "/etc/sysctl.d",
           "/etc/nftables.d", "/etc/pd-bundle", "/opt/mooncake/bin", "/srv/models"]
UNITS = "etcd.service mooncake-master.service vllm-router.service 'vllm@*.service' 'pd-*.service'"

# (id, extra vars, a substring the failure must contain). Extra vars override the lab inventory.
CASES = [
    ("wrong_type_port", {"vllm_router_port": "80a"}, "vllm_router_port"),
    ("wrong_type_bool", {"mooncake_master_http_metadata_server": "sometimes"},
     "mooncake_master_http_metadata_server"),
    ("unknown_connector", {"vllm_kv_connector": "NixlConnector"}, "vllm_kv_connector"),
    ("unknown_protocol", {"mooncake_protocol": "roce"}, "mooncake_protocol"),
    ("malformed_size", {"mooncake_check_size": "4 gigs"}, "mooncake_check_size"),
    ("missing_model", {"vllm_model_src": "/nonexistent/model"}, "vllm_model_src"),
    # etcd and the master share etcd1/etcd2: the same port for both.
    ("port_collision", {"etcd_client_port": 9003}, "Port collision"),
    # An impossible GPU split: TP 2 over 3 GPUs (on the cuda settings the lab's CPU build is swapped for).
    ("gpu_split_on_cuda", {"vllm_platform": "cuda", "vllm_package": "vllm", "vllm_version": "0.33.0",
                           "mooncake_package": "mooncake-transfer-engine-cuda13",
                           "mooncake_version": "0.3.14", "vllm_lab_cpu_device_guard": False,
                           "vllm_host_gpu_count": 8,
                           "vllm_instances": [{"name": "decode0", "port": 8200, "gpus": [0, 1, 2],
                                               "tensor_parallel_size": 2, "nics": []}]},
     "tensor_parallel_size"),
    # A NIC the host does not have (the rdma role reads sysfs before it changes anything).
    ("unknown_nic", {"vllm_instances": [{"name": "decode0", "port": 8200, "gpus": [], "nics": ["mlx5_9"]}],
                     "rdma_enabled": True, "mooncake_protocol": "rdma", "rdma_install_packages": False,
                     "rdma_load_modules": False, "rdma_apply_sysctl": False},
     # A container has no RDMA port at all, so the rdma preflight refuses it one check earlier.
     "RDMA"),
]
# An even etcd member count needs a different group, so it is an extra inventory source.
EVEN_ETCD = "[etcd]\nprefill1\n"


def docker(host, script):
    res = subprocess.run([DOCKER, "exec", host, "bash", "-c", script], capture_output=True, text=True,
                         timeout=120)
    return res.stdout


def snapshot(hosts):
    snap = {}
    for h in hosts:
        files = docker(h, "find " + " ".join(MANAGED) + " -xdev -type f 2>/dev/null | sort | "
                          "xargs -r sha256sum")
        units = docker(h, f"systemctl show -p Id -p ActiveState -p SubState -p MainPID {UNITS} 2>/dev/null")
        snap[h] = {"files": files, "units": units}
    return snap


def diff(a, b):
    out = []
    for h in a:
        for kind in ("files", "units"):
            if a[h][kind] != b[h][kind]:
                old, new = set(a[h][kind].splitlines()), set(b[h][kind].splitlines())
                out.append(f"{h} {kind}: -{sorted(old - new)[:5]} +{sorted(new - old)[:5]}")
    return out


def playbook(inventory, *extra, check=False):
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0")
    cmd = [str(REPO / ".venv/bin/ansible-playbook"), "site.yml"]
    for inv in inventory:
        cmd += ["-i", inv]
    cmd += list(extra)
    if check:
        cmd += ["--check", "--diff"]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)


def failed_task(output):
    """Name of the first task that failed, from the default callback's output."""
    task = None
    for line in output.splitlines():
        m = re.match(r"TASK \[(.*)\]", line.strip())
        if m:
            task = m.group(1)
        if re.match(r"\s*(fatal|failed):", line):
            return task
    return None


def recap(output):
    """{host: {ok, changed, failed, ...}} from the PLAY RECAP."""
    res = {}
    for m in re.finditer(r"^(\S+)\s+:\s+((?:\w+=\d+\s*)+)$", output, re.M):
        res[m.group(1)] = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m.group(2))}
    return res


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--inventory", default="molecule/default/inventory")
    ap.add_argument("--hosts", nargs="+",
                    default=["etcd1", "etcd2", "etcd3", "prefill1", "decode1", "decode2", "router1"])
    ap.add_argument("--out", default="bad-input-proof.json")
    ap.add_argument("--no-check-diff", dest="check_diff", action="store_false",
                    help="skip the site.yml --check --diff run (it must report changed=0 on every host)")
    args = ap.parse_args(argv)

    problems, rows = [], []
    before = snapshot(args.hosts)
    tmp = Path(tempfile.mkdtemp())
    even = tmp / "even-etcd.ini"
    even.write_text(EVEN_ETCD)
    runs = [(cid, [args.inventory], ["-e", json.dumps(ev)], needle) for cid, ev, needle in CASES]
    runs.append(("even_etcd_count", [args.inventory, str(even)], [], "etcd"))
    for cid, inv, extra, needle in runs:
        t0 = time.monotonic()
        res = playbook(inv, *extra)
        out = res.stdout + res.stderr
        task = failed_task(out) or ""
        # Refused = non-zero exit, the first failure is a preflight (or the read-only NIC selection)
        # task, and it names the input.
        ok = res.returncode != 0 and re.search(r"(Preflight|Select) \|", task) is not None and needle in out
        msg = next((ln.strip() for ln in out.splitlines() if "Fix:" in ln or "msg:" in ln), "")[:240]
        rows.append({"case": cid, "rc": res.returncode, "failed_task": task, "refused": ok,
                     "seconds": round(time.monotonic() - t0, 1), "message": msg})
        if not ok:
            problems.append(f"{cid}: rc={res.returncode}, failed task {task!r}, '{needle}' in output: "
                            f"{needle in out}\n{out[-1500:]}")
    after = snapshot(args.hosts)
    changes = diff(before, after)
    if changes:
        problems.append("hosts changed after refused runs:\n  " + "\n  ".join(changes))
    report = {"cases": rows, "unchanged_after_refusals": not changes, "problems": problems}

    if args.check_diff:
        t0 = time.monotonic()
        res = playbook([args.inventory], check=True)
        out = res.stdout + res.stderr
        rc = recap(out)
        changed = {h: r.get("changed", -1) for h, r in rc.items()}
        check_ok = res.returncode == 0 and rc and all(v == 0 for v in changed.values())
        if not check_ok:
            problems.append(f"--check --diff: rc={res.returncode}, changed per host {changed}\n{out[-3000:]}")
        changes = diff(after, snapshot(args.hosts))
        if changes:
            problems.append("hosts changed after --check:\n  " + "\n  ".join(changes))
        report["check_diff"] = {"rc": res.returncode, "changed": changed,
                                "seconds": round(time.monotonic() - t0, 1)}

    Path(args.out).write_text(json.dumps(report, indent=2))
    print(f"{'bad input':22} {'refused':8} {'s':>6}  failing task")
    for r in rows:
        print(f"{r['case']:22} {str(r['refused']):8} {r['seconds']:>6}  {r['failed_task']}")
    n_files = sum(len(s["files"].splitlines()) for s in before.values())
    print(f"managed files checksummed: {n_files} on {len(before)} hosts; unit states and PIDs recorded; "
          f"identical after the refused runs: {report['unchanged_after_refusals']}")
    if "check_diff" in report:
        print(f"--check --diff on the converged lab: rc={report['check_diff']['rc']}, "
              f"changed={report['check_diff']['changed']}")
    for p in problems:
        print(f"PROOF FAILED: {p}", file=sys.stderr)
    return 1 if problems else 0

if __name__ == "__main__":
    raise SystemExit(main())
