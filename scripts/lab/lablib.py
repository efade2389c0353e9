"""The lab harness's shared library (issue 52 item 8): what the lab scripts need of the lab's containers and
instances, in one module that imports no other lab script (labinv aside), so the drills, the reuse and store-tier
steps, monitoring, pools and scale import it instead of each other. Names here are re-exported by drills.py for the
callers and tests that still reach them there.

- sh, http_get, ip_of, unit_state, stamped_lines, wait_for: a command, a GET or POST, an address, a unit's state in a
  lab container; the journal's stamped lines; a wait.
- recomputed: the decode journals' lines of KV pulls that failed and were computed again.
- canary_state, canary_paused: the PD canary's state on a router host; its timer stopped for a window.
- master_roles: the Mooncake masters' roles from their /health.
- metrics, complete: an instance's /metrics, one completion on an instance, each asked on its own host.
"""
import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from labinv import role_var  # noqa: E402  (the lab's names, from its inventory and the roles)

DOCKER = os.environ.get("DOCKER", "docker")


def sh(host, *cmd, check=True, timeout=180, input=None):  # noqa: A002 - subprocess.run's name
    """Run a command in a lab container (input: text for its stdin)."""
    res = subprocess.run([DOCKER, "exec", *(["-i"] if input is not None else []), host, *cmd], capture_output=True,
                         text=True, timeout=timeout, input=input)
    if check and res.returncode != 0:
        raise RuntimeError(f"{host}: {' '.join(cmd)} -> rc {res.returncode}: {res.stderr.strip()[:300]}")
    return res


# The key every vLLM instance demands on /v1/* (roles/vllm): read on the instance's own host, as root.
INSTANCE_KEY_FILE = role_var("vllm", "_vllm_api_key_file")


def http_get(host, url, timeout=3, key_file=None, body=None):
    """GET a URL from inside a container (cluster ports are firewalled from this controller); with body (a dict),
    POST it as JSON instead, passed on stdin. With key_file, the VLLM_API_KEY that file holds on that host goes
    as the Bearer token; no key file there, no header. The key is read in the container: it is on no command
    line. Returns the answer's text, None when the request failed."""
    code = ("import os,sys,urllib.request\n"
            f"f,h={key_file!r},{{}}\n"
            "if f and os.path.exists(f):\n"
            "    k=[l.split('=',1)[1].strip() for l in open(f) if l.startswith('VLLM_API_KEY=')]\n"
            "    h={'Authorization':'Bearer '+k[0]} if k and k[0] else {}\n"
            f"d=sys.stdin.read().encode() if {body is not None!r} else None\n"
            "if d:\n"
            "    h['Content-Type']='application/json'\n"
            f"r=urllib.request.urlopen(urllib.request.Request({url!r},data=d,headers=h),timeout={timeout})\n"
            "sys.stdout.write(r.read().decode())")
    extra = {} if body is None else {"input": json.dumps(body)}
    res = sh(host, "python3", "-c", code, check=False, timeout=timeout + 10, **extra)
    return res.stdout if res.returncode == 0 else None


def master_roles(masters, port, ip=None):
    """{host: role} from each master's /health (leader, standby; asked on its host), 'down' when it does not
    answer. ip: the host's lab address (default: docker's view, ip_of)."""
    roles = {}
    for host in masters:
        out = http_get(host, f"http://{(ip or ip_of)(host)}:{port}/health")
        roles[host] = json.loads(out).get("role", "?") if out else "down"
    return roles


def ip_of(host):
    """The container's address on the lab network (the master binds its metrics port there)."""
    res = subprocess.run([DOCKER, "inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
                          host], capture_output=True, text=True, timeout=30, check=True)
    return res.stdout.strip()


def unit_state(host, unit):
    out = sh(host, "systemctl", "show", "-p", "ActiveState", "-p", "MainPID", "-p", "NRestarts", unit).stdout
    return dict(line.split("=", 1) for line in out.split())


def stamped_lines(text):
    """(epoch, the rest of the line) of each line of `journalctl -o short-unix` text; lines without a stamp skipped."""
    for line in text.splitlines():
        stamp, _, rest = line.partition(" ")
        try:
            yield float(stamp), rest
        except ValueError:
            continue


# A decode's journal line for a KV pull that failed and was computed again (kv_load_failure_policy recompute: the
# lab's Mooncake TCP stall, docs/tcp-stall.md).
RECOMPUTE_MARK = "pulling kv_caches for"


def recomputed(decode_units, since):
    """The decode journals' recompute lines ("host: line") since the epoch since; decode_units: (host, unit) pairs."""
    lines = []
    for host, unit in decode_units:
        out = sh(host, "journalctl", "-u", unit, "--since", "@%d" % int(since), "--no-pager", check=False).stdout
        lines += ["%s: %s" % (host, x) for x in out.splitlines() if RECOMPUTE_MARK in x]
    return lines


# The PD canary's state on a router host (the state file the timer's runs write; the router role owns the path).
CANARY_STATE = role_var("vllm_router", "_vllm_router_canary_state")


def canary_state(router):
    """The PD canary's state on a router host ({} when there is none yet)."""
    res = sh(router, "cat", CANARY_STATE, check=False)
    try:
        return json.loads(res.stdout) if res.returncode == 0 else {}
    except ValueError:
        return {}


@contextlib.contextmanager
def canary_paused(routers):
    """The PD canary's timer stopped on ROUTERS (a run under way finishes first), started again after: for a window
    whose instance counters must count only the requests the step itself sends (the canary's probes are requests)."""
    for r in routers:
        sh(r, "systemctl", "stop", "pd-canary.timer", check=False)
    for r in routers:
        # A oneshot service is "activating" while its run goes.
        wait_for(lambda r=r: unit_state(r, "pd-canary.service").get("ActiveState") not in ("active", "activating"), 60)
    try:
        yield
    finally:
        for r in routers:
            sh(r, "systemctl", "start", "pd-canary.timer", check=False)


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


def metrics(host, port, lab):
    """The /metrics text at host's own address and port, read inside host (http_get); raises if unread."""
    text = http_get(host, f"http://{lab.ips[host]}:{port}/metrics", timeout=10)
    if text is None:
        raise RuntimeError(f"{host}: no answer from :{port}/metrics")
    return text


def complete(host, ip, port, model, prompt, timeout=120):
    """POST /v1/completions to an instance from its own host, with the key read there. Returns (ok, detail)."""
    out = http_get(host, f"http://{ip}:{port}/v1/completions", timeout=timeout, key_file=INSTANCE_KEY_FILE,
                   body={"model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0})
    if out is None:
        return False, f"{host}: POST /v1/completions on :{port} failed"
    return True, json.loads(out).get("usage", {})
