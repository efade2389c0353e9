#!/usr/bin/env python3
"""Two model pools behind the one entry, on the docker lab (issue 34; docs/pools.md).

The lab's four vLLM instances split into two pools (molecule/default/pools.yml): pool a serves the lab's model on one
prefill instance and one decode host behind one router, pool b serves a second tiny model (its own weights) on the
other prefill instance and decode host behind the other router. With --converge it first re-converges the lab with
that overlay (site.yml, every instance restarting at once, as the
store step does); the lab step after it (converge-store) converges without pools again.

Through the entry's VIP with the official `openai` SDK (keep-alive; completions and chat, plain and streamed), it
fails (exit 1) when a goal is missed:
- a request for a pool's model reached another pool's instance, or its decode did not get its prompt's KV by
  transfer (counters: each prefill's vllm:request_success_total, each decode's prompt tokens by source);
- GET /v1/models does not list both models; an unknown model is not 404 model_not_found; the key "ci" (pool b only)
  is not 403 model_not_allowed on pool a, or fails on pool b;
- a decode's transfer engine port accepts its own pool's prefill host but not the other pool's decode host (the
  firewall opens a host's KV ports to its own pools' hosts only);
- with --rolling: a rolling restart of pool a (playbooks/rolling_restart.yml -e rolling_restart_pool=a) under load on both
  pools fails a request of pool b, or restarts a unit of pool b (its vLLM units' and router's PIDs).
  Pool a has one prefill and one decode in the lab, so its own requests may fail while they restart: reported.
- with --p50: the entry's p50 with model routing over direct to the pool's router (a client on an entry host,
  keep-alive, interleaved) above --max-p50-ratio (1.05). A benchmark: noisy on the 2-core lab, not a lab step.
  It also reports HAProxy's own time per request (its log's Ta - Tr).
- with --p50 and --igw (reported, docs/pools.md): the same client also sends to a vllm-router in multi-model mode
  (--enable-igw) with both pools' workers, side by side, and six prompts through it alone count pool a's tokens by
  source (decode by transfer and computed, prefill computed).

    scripts/lab/pools-test.py --converge --rolling --out lab-results/pools.json
"""
import argparse
import json
import os
import re
import subprocess
import sys
import runpy
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "bench"))  # reuse_workload
import labinv  # noqa: E402
import load  # noqa: E402

from lablib import sh  # noqa: E402  (a command in a lab container)
from labinv import role_var  # noqa: E402  (a role's internal variable, where it is defined)
from lablib import metrics  # noqa: E402  (an instance's /metrics read on its host)
from lablib import canary_paused  # noqa: E402  (the PD canary's timer stopped for a window)
from reuse_workload import parse_sources  # noqa: E402  (scripts/bench: tokens by source)

OVERLAY = os.path.join(REPO, "molecule", "default", "pools.yml")


def members(lab, pool, roles=("prefill", "decode")):
    """(role, host, instance dict) of each of the pool's instances in ROLES (a host ref: every instance on it)."""
    for role in roles:
        for ref in pool[role]:
            host, _, name = ref.partition("/")
            for inst in lab.host_vars(host)["vllm_instances"]:
                if not name or inst["name"] == name:
                    yield role, host, inst


def counters(lab, pools):
    """{host/instance: {pool, role, done, ext, computed}} of every instance of the pools, from its /metrics: finished
    requests (vllm:request_success_total) and prompt tokens by KV transfer and computed (by source)."""
    out = {}
    for pool in pools:
        for role, host, inst in members(lab, pool):
            text = metrics(host, inst["port"], lab)
            done = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                       if line.startswith("vllm:request_success_total"))
            src = parse_sources(text)
            out["%s/%s" % (host, inst["name"])] = {"pool": pool["name"], "role": role, "done": done,
                                                  "ext": src.get("external_kv_transfer", 0.0),
                                                  "computed": src.get("local_compute", 0.0)}
    return out


def send_all(client, model, tag):
    """A completion and a chat, each plain and streamed, with fresh prompts of whole KV blocks; [(kind, ok, err)]."""
    out = []
    for stream in (False, True):
        ok, err = load.sdk_request(client, model, "%s %s %s " % (tag, uuid.uuid4().hex, stream) + load.PROMPT_BODY, 8,
                                   stream=stream)
        out.append(("completion" + (" streamed" if stream else ""), ok, err))
        try:
            msgs = [{"role": "user", "content": "%s %s chat " % (tag, uuid.uuid4().hex) + load.PROMPT_BODY}]
            if stream:
                text = "".join((c.choices[0].delta.content or "") for c in client.chat.completions.create(
                    model=model, messages=msgs, max_tokens=8, temperature=0, stream=True) if c.choices)
            else:
                r = client.chat.completions.create(model=model, messages=msgs, max_tokens=8, temperature=0)
                text = r.choices[0].message.content or ""
            out.append(("chat" + (" streamed" if stream else ""), bool(text), "" if text else "no text"))
        except Exception as exc:  # noqa: BLE001 - every SDK error is a failure
            out.append(("chat" + (" streamed" if stream else ""), False, "%s: %s" % (type(exc).__name__, exc)))
    return out


def routing_problems(pools, before, after, sent):
    """What the counters say went wrong after SENT requests for one pool: another pool's instance served one, the
    pool's prefill or decode served fewer, or its decode got no prompt tokens by transfer."""
    problems = []
    target = sent["pool"]
    for ref, b in before.items():
        a = after.get(ref, b)
        done, ext = a["done"] - b["done"], a["ext"] - b["ext"]
        if b["pool"] != target and done:
            problems.append("%s of pool %s finished %d requests sent for pool %s" % (ref, b["pool"], done, target))
        if b["pool"] == target and done < sent["requests"]:
            problems.append("%s of pool %s finished %d of the %d requests sent for it" % (ref, target, done,
                                                                                          sent["requests"]))
        if b["pool"] == target and b["role"] == "decode" and ext <= 0:
            problems.append("%s (decode, pool %s) got no prompt tokens by KV transfer" % (ref, target))
    return problems


def sdk_error(client, model):
    """(status, code) of one completion for MODEL, (200, None) when it succeeds."""
    import openai
    try:
        client.completions.create(model=model, prompt="probe " * 20, max_tokens=2)
        return 200, None
    except openai.APIStatusError as exc:
        body = exc.body if isinstance(exc.body, dict) else {}
        return exc.status_code, (body.get("error") or body).get("code") if isinstance(body, dict) else None


def connects(src, ip, port):
    """Whether a TCP connection from host SRC to ip:port is accepted (bash's /dev/tcp, 5 s)."""
    return sh(src, "timeout", "5", "bash", "-c", "exec 3<>/dev/tcp/%s/%s" % (ip, port), check=False).returncode == 0


def kv_isolation(lab, pools):
    """For each pool's decode host: a port of its transfer engine's range that it listens on accepts its own pool's
    prefill host and refuses the other pool's decode host (the firewall: a host's KV ports take its own pools' hosts
    only). [(decode host, port, peer, want, got)]."""
    lo, hi = int(lab.var("mooncake_rpc_port_min")), int(lab.var("mooncake_rpc_port_max"))
    out = []
    decodes = [[r.partition("/")[0] for r in p["decode"]] for p in pools]
    for i, pool in enumerate(pools):
        for host in decodes[i]:
            ip = lab.host_ip(host)
            ports = sorted(int(m) for m in re.findall(r":(\d+)\s", sh(host, "ss", "-Hltn").stdout)
                           if lo <= int(m) <= hi)
            if not ports:
                out.append((host, None, "-", True, False))
                continue
            own = pool["prefill"][0].partition("/")[0]
            other = next(h for j, d in enumerate(decodes) if j != i for h in d)
            out += [(host, ports[0], own, True, connects(own, ip, ports[0])),
                    (host, ports[0], other, False, connects(other, ip, ports[0]))]
    return out


def unit_pids(units):
    return {"%s:%s" % hu: sh(hu[0], "systemctl", "show", "-p", "MainPID", "--value", hu[1]).stdout.strip()
            for hu in units}


def pool_units(lab, pool):
    """(host, unit) of the pool's vLLM instances and routers."""
    return [(h, "vllm@" + i["name"]) for _, h, i in members(lab, pool)] + [(r, "vllm-router") for r in pool["routers"]]


P50_CLIENT = r"""
import http.client, json, ssl, statistics, sys, time
cfg = json.loads(sys.stdin.read())
ctx = ssl.create_default_context(cafile=cfg["ca"])
def conn(kind):
    if kind == "entry":
        return http.client.HTTPSConnection(cfg["vip"], cfg["entry_port"], context=ctx, timeout=120)
    return http.client.HTTPConnection(cfg["router"], cfg["ports"][kind], timeout=120)
kinds = ["entry", "router"] + (["igw"] if "igw" in cfg["ports"] else [])
conns = {k: conn(k) for k in kinds}
lat = {k: [] for k in kinds}
for n in range(cfg["n"]):
    for kind in kinds[n % len(kinds):] + kinds[:n % len(kinds)]:
        body = json.dumps({"model": cfg["model"], "prompt": "p50 %d %s %s" % (n, kind, cfg["prompt"]), "max_tokens": 4,
                           "temperature": 0})
        h = {"Content-Type": "application/json"}
        if kind == "entry":
            h["Authorization"] = "Bearer " + cfg["key"]
        t = time.perf_counter()
        conns[kind].request("POST", "/v1/completions", body, h)
        r = conns[kind].getresponse(); r.read()
        if r.status != 200:
            sys.exit("%s answered %d" % (kind, r.status))
        lat[kind].append(time.perf_counter() - t)
print(json.dumps({k: statistics.median(v) for k, v in lat.items()}))
"""

# vllm-router's multi-model mode (--enable-igw), the alternative to the entry's routing on the body's model: a second,
# transient router on pool a's router host (systemd-run, as playbooks/benchmark.yml starts its routers), with that
# router's own command line (its env file, the one place it is built) on its own port, and every
# pool's workers registered through POST /workers with their model. Lab only: its port is let in by a rule inserted at
# the head of the bundle's nft table and deleted after.
IGW_UNIT = "pd-igw-bench"
IGW_PORT_OFFSET = 7  # vllm_router_port + 7: free on the lab's router hosts (its metrics port: + 28000, as benchmark.yml)
_FILTERS = os.path.join(REPO, "plugins", "filter")
_load = runpy.run_path(os.path.join(_FILTERS, "siblings.py"))["load"]
membership = _load("membership", _FILTERS)  # a router env file's command line, and its workers
argv_set = _load("argv", _FILTERS).argv_set


def router_argv(router):
    """A router's command line, read from its env file on its host."""
    env = sh(router, "cat", role_var("vllm_router", "_vllm_router_env_file")).stdout
    return membership.router_env_argv(env)


def igw_start(lab, pools, port):
    """Start the IGW router on pool a's router host with every pool's workers: [{url, model_id, worker_type,
    is_healthy}] as its /workers lists them once every worker is healthy (or after 120 s)."""
    router = pools[0]["routers"][0]
    ip = lab.host_ip(router)
    # Its workers stay on the command line (PD mode refuses to start without --prefill), though in IGW mode the router
    # starts with none of them: they come through POST /workers below (docs/scaling.md).
    argvs = {p["routers"][0]: router_argv(p["routers"][0]) for p in pools}
    argv = argv_set(argvs[router],
                    {"--host": ip, "--port": port, "--prometheus-host": "127.0.0.1",
                     "--prometheus-port": port + 28000}) + ["--enable-igw"]
    user, venv = lab.var("vllm_router_user"), lab.var("vllm_router_venv")
    sh(router, "systemd-run", "--unit", IGW_UNIT, "--collect", "--property", "User=" + user,
       "--property", "EnvironmentFile=" + role_var("vllm_router", "_vllm_router_key_file"),
       "--", venv + "/bin/vllm-router", *argv)
    sh(router, "nft", "insert", "rule", "inet", role_var("firewall", "_firewall_table"), "input",
       "tcp", "dport", str(port), "accept")
    workers = [dict(w, model_id=p["served_model_name"]) for p in pools
               for w in membership.router_workers(argvs[p["routers"][0]])]
    base = "http://%s:%d" % (ip, port)
    for _ in range(60):
        if sh(router, "curl", "-sf", base + "/health", check=False).returncode == 0:
            break
        time.sleep(1)
    for w in workers:
        sh(router, "curl", "-sf", "-X", "POST", "-H", "Content-Type: application/json", "-d", json.dumps(w),
           base + "/workers")
    listed = []
    for _ in range(60):
        listed = json.loads(sh(router, "curl", "-sf", base + "/workers").stdout or "{}").get("workers", [])
        if len(listed) >= len(workers) and all(w.get("is_healthy") for w in listed):
            break
        time.sleep(2)
    return [{k: w.get(k) for k in ("url", "model_id", "worker_type", "is_healthy")} for w in listed]


def igw_stop(lab, pools, port):
    """Stop the IGW router and delete its nft rule (by its handle)."""
    router = pools[0]["routers"][0]
    sh(router, "systemctl", "stop", IGW_UNIT, check=False)
    table = role_var("firewall", "_firewall_table")
    listing = sh(router, "nft", "-a", "list", "chain", "inet", table, "input").stdout
    for handle in re.findall(r"tcp dport %d accept # handle (\d+)" % port, listing):
        sh(router, "nft", "delete", "rule", "inet", table, "input", "handle", handle)


def igw_kv(lab, pools, model, port, n=6):
    """Pool a's counters over N fresh prompts through the IGW router alone: the prompt tokens its decode got by KV
    transfer and computed itself, and those its prefill computed (the IGW router does no Mooncake bootstrap lookup
    for a prefill added through /workers: docs/scaling.md)."""
    router = pools[0]["routers"][0]
    ip = lab.host_ip(router)
    before = counters(lab, pools[:1])
    for i in range(n):
        body = json.dumps({"model": model, "prompt": "igw %s %d " % (uuid.uuid4().hex, i) + load.PROMPT_BODY,
                           "max_tokens": 4, "temperature": 0})
        sh(router, "curl", "-sf", "-X", "POST", "-H", "Content-Type: application/json", "-d", body,
           "http://%s:%d/v1/completions" % (ip, port))
    after = counters(lab, pools[:1])

    def delta(role, k):
        return sum(after[r][k] - before[r][k] for r, c in before.items() if c["role"] == role)
    return {"requests": n, "ext": delta("decode", "ext"), "computed": delta("decode", "computed"),
            "prefill_computed": delta("prefill", "computed")}


def haproxy_times(journals, server):
    """HAProxy's own share of the entry's requests to SERVER ("/router1 "), from its logs: Ta (the whole request, in ms)
    less Tr (the server's answer) is the time in HAProxy (the body read, json_query, the backend choice, the connect).
    {requests, mean_ms, p50_server_ms}; at HAProxy's millisecond resolution, so the mean, not the median."""
    rows = []
    for text in journals:
        for line in text.splitlines():
            if server in line and "POST /v1/completions" in line:
                m = re.search(r" (\d+)/(\d+)/(\d+)/(\d+)/(\d+) 200 ", line)
                if m:
                    rows.append([int(x) for x in m.groups()])
    if not rows:
        return {"requests": 0}
    return {"requests": len(rows), "mean_ms": round(sum(r[4] - r[3] for r in rows) / len(rows), 2),
            "p50_server_ms": sorted(r[3] for r in rows)[len(rows) // 2]}


def p50_ratio(lab, pool, model, key, n, igw_port=None):
    """Entry p50 (model routing) / direct to the pool's router, from a client on the first entry host; with igw_port,
    the IGW router's p50 / direct in the same run (interleaved, keep-alive, one connection each)."""
    entry, router = lab.hosts("entry")[0], pool["routers"][0]
    g = lab.group_vars("entry")
    ports = {"router": int(lab.var("vllm_router_port"))}
    if igw_port:
        ports["igw"] = igw_port
    cfg = {"vip": g["entry_vip"], "entry_port": int(g.get("entry_port", lab.var("entry_port"))),
           "router": lab.host_ip(router),
           "ports": ports, "model": model, "key": key, "n": n,
           "prompt": load.PROMPT_BODY, "ca": "/tmp/pd-pools-ca.crt"}
    sh(entry, "sh", "-c", "cat > /tmp/pd-pools-ca.crt", input=open(lab.client_ca()).read())
    since = sh(entry, "date", "+%Y-%m-%d %H:%M:%S").stdout.strip()
    res = sh(entry, "python3", "-c", P50_CLIENT, input=json.dumps(cfg), timeout=1800)
    p50 = json.loads(res.stdout.strip().splitlines()[-1])
    out = {"entry_p50_s": round(p50["entry"], 4), "router_p50_s": round(p50["router"], 4),
           "ratio": round(p50["entry"] / p50["router"], 3), "pairs": n,
           "haproxy": haproxy_times([sh(e, "journalctl", "-u", "haproxy", "--since", since, "--no-pager", "-o", "cat").stdout
                                     for e in lab.hosts("entry")], "/%s " % router)}
    if igw_port:
        out.update({"igw_p50_s": round(p50["igw"], 4), "igw_ratio": round(p50["igw"] / p50["router"], 3)})
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(REPO, "lab-results", "pools.json"))
    ap.add_argument("--converge", action="store_true", help="first re-converge the lab with the pools overlay")
    ap.add_argument("--rolling", action="store_true", help="rolling restart of pool a under load on both pools")
    ap.add_argument("--p50", type=int, default=0, help="measure the entry's p50 ratio with this many pairs")
    ap.add_argument("--max-p50-ratio", type=float, default=1.05)
    ap.add_argument("--igw", action="store_true",
                    help="with --p50: also a vllm-router in multi-model mode (--enable-igw), side by side (reported)")
    args = ap.parse_args(argv)
    import yaml
    lab = labinv.Lab()
    pools = yaml.safe_load(open(OVERLAY))["vllm_pools"]
    inv = os.path.join(REPO, "molecule", "default", "inventory")
    playbook = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")
    result, problems = {"pools": [p["name"] for p in pools]}, []
    if args.converge:
        t = time.time()
        # The per-pool transfer checks run (verify.yml: the pairs of one pool); the store round trip does not: it
        # is the pools' shared master, which the first converge and converge-store check (31 s on the lab).
        subprocess.run([playbook, "-i", inv, os.path.join(REPO, "site.yml"), "-e", "@" + OVERLAY,
                        "-e", "vllm_restart_batch=100%", "--skip-tags", "verify_store"], check=True)
        result["converge_s"] = round(time.time() - t, 1)
    key, ci = lab.client_key(), lab.client_key("ci")
    os.environ["PD_CLIENT_CA"] = os.environ.get("PD_CLIENT_CA") or lab.client_ca()
    url = lab.client_url()
    for p in pools:
        if load.until_serving(url, p["served_model_name"], key, prompt="warm up " * 40) is None:
            print("[pools] %s does not serve through the entry" % p["served_model_name"], file=sys.stderr)
            return 1
    client = load.sdk_client(url, 120, key)

    # 1. Each model reaches its own pool's instances, and its decode gets the KV by transfer.
    result["routing"] = []
    for p in pools:
        # The canary's probes are requests too (pool a's every 6 s on router1): paused, so that the counters count
        # this window's requests only (CI at e5731bf: one probe on pool a in pool b's window failed the step).
        with canary_paused(lab.hosts("vllm_router")):
            before = counters(lab, pools)
            sent = send_all(client, p["served_model_name"], "pool-" + p["name"])
            after = counters(lab, pools)
        failed = ["%s: %s" % (k, e) for k, ok, e in sent if not ok]
        got = routing_problems(pools, before, after, {"pool": p["name"], "requests": len(sent)})
        problems += ["%s (%s): %s" % (p["name"], p["served_model_name"], f) for f in failed + got]
        result["routing"].append({"pool": p["name"], "model": p["served_model_name"], "sent": len(sent),
                                  "failed": failed, "delta": {r: {k: after[r][k] - before[r][k]
                                                                  for k in ("done", "ext", "computed")}
                                                              for r in before}})

    # 2. The model list, an unknown model, a key limited to one pool.
    listed = sorted(m.id for m in client.models.list().data)
    want = sorted(p["served_model_name"] for p in pools)
    if listed != want:
        problems.append("GET /v1/models lists %s, not %s" % (listed, want))
    ci_client = load.sdk_client(url, 120, ci)
    checks = {"unknown model": (sdk_error(client, "no-such-model"), (404, "model_not_found")),
              "ci on pool a": (sdk_error(ci_client, pools[0]["served_model_name"]), (403, "model_not_allowed")),
              "ci on pool b": (sdk_error(ci_client, pools[1]["served_model_name"]), (200, None))}
    for name, (got, want_) in checks.items():
        if tuple(got) != want_:
            problems.append("%s: got %s, want %s" % (name, got, want_))
    result["access"] = {k: list(v[0]) for k, v in checks.items()}
    result["models"] = listed

    # 3. KV ports per pool: a decode's transfer engine takes its own pool's prefill, not another pool's hosts.
    result["kv_ports"] = [{"decode": h, "port": port, "from": peer, "want": want, "connected": got}
                          for h, port, peer, want, got in kv_isolation(lab, pools)]
    problems += ["%s:%s from %s: %s, want %s" % (r["decode"], r["port"], r["from"],
                                                 "accepted" if r["connected"] else "refused",
                                                 "accepted" if r["want"] else "refused")
                 for r in result["kv_ports"] if r["connected"] != r["want"]]

    # 4. A rolling restart of pool a under load on both pools: pool b loses nothing.
    if args.rolling:
        b_units = pool_units(lab, pools[1])
        pids = unit_pids(b_units)
        loops = {p["name"]: load.OpenLoop(url, p["served_model_name"], key, every=1.0, tag="rolling-" + p["name"]).start()
                 for p in pools}
        time.sleep(5)
        t = time.time()
        rc = subprocess.run([playbook, "-i", inv, os.path.join(REPO, "playbooks", "rolling_restart.yml"),
                             "-e", "@" + OVERLAY, "-e", "rolling_restart_pool=" + pools[0]["name"]]).returncode
        took = time.time() - t
        time.sleep(5)
        recs = {n: loop.stop() for n, loop in loops.items()}
        after = unit_pids(b_units)
        result["rolling"] = {"rc": rc, "seconds": round(took, 1),
                             **{n: {"requests": len(r), "failed": len([x for x in r if not x["ok"]]),
                                    "errors": sorted({x["error"][:120] for x in r if not x["ok"]})[:5]}
                                for n, r in recs.items()}}
        if rc != 0:
            problems.append("the rolling restart of pool a failed (rc %d)" % rc)
        if result["rolling"][pools[1]["name"]]["failed"]:
            problems.append("pool b: %d of %d requests failed during pool a's rolling restart"
                            % (result["rolling"][pools[1]["name"]]["failed"], result["rolling"][pools[1]["name"]]["requests"]))
        moved = sorted(u for u in pids if pids[u] != after[u])
        if moved:
            problems.append("pool a's rolling restart restarted pool b's units %s" % ", ".join(moved))

    if args.p50:
        igw_port = int(lab.var("vllm_router_port")) + IGW_PORT_OFFSET if args.igw else None
        try:
            if igw_port:
                result["igw_workers"] = igw_start(lab, pools, igw_port)
                result["igw_kv"] = igw_kv(lab, pools, pools[0]["served_model_name"], igw_port)
            result["p50"] = p50_ratio(lab, pools[0], pools[0]["served_model_name"], key, args.p50, igw_port)
        finally:
            if igw_port:
                igw_stop(lab, pools, igw_port)
        if result["p50"]["ratio"] > args.max_p50_ratio:
            problems.append("entry p50 / direct to the router = %.3f > %.2f" % (result["p50"]["ratio"], args.max_p50_ratio))

    result["problems"] = problems
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps({k: v for k, v in result.items() if k != "routing"}, indent=1))
    for r in result["routing"]:
        print("[pools] %s: %s" % (r["model"], {k: v for k, v in r["delta"].items() if any(v.values())}))
    if problems:
        print("[pools] FAILED:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 1
    print("[pools] passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
