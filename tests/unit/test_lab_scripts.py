"""Pure parts of the lab's drill and load scripts (scripts/lab)."""
import argparse
import importlib.util
import os
import re
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

LAB = Path(__file__).resolve().parents[2] / "scripts" / "lab"


def _load(name, file):
    spec = importlib.util.spec_from_file_location(name, LAB / file)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


load = _load("load", "load.py")


def test_summarize_counts_failures():
    recs = [{"t": 0.1, "ok": True, "error": ""}, {"t": 1.26, "ok": False, "error": "HTTP 502"}]
    s = load.summarize(recs)
    assert (s["requests"], s["failed"], s["succeeded"]) == (2, 1, 1)
    assert s["failures"] == [{"t": 1.26, "latency": 0, "error": "HTTP 502", "stream": False}]


def test_summarize_latency_of_successes_and_slow_list():
    recs = [{"t": float(i), "latency": 0.5 + i / 100, "ok": True, "error": ""} for i in range(99)]
    recs += [{"t": 99.0, "latency": 45.0, "ok": True, "error": ""},
             {"t": 100.0, "latency": 120.0, "ok": False, "error": "TimeoutError"}]
    s = load.summarize(recs)
    assert s["latency_p50_s"] == 1.0 and s["latency_max_s"] == 45.0
    assert s["slow"] == [{"t": 99.0, "latency": 45.0}]
    assert load.summarize([])["latency_p50_s"] is None


# bad-input-proof.py: tests/unit/test_bad_input_proof.py


drills = _load("drills", "drills.py")
# The drills' families (issue 52 item 8): a test that stands in for what a family calls patches it there.
drills_entry, drills_store = sys.modules["drills_entry"], sys.modules["drills_store"]


def _kill(**kw):
    r = {"drill": "kill -9 router", "kind": "router", "host": "router1", "restarted_s": 5.0, "serving_s": 6.5,
         "router_ok_s": 9.0, "recovery_s": 9.0, "serving_limit_s": 30, "recovery_limit_s": 30}
    r.update(kw)
    return r


def test_drill_problems_asserts_restart_serving_router_path_and_goal():
    assert drills.drill_problems(_kill(), 30, 180) == []
    assert "did not restart" in drills.drill_problems(_kill(restarted_s=None), 30, 180)[0]
    assert "did not restart" in drills.drill_problems(_kill(restarted_s=31.0), 30, 180)[0]
    assert "not serving within 30 s" in drills.drill_problems(_kill(serving_s=None), 30, 180)[0]
    assert "not serving within 30 s" in drills.drill_problems(_kill(serving_s=30.5), 30, 180)[0]
    assert "through the router" in drills.drill_problems(_kill(router_ok_s=None, recovery_s=None), 30, 180)[0]
    # A missed goal fails the drill (it used to be reported as goal_met: false and pass).
    assert "goal <= 30 s" in drills.drill_problems(_kill(router_ok_s=40.0, recovery_s=40.0), 30, 180)[0]
    vllm = _kill(drill="kill -9 decode", kind="decode", serving_limit_s=240, recovery_limit_s=240)
    assert drills.drill_problems(dict(vllm, router_ok_s=146.3, recovery_s=146.3), 30, 240) == []
    assert "goal <= 240 s" in drills.drill_problems(dict(vllm, router_ok_s=241.0, recovery_s=241.0), 30, 240)[0]


def _failover(**kw):
    r = {"drill": "kill -9 master leader", "kind": "master leader", "host": "etcd1", "recovery_s": 4.8,
         "limit_s": 30, "old_leader_back_as_standby_s": 0.3,
         "etcd_names_new_leader_s": 5.1, "new_leader_expected": "172.30.0.12:50051",
         "etcd_view_after": "172.30.0.12:50051"}
    r.update(kw)
    return r


def test_failover_problems_need_leader_and_old_leader_as_standby():
    assert drills.failover_problems(_failover()) == []
    assert "did not lead within 30 s" in drills.failover_problems(_failover(recovery_s=31.0))[0]
    assert "as standby" in drills.failover_problems(_failover(old_leader_back_as_standby_s=None))[0]
    # etcd must agree: its master view names the new leader within the goal.
    stale = drills.failover_problems(_failover(etcd_names_new_leader_s=None, etcd_view_after="172.30.0.11:50051"))
    assert "did not name the new leader (172.30.0.12:50051)" in stale[0] and "'172.30.0.11:50051'" in stale[0]
    assert "master view" in drills.failover_problems(_failover(etcd_names_new_leader_s=30.5))[0]


def test_failures_are_attributed_per_drill_and_bounded():
    load_summary = {"start_epoch": 1000.0, "failures": [{"t": t} for t in (12.0, 13.0, 14.0, 31.0, 95.0)]}
    results = [
        {"drill": "kill -9 etcd member", "kind": "etcd member", "host": "etcd3", "end_epoch": 1010.0,
         "recovery_epoch": 1005.0},
        {"drill": "kill -9 router", "kind": "router", "host": "router1", "end_epoch": 1040.0,
         "recovery_epoch": 1020.0},
    ]
    assert drills.attribute_failures(results, load_summary) == 1  # t=95 s: after the last drill
    assert (results[0]["failed"], results[1]["failed"]) == (0, 4)
    assert results[1]["failed_after_recovery"] == 1  # t=31 s started after the router was back
    assert drills.failure_problems(results[0]) == []
    assert "after recovery" in drills.failure_problems(results[1])[0]
    # Not on the request path: a single failure during an etcd drill fails it.
    assert "bound 0" in drills.failure_problems(dict(results[0], failed=1, failed_after_recovery=1))[0]
    assert "bound 25" in drills.failure_problems(dict(results[1], failed=26, failed_after_recovery=0))[0]


def test_router_kill_behind_the_entry_excuses_only_streams_open_at_the_kill():
    """Behind the entry HAProxy retries every request of a killed router but a stream whose answer had begun: the
    bound is the streams open at the kill; a non-streamed failure or one sent after the kill fails the drill."""
    spans = [[0.0, 1.0, True, False], [8.0, 12.0, False, True], [9.5, 11.0, True, False], [20.0, 21.0, True, True]]
    assert drills.streams_open_at(spans, 1000.0, 1010.0) == 1  # the stream sent at 8 s, open at the kill (10 s)
    failures = [{"t": 8.0, "stream": True}]
    r = {"drill": "kill -9 router behind entry", "kind": "router behind entry", "host": "router1",
         "kill_epoch": 1010.0, "end_epoch": 1030.0, "recovery_epoch": 1015.0}
    results = [dict(r)]
    drills.attribute_failures(results, {"start_epoch": 1000.0, "failures": failures})
    results[0]["bound"] = drills.streams_open_at(spans, 1000.0, 1010.0)
    assert drills.failure_problems(results[0]) == []
    plain = [dict(r)]
    drills.attribute_failures(plain, {"start_epoch": 1000.0, "failures": [{"t": 9.5, "stream": False}]})
    plain[0]["bound"] = 1
    assert "non-streamed requests failed" in " ".join(drills.failure_problems(plain[0]))
    late = [dict(r)]
    drills.attribute_failures(late, {"start_epoch": 1000.0, "failures": [{"t": 12.0, "stream": True}]})
    late[0]["bound"] = 1
    assert "sent after the kill failed" in " ".join(drills.failure_problems(late[0]))
    # no stream open at the kill: bound 0, any failure fails the drill
    none = [dict(r)]
    drills.attribute_failures(none, {"start_epoch": 1000.0, "failures": failures})
    none[0]["bound"] = 0
    assert "bound 0" in " ".join(drills.failure_problems(none[0]))


def test_serves_needs_n_in_a_row_and_until_serving_waits(monkeypatch):
    answers = iter([True, True, False, True, True, True])
    monkeypatch.setattr(load, "one_request", lambda *a, **k: (next(answers), ""))
    assert load.serves("u", "m", n=2) is True
    assert load.serves("u", "m", n=2) is False  # the first of two failed, the second is not sent
    assert load.until_serving("u", "m", limit=5, step=0) is not None  # the next three succeed
    monkeypatch.setattr(load, "one_request", lambda *a, **k: (False, "HTTP 502"))
    assert load.until_serving("u", "m", limit=0.05, step=0.01) is None


def test_failed_master_drill_keeps_the_masters_journals(tmp_path, monkeypatch):
    calls = []

    class Res:
        returncode, stdout, stderr = 0, "mooncake-master: leader lost its lease\n", ""

    def fake_sh(host, *cmd, check=True, timeout=180):
        calls.append((host, cmd, check))
        return Res()

    monkeypatch.setattr(drills, "sh", fake_sh)
    out = tmp_path / "master-journals.txt"
    drills.keep_master_journals(["m1", "m2"], 1000.0, out)
    text = out.read_text()
    assert "===== m1 (rc 0)" in text and "===== m2 (rc 0)" in text and "lost its lease" in text
    assert all(not check and "@940" in cmd for _, cmd, check in calls)


def test_role_watch_keeps_changes_and_a_failover_failure_shows_them():
    watch = drills.RoleWatch(lambda: {}, t0=0.0)
    for t, roles in ((0.3, {"etcd1": "down", "etcd2": "standby"}), (0.8, {"etcd1": "down", "etcd2": "standby"}),
                     (4.1, {"etcd1": "down", "etcd2": "leader"}), (12.0, {"etcd1": "standby", "etcd2": "leader"})):
        watch.record(roles, t)
    assert watch.now() == {"etcd1": "standby", "etcd2": "leader"}
    assert watch.timeline() == ("0.3s etcd1:down etcd2:standby | 4.1s etcd1:down etcd2:leader"
                                " | 12.0s etcd1:standby etcd2:leader")
    flapped = _failover(old_leader_back_as_standby_s=None,
                        roles_timeline="4.1s etcd1:leader etcd2:down | 40.2s etcd1:standby etcd2:leader")
    (msg,) = drills.failover_problems(flapped)
    assert "did not come back as standby (master roles after the kill: 4.1s etcd1:leader" in msg


def test_vllm_serving_sends_the_instance_key_read_on_its_host(tmp_path, monkeypatch):
    """The drills' direct /v1/models carries the VLLM_API_KEY of the host's key file (read there, by the
    code run in the container, so the key is on no command line); no key file, no header."""
    import http.server
    import subprocess
    import sys
    import threading

    seen = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            seen.append(self.headers.get("Authorization"))
            ok = self.headers.get("Authorization") == "Bearer k-123"
            body = b'{"data": [{"id": "tiny-llama"}]}' if ok else b'{"error": "Unauthorized"}'
            self.send_response(200 if ok else 401)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    srv = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    argvs = []

    def local_sh(host, *cmd, check=True, timeout=180):  # the container is this machine
        argvs.append(cmd)
        return subprocess.run([sys.executable, *cmd[1:]], capture_output=True, text=True, timeout=timeout)

    # sh lives in the harness's shared library (scripts/lab/lablib.py), which http_get calls; drills re-exports it.
    monkeypatch.setattr(drills, "sh", local_sh)
    monkeypatch.setattr(sys.modules["lablib"], "sh", local_sh)
    monkeypatch.setattr(drills, "ip_of", lambda host: "127.0.0.1")  # the container's address: here, this machine
    key_file = tmp_path / "api-key.env"
    monkeypatch.setattr(drills, "INSTANCE_KEY_FILE", str(key_file))
    lab = drills.Lab.__new__(drills.Lab)
    lab.model = "tiny-llama"
    port = srv.server_address[1]
    try:
        key_file.write_text("VLLM_API_KEY=k-123\n")
        assert lab.vllm_serving("prefill1", port) is True
        key_file.write_text("VLLM_API_KEY=wrong\n")
        assert lab.vllm_serving("prefill1", port) is False
        key_file.unlink()
        assert lab.vllm_serving("prefill1", port) is False
    finally:
        srv.shutdown()
    assert seen == ["Bearer k-123", "Bearer wrong", None]
    assert not any("k-123" in " ".join(a) for a in argvs)


class _SlowProbeLab:
    """A named fake lab: the unit restarts and serves at once; the router probe fails once, then succeeds
    slowly (one request stalled, as Mooncake's 30 s TCP stall does on the 2-core lab)."""

    class args:
        limit = vllm_limit = 5

    def __init__(self, stall):
        self.stall, self.calls = stall, 0

    def router_settled(self):
        return 0.0

    def kill(self, host, unit):
        return {}

    def restarted(self, host, unit, before):
        return True

    def router_ok_n(self):
        import time
        self.calls += 1
        if self.calls == 1:
            return False
        time.sleep(self.stall)
        return True


def test_killed_haproxy_excuses_only_refusals_while_it_was_down():
    """kill -9 of the entry's HAProxy: the request in flight may fail (bound 1); connections refused between
    the kill and systemd's restart are counted apart and bounded; any other failure, or a refusal after the
    restart, counts against bound 1."""
    refused = "URLError: <urlopen error [Errno 111] Connection refused>"
    reset = "RemoteDisconnected: Remote end closed connection without response"
    r = {"drill": "kill -9 entry haproxy", "kind": "entry haproxy", "host": "entry1", "kill_epoch": 1010.0,
         "restarted_s": 2.0, "end_epoch": 1030.0, "recovery_epoch": 1015.0}

    def attributed(*fails):
        res = dict(r)
        drills.attribute_failures([res], {"start_epoch": 1000.0,
                                          "failures": [{"t": t, "error": e} for t, e in fails]})
        return res, drills.failure_problems(res)
    # CI: the request in flight reset, then one refused 0.5 s later while HAProxy restarted.
    res, problems = attributed((9.5, reset), (10.6, refused))
    assert (res["failed"], res["refused_while_down"], problems) == (2, 1, [])
    # Two failures that are not refusals: over bound 1.
    assert "2 failed requests" in attributed((9.5, reset), (10.6, reset))[1][0]
    # A refusal after the restart (t=13 s > kill + 2 s) is not excused.
    assert "2 failed requests" in attributed((9.5, reset), (13.0, refused))[1][0]
    # Refusals beyond REFUSED_BOUND (HAProxy down for seconds) fail the drill.
    many = [(10.0 + i * 0.1, refused) for i in range(drills.REFUSED_BOUND["entry haproxy"] + 1)]
    res, problems = attributed(*many)
    assert "connections refused while it was down" in problems[0]
    # Other kinds excuse nothing: an etcd drill with one refusal fails.
    etcd = dict(r, kind="etcd member", drill="kill -9 etcd member")
    drills.attribute_failures([etcd], {"start_epoch": 1000.0, "failures": [{"t": 10.5, "error": refused}]})
    assert "bound 0" in drills.failure_problems(etcd)[0]


def test_kill_drill_recovers_when_the_passing_probe_was_sent():
    """The recovery point is the send time of the passing probe (after one failed probe and wait_for's 0.5 s
    step), not its end; how long the probe took is kept as probe_s."""
    r = drills.drill_kill(_SlowProbeLab(stall=1.5), "etcd member", "etcd3", "etcd", lambda: True, 30, 30)
    assert 0.4 <= r["recovery_s"] <= 1.2, r
    assert r["probe_s"] >= 1.4, r
    assert drills.drill_problems(r, 30, 180) == []


def test_entry_drill_needs_the_vip_to_move_and_serve_in_time():
    r = {"drill": "keepalived stopped on the VIP holder", "kind": "entry vip", "host": "entry1", "limit_s": 3.0,
         "vip_moved_s": 1.2, "router_ok_s": 1.9}
    assert drills.entry_problems(r) == []
    assert "did not move" in drills.entry_problems(dict(r, vip_moved_s=None))[0]
    assert "within 3.0 s" in drills.entry_problems(dict(r, vip_moved_s=3.4))[0]
    assert "did not succeed" in drills.entry_problems(dict(r, router_ok_s=None))[0]
    assert "no entry host holds" in drills.entry_problems(dict(r, error="no entry host holds the VIP before the drill"))[0]
    # Behind the entry a killed router costs no request; after the VIP moved, none may fail.
    assert drills.FAILED_BOUND["router behind entry"] == 0
    late = dict(r, failed=1, failed_after_recovery=1)
    assert "after recovery" in " ".join(drills.failure_problems(late))


def test_frozen_holder_drill_fails_on_a_flip_back_a_slow_move_or_a_late_failure():
    """The frozen-holder drill (issue 30): the VIP moves within 5 s, stays on the new holder after the resume, and
    no request sent after the move fails; failures among the requests that went to the frozen host are allowed."""
    assert drills.VIP_DETECT_GOAL_S <= 5.0
    freeze, moved = 1000.0, 1003.5
    recs = [{"sent": 990.0, "ended": 991.0, "ok": True, "error": ""},         # before the freeze
            {"sent": 999.8, "ended": 1026.0, "ok": False, "error": "reset"},  # in flight at the freeze
            {"sent": 1001.0, "ended": 1025.0, "ok": False, "error": "reset"},  # sent to the frozen host
            {"sent": 1004.0, "ended": 1005.0, "ok": True, "error": ""}]       # after the move
    paced = drills.paced_classes(recs, freeze, moved)
    assert (paced["to_frozen_host"], paced["to_frozen_host_failed"], paced["failed_after_move"]) == (2, 2, [])
    r = {"drill": "VIP holder frozen 25 s", "kind": "entry frozen", "host": "entry1", "limit_s": 5.0,
         "vip_moved_s": 3.5, "new_holder": "entry2", "holders_after_resume": [(0.0, ["entry2"])], "paced": paced}
    assert drills.freeze_problems(r) == []
    assert "within 5.0 s" in drills.freeze_problems(dict(r, vip_moved_s=7.9))[0]
    assert "did not move" in drills.freeze_problems(dict(r, vip_moved_s=None))[0]
    # the resumed host took the VIP back, or both held it for a moment
    flip = dict(r, holders_after_resume=[(0.0, ["entry2"]), (1.2, ["entry1"])])
    assert "did not stay" in drills.freeze_problems(flip)[0]
    assert "did not stay" in drills.freeze_problems(dict(r, holders_after_resume=[(0.0, ["entry1", "entry2"])]))[0]
    assert "did not stay" in drills.freeze_problems(dict(r, new_holder="entry1"))[0]
    # keepalived's journal on the new holder says it gave the VIP up, though every sample saw it there
    assert "did not stay" in drills.freeze_problems(dict(r, new_holder_gave_up_s=27.3))[0]
    late = recs + [{"sent": 1030.0, "ended": 1030.1, "ok": False, "error": "Server disconnected"}]
    problems = drills.freeze_problems(dict(r, paced=drills.paced_classes(late, freeze, moved)))
    assert any("sent after the VIP moved failed" in p for p in problems), problems
    # the steady load: its requests that went to the frozen host are its bound; one sent after the move fails it
    spans = [[0.0, 1.0, True], [9.9, 30.0, False], [14.0, 14.5, True]]  # relative to start 990
    bound = drills.bound_from_spans(spans, 990.0, freeze, moved)
    assert bound == 1
    ok = {"drill": r["drill"], "kind": "entry frozen", "host": "entry1", "bound": bound, "failed": 1,
          "failed_after_recovery": 0}
    assert drills.failure_problems(ok) == []
    assert drills.failure_problems(dict(ok, failed=2, failed_after_recovery=1))


def test_etcd_drill_asks_etcd_for_the_member_health(monkeypatch):
    """A killed etcd member serves again when `etcdctl endpoint health` says so, not when its unit is active."""
    calls = []

    def fake_sh(host, *cmd, check=True, timeout=180):
        calls.append(cmd)
        healthy = "endpoint" in cmd and "health" in cmd
        return subprocess.CompletedProcess(cmd, 0 if healthy and fake_sh.up else 1,
                                           "x is healthy: successfully committed proposal" if fake_sh.up else "",
                                           "" if fake_sh.up else "x is unhealthy: failed to commit proposal")
    fake_sh.up = False
    monkeypatch.setattr(drills, "sh", fake_sh)
    monkeypatch.setattr(drills, "ip_of", lambda host: "172.30.0.13")
    lab = drills.Lab(argparse.Namespace(client_url="https://vip", model="m", etcd_mooncake_port=2381))
    assert not lab.etcd_member_healthy("etcd3")
    fake_sh.up = True
    assert lab.etcd_member_healthy("etcd3")
    assert calls[-1][:2] == ("etcdctl", "--endpoints=http://172.30.0.13:2381")


# lab-info.sh: what `make lab` prints, and README.md's first screen shows the same lines.

REPO = LAB.parents[1]


def _block(text, first):
    """The indented command block that starts with the line beginning FIRST (indent removed)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.lstrip().startswith(first))
    end = next((i for i in range(start, len(lines)) if not lines[i].strip()), len(lines))
    return textwrap.dedent("\n".join(lines[start:end]))


def test_lab_info_prints_the_entry_url_and_a_curl_with_a_key_it_reads_not_prints():
    out = subprocess.run([str(LAB / "lab-info.sh")], cwd=REPO, capture_output=True, text=True, check=True).stdout
    labinv = _load("labinv", "labinv.py")
    lab = labinv.Lab()
    url = lab.client_url()
    assert url.startswith("https://") and url in out
    block = _block(out, "KEY=")
    assert "--cacert " in block and '-H "Authorization: Bearer $KEY"' in block and url + "/v1/completions" in block
    # The CA the curl names is the lab's entry CA (a "~/" path is the caller's home).
    ca = re.search(r"--cacert (\S+)", block).group(1)
    assert str(Path(ca).expanduser()) == lab.client_ca()
    # No key of the lab's vault is printed; the KEY= line reads the key "lab" when run as printed (repo root).
    keys = {name: lab.client_key(name) for name in ("lab", "ci")}
    assert not any(k in out for k in keys.values())
    key_cmd = block.split("\ncurl ")[0]
    env = dict(os.environ, PATH=str(Path(sys.executable).parent) + os.pathsep + os.environ["PATH"])
    read = subprocess.run(["bash", "-c", key_cmd + '\nprintf %s "$KEY"'], cwd=REPO, env=env,
                          capture_output=True, text=True, check=True).stdout
    assert read == keys["lab"], "the printed KEY= line does not read the lab key"
    # README.md's first screen shows the same lines, and no key.
    readme = (REPO / "README.md").read_text()
    assert block in textwrap.dedent(_block(readme, "KEY=")), "README.md's curl differs from lab-info.sh's"
    # ... in its quick start, the first section after the picture (issue 46's order)
    quick = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    assert "KEY=" in quick and "curl " in quick and url in quick
    assert not any(k in readme for k in keys.values())


def test_vip_move_time_comes_from_keepalived_journal():
    """The VIP-move bounds read keepalived's own "Entering MASTER STATE" time, not a docker-exec poll."""
    text = ("1000.1 entry2 Keepalived_vrrp[9]: (entry_vip) Entering BACKUP STATE\n"
            "-- Boot --\n"
            "999.0 entry2 Keepalived_vrrp[9]: (entry_vip) Entering MASTER STATE\n"
            "1003.6 entry2 Keepalived_vrrp[9]: (entry_vip) Entering MASTER STATE\n"
            "1010.0 entry2 Keepalived_vrrp[9]: (entry_vip) Entering MASTER STATE\n")
    assert drills.vip_taken_from_journal(text, 1000.0) == 1003.6
    assert drills.vip_taken_from_journal(text, 1011.0) is None
    assert drills.vip_taken_from_journal(text, 1000.0, "BACKUP") == 1000.1
    # a FAULT (the holder's HAProxy check failed) gives the VIP up as surely as BACKUP
    fault = text + "1012.5 entry2 Keepalived_vrrp[9]: (entry_vip) Entering FAULT STATE\n"
    assert drills.vip_taken_from_journal(fault, 1011.0, ("BACKUP", "FAULT")) == 1012.5
    assert drills.vip_taken_from_journal(fault, 1011.0, "BACKUP") is None


def test_vip_probe_asks_again_when_docker_fails(monkeypatch):
    """A `docker exec` that fails is not "no VIP" (the sample that failed CI at stop 35 read it so)."""
    answers = iter([subprocess.CompletedProcess([], 1, "", "OCI runtime exec failed"),
                    subprocess.CompletedProcess([], 0, "2: eth0 inet 172.30.0.50/24\n", "")])
    monkeypatch.setattr(drills, "sh", lambda *a, **k: next(answers))
    lab = drills.Lab.__new__(drills.Lab)
    lab.args = type("A", (), {"entry_vip": "172.30.0.50"})()
    assert lab.holds_vip("entry1") is True
    monkeypatch.setattr(drills, "sh", lambda *a, **k: subprocess.CompletedProcess([], 1, "", "gone"))
    with pytest.raises(RuntimeError):
        lab.holds_vip("entry1", tries=2)


def test_vip_move_prefers_keepalived_journal_over_polling(monkeypatch):
    """Both entry drills time the VIP's move the same way: keepalived's journal when it has the move, else polling."""
    lab = drills.Lab.__new__(drills.Lab)
    monkeypatch.setattr(lab, "vip_holder", lambda: "entry2", raising=False)
    monkeypatch.setattr(lab, "vip_taken_at", lambda host, since, state="MASTER": 1003.2, raising=False)
    holder, moved, taken, fields = lab.vip_move(4.7, 999.0, 1000.0)
    assert (holder, round(moved, 1), taken) == ("entry2", 3.2, 1003.2)
    assert fields == {"vip_seen_s": 4.7, "vip_moved_by": "journal", "vip_moved_s": 3.2, "new_holder": "entry2"}
    monkeypatch.setattr(lab, "vip_taken_at", lambda host, since, state="MASTER": None, raising=False)
    assert lab.vip_move(4.7, 999.0, 1000.0)[3]["vip_moved_by"] == "polling"
    assert lab.vip_move(None, 999.0, 1000.0)[1] is None


def test_pools_routing_problems_fail_on_a_request_in_the_wrong_pool_or_no_transfer():
    """scripts/lab/pools-test.py: the counters of every instance before and after one pool's requests."""
    sys.path.insert(0, str(LAB))
    pools = _load("pools_test", "pools-test.py")

    def c(pool, role, done=0, ext=0):
        return {"pool": pool, "role": role, "done": done, "ext": ext, "computed": 0}
    before = {"p/0": c("a", "prefill"), "d1/0": c("a", "decode"), "p/1": c("b", "prefill"), "d2/0": c("b", "decode")}
    sent = {"pool": "a", "requests": 4}
    good = dict(before, **{"p/0": c("a", "prefill", 4), "d1/0": c("a", "decode", 4, 1000)})
    assert pools.routing_problems(None, before, good, sent) == []
    astray = dict(good, **{"d2/0": c("b", "decode", 1, 250), "d1/0": c("a", "decode", 3, 750)})
    assert pools.routing_problems(None, before, astray, sent) == [
        "d1/0 of pool a finished 3 of the 4 requests sent for it",
        "d2/0 of pool b finished 1 requests sent for pool a"]
    recomputed = dict(good, **{"d1/0": c("a", "decode", 4, 0)})
    assert pools.routing_problems(None, before, recomputed, sent) == ["d1/0 (decode, pool a) got no prompt tokens by KV transfer"]



def test_pools_igw_router_gets_the_real_router_workers_and_flags():
    """pools-test.py --igw: the IGW router registers the workers of a router's own command line (a prefill with its
    bootstrap port) and runs that command line on its own port."""
    sys.path.insert(0, str(LAB))
    pools = _load("pools_test", "pools-test.py")
    argv = ("--kv-connector mooncake --host 10.0.0.5 --port 8080 --prefill http://10.0.0.1:8100 8998 "
            "--prefill http://10.0.0.1:8101 8999 --decode http://10.0.0.2:8100 --prometheus-port 29000").split()
    assert pools.membership.router_workers(argv) == [
        {"url": "http://10.0.0.1:8100", "worker_type": "prefill", "bootstrap_port": 8998},
        {"url": "http://10.0.0.1:8101", "worker_type": "prefill", "bootstrap_port": 8999},
        {"url": "http://10.0.0.2:8100", "worker_type": "decode"}]
    assert pools.argv_set(argv, {"--port": 8087})[:6] == "--kv-connector mooncake --host 10.0.0.5 --port 8087".split()


def test_pools_haproxy_times_are_the_entry_share_of_one_router_requests():
    """pools-test.py --p50: HAProxy's own time (Ta - Tr) of the requests it sent to the measured router only."""
    sys.path.insert(0, str(LAB))
    pools = _load("pools_test", "pools-test.py")
    log = ('1.2.3.4:5 [x] entry_https~ vllm_routers_a/router1 1/0/0/57/58 200 926 ---- key="lab" "POST /v1/completions HTTP/1.1"\n'
           '1.2.3.4:5 [x] entry_https~ vllm_routers_a/router1 0/0/0/60/60 200 926 ---- key="lab" "POST /v1/completions HTTP/1.1"\n'
           '1.2.3.4:5 [x] entry_https~ vllm_routers_b/router2 0/0/0/40/45 200 926 ---- key="lab" "POST /v1/completions HTTP/1.1"\n'
           '1.2.3.4:5 [x] entry_https~ vllm_routers_a/router1 0/0/0/40/45 503 926 ---- key="lab" "POST /v1/completions HTTP/1.1"\n')
    assert pools.haproxy_times([log, ""], "/router1 ") == {"requests": 2, "mean_ms": 0.5, "p50_server_ms": 60}
    assert pools.haproxy_times([""], "/router1 ") == {"requests": 0}

def test_vrrp_state_is_the_last_transition_in_the_journal():
    """drills.py waits for every standby entry to be BACKUP before an entry fault: the last state line counts."""
    drills = _load("drills", "drills.py")
    text = ("Sat keepalived[1]: (entry_vip) Entering BACKUP STATE (init)\n"
            "(entry_vip) Entering MASTER STATE\n(entry_vip) Entering FAULT STATE\nsomething else\n")
    assert drills.vrrp_state_from_journal(text) == "FAULT"
    assert drills.vrrp_state_from_journal(text + "(entry_vip) Entering BACKUP STATE\n") == "BACKUP"
    assert drills.vrrp_state_from_journal("") is None


def test_partition_drill_reads_the_canary_and_fails_its_goals():
    """The gray-failure drill: a canary run that started after the path's return and passed with tokens by transfer
    is the heal; a broken pair or a heal before the cut is a false alarm; a missed heal fails the drill."""
    pair = "prefill1/prefill1|decode1/decode0"
    state = {"started": 100.0, "last": {pair: {"result": "pass", "tokens": 120}}}
    assert drills.canary_passed_since(state, pair, 99.0)
    assert not drills.canary_passed_since(state, pair, 101.0)  # the run began before the path came back
    assert not drills.canary_passed_since(dict(state, last={pair: {"result": "pass", "tokens": 0}}), pair, 99.0)
    assert drills.canary_heals({"heals": {"targets": {"a": {"count": 2}, "b": {"count": 1}}}}) == 3
    line = ("canary pool=default prefill1/prefill1 -> decode1/decode0: fail in 8.02s (answered decode TimeoutError; "
            "3 failed in a row)")
    m = drills.BROKEN_LINE.search(line)
    assert m and m.group(1) == "prefill1/prefill1 -> decode1/decode0" and m.group(2) == "3"
    ok = {"drill": "partition", "canary_ready": True, "healed_s": 80.0, "heal_goal_s": 120, "heals": 1,
          "heal_lines": [], "pair_results": [], "pair": pair, "false_broken": [], "false_heals": []}
    assert drills.partition_problems(ok) == []
    assert "no canary passed" in drills.partition_problems(dict(ok, healed_s=None))[0]
    assert "raised alarms on a healthy lab" in drills.partition_problems(dict(ok, false_heals=["router1: x"]))[0]
    assert drills.FAILED_BOUND["partition"] == 0


def test_canary_alarms_leave_out_only_the_drills_own_window():
    """No false alarm over the lab's run: a pair failing 3 in a row, or a heal, outside the partition drill's window
    is an alarm; inside it, or fewer failures in a row, is not."""
    journal = "\n".join([
        "1000.5 pd-canary[1]: canary pool=default prefill1/prefill0 -> decode1/decode0: fail in 8.00s (timeout; 2 failed in a row)",
        "1010.5 pd-canary[1]: canary pool=default prefill1/prefill1 -> decode1/decode0: fail in 8.00s (timeout; 3 failed in a row)",
        "1020.0 pd-canary[1]: canary pool=default heal: heal prefill1/prefill1: the pair is wedged",
        "-- Boot --"])
    broken, heals = drills.alarms_in(journal, 3)
    assert broken == {"prefill1/prefill1 -> decode1/decode0"} and len(heals) == 1
    assert drills.alarms_in(journal, 3, exclude=[(1005, 1030)]) == (set(), [])
    assert drills.alarms_in(journal, 4) == (set(), heals)
    # an ejection outside a drill's window is a false one (issue 52: none over the whole CI run)
    ejected = journal + ("\n1040.0 pd-canary[1]: canary pool=default canary eject: took decode1/decode0 out of rotation "
                         "(decode decode1/decode0 fails with every peer (2) while they pass with others: wedged): answered 200")
    assert len(drills.alarms_in(ejected, 4)[1]) == 2
    assert drills.alarms_in(ejected, 4)[1][1].startswith("00:17:20 UTC canary pool=default canary eject: took")
    assert drills.alarms_in(ejected, 4, exclude=[(1005, 1050)]) == (set(), [])


def test_store_outage_goals_fail_when_missed():
    ok = {"drill": "masters down (60 s)", "store_hit_before": True, "store_hit_back_s": 12.0, "hit_goal_s": 60,
          "store_hit_detail": "", "breaker": {}}
    assert drills.store_outage_problems(ok) == []
    assert "no store hit within 60 s" in drills.store_outage_problems(dict(ok, store_hit_back_s=None))[0]
    assert "no store hit before" in drills.store_outage_problems(dict(ok, store_hit_before=False))[0]
    # requests sent after the first STORE_GRACE_S must all succeed: bound 0 after recovery (failure_problems)
    r = {"drill": "masters down", "host": "etcd1,etcd2", "kind": "masters down", "failed": 3, "bound": 4,
         "failed_after_recovery": 1}
    assert any("after recovery" in p for p in drills.failure_problems(r))
    assert drills.failure_problems(dict(r, failed_after_recovery=0)) == []


def _fake_docker(tmp_path, fail_pauses):
    """A docker stand-in: `pause` fails FAIL_PAUSES times as runc's freezer does under load, then succeeds."""
    count, state = tmp_path / "count", tmp_path / "paused"
    count.write_text("0")
    state.write_text("false")
    exe = tmp_path / "docker"
    exe.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        case "$1" in
          pause) n=$(cat {count}); echo $((n + 1)) > {count}
                 if [ "$n" -lt {fail_pauses} ]; then echo "unable to freeze" >&2; exit 1; fi
                 echo true > {state};;
          unpause) echo false > {state};;
          inspect) cat {state};;
        esac
        """))
    exe.chmod(0o755)
    return str(exe), count


def test_docker_pause_retries_a_freezer_that_gives_up_and_names_the_last_error(tmp_path, monkeypatch):
    monkeypatch.setattr(drills.time, "sleep", lambda s: None)
    exe, count = _fake_docker(tmp_path, 2)
    monkeypatch.setattr(drills_entry, "DOCKER", exe)
    assert drills.docker_pause("entry2", True) == 2
    assert drills.docker_pause("entry2", False) == 0
    exe, count = _fake_docker(tmp_path, 99)
    monkeypatch.setattr(drills_entry, "DOCKER", exe)
    with pytest.raises(RuntimeError, match="pause entry2 failed 5 times: unable to freeze"):
        drills.docker_pause("entry2", True)
    assert count.read_text().strip() == "5"


def test_store_mode_outage_is_measured_and_must_serve_again():
    """Store mode needs the store: the outage's requests are measured (outage_spans), not bounded; the drill fails
    when the router does not serve again within the goal, or when a request sent after that fails."""
    r = {"drill": "store mode: masters down (60 s)", "kind": "store mode: masters down", "host": "etcd1,etcd2",
         "kill_epoch": 1010.0, "back_epoch": 1070.0, "serving_back_s": 6.0, "recovery_epoch": 1076.0,
         "end_epoch": 1080.0, "back_goal_s": 120}
    # [sent, ended, ok, streamed] relative to start_epoch 1000: one open at the stop, two inside, one after
    spans = [[9.0, 28.0, True, False], [30.0, 49.0, False, True], [50.0, 69.0, True, False], [78.0, 78.2, True, False]]
    assert drills.outage_spans(spans, 1000.0, r) == {"sent": 3, "failed": 1, "ok": 2, "slowest_s": 19.0,
                                                     "failed_at_s": [39.0]}
    drills.attribute_failures([r], {"start_epoch": 1000.0, "failures": [{"t": 30.0, "stream": True}]})
    assert drills.store_mode_problems(r) == [] and drills.failure_problems(r) == []  # inside the outage: measured
    drills.attribute_failures([r], {"start_epoch": 1000.0, "failures": [{"t": 30.0}, {"t": 78.0}]})
    assert "1 requests failed after recovery" in " ".join(drills.failure_problems(r))
    late = dict(r, serving_back_s=None, recovery_epoch=None)
    assert "did not serve 3 requests in a row within 120 s" in drills.store_mode_problems(late)[0]


def test_a_wedged_instance_after_the_drills_fails_them_with_its_stacks(tmp_path, monkeypatch):
    """held_problems: every instance must hold no request (running + waiting, what the drain waits on) within the
    goal; one that still does gets SIGUSR1 (its stacks into its journal), the journal is kept, and the drills fail
    naming it. An instance that empties in time passes."""
    assert drills.held('vllm:num_requests_running{model_name="m"} 1.0\nvllm:num_requests_waiting{model_name="m"} 2.0\n'
                       'vllm:num_requests_running_total 9\n') == 3.0
    assert drills.held(None) is None

    class Inv:
        def instances(self, groups):
            return [("prefill1", "prefill0", 8100), ("prefill1", "prefill1", 8101)]
    answers = {8100: ['vllm:num_requests_running{m="x"} 0.0\n'] * 99,
               8101: ['vllm:num_requests_waiting{m="x"} 2.0\n'] * 99}
    sent = []
    monkeypatch.setattr(drills_store, "http_get", lambda host, url, timeout=3: answers[int(url.rsplit(":", 1)[1].split("/")[0])].pop())
    monkeypatch.setattr(drills_store, "wait_for", lambda pred, limit, step=0.5: 0.0 if pred() else None)
    monkeypatch.setattr(drills.time, "sleep", lambda s: None)

    def sh(host, *cmd, check=True):
        sent.append((host,) + cmd)
        return types.SimpleNamespace(stdout="Dec 07 kv-load thread: File \"worker.py\", line 1261 in _handle_request\n")
    monkeypatch.setattr(drills_store, "sh", sh)
    (problem,) = drills.held_problems(Inv(), {"prefill1": "172.30.0.21"}, 90, tmp_path, 1000.0)
    assert problem.startswith("prefill1/prefill1 still holds 2.0 requests 90 s after the drills' load stopped")
    assert ("prefill1", "systemctl", "kill", "-s", "USR1", "vllm@prefill1") in sent
    assert "_handle_request" in (tmp_path / "held-prefill1-prefill1.txt").read_text()
    answers[8101] = ['vllm:num_requests_waiting{m="x"} 0.0\n'] * 99
    assert drills.held_problems(Inv(), {"prefill1": "172.30.0.21"}, 90, tmp_path, 1000.0) == []


def test_router_move_problems_fail_a_router_that_does_not_move_or_moves_uninvited():
    """scripts/lab/router-move.py: a router whose program changes must restart onto it; one that keeps it must not."""
    move = _load("router_move", "router-move.py")
    before = {"r1": ("10", "smg"), "r2": ("20", "vllm-router")}
    want = {"r1": "smg", "r2": "smg"}
    assert move.move_problems("to smg", before, {"r1": ("10", "smg"), "r2": ("21", "smg")}, want) == []
    probs = move.move_problems("to smg", before, {"r1": ("11", "smg"), "r2": ("20", "vllm-router")}, want)
    assert "to smg: r1 restarted (PID 10 -> 11) though it already ran smg" in probs
    assert "to smg: r2 runs 'vllm-router', not smg" in probs
    assert move.move_problems("x", {"r2": ("20", "vllm-router")}, {"r2": ("20", "smg")}, {"r2": "smg"}) == \
        ["x: r2 did not restart onto smg"]


def test_scale_problems_fail_an_smg_router_that_restarts():
    scale = _load("scale_test", "scale-test.py")
    step = {"name": "spare1 joins vllm_decode", "kind": "out", "rc": 0, "served": True, "model_load_s": 20,
            "scale_out_s": 25, "router_pids_before": {"router1": "1", "router2": "2"},
            "router_pids_after": {"router1": "3", "router2": "4"}}
    assert scale.scale_problems(step, 30) == []  # vllm-router restarts for a join: reported, not a goal
    assert scale.scale_problems(step, 30, ["router1"]) == [
        "spare1 joins vllm_decode: smg router(s) router1 restarted (a manifest change restarts nothing)"]


def test_the_lab_harness_has_no_import_circle():
    """Issue 52 item 8: the lab scripts import the shared library (lablib.py), never each other in a circle."""
    import ast
    lab_dir = os.path.join(REPO, "scripts", "lab")
    mods = {f[:-3].replace("-", "_"): os.path.join(lab_dir, f) for f in os.listdir(lab_dir) if f.endswith(".py")}
    graph = {}
    for name, path in mods.items():
        deps = set()
        for node in ast.walk(ast.parse(open(path).read())):
            if isinstance(node, ast.ImportFrom) and node.module in mods:
                deps.add(node.module)
            elif isinstance(node, ast.Import):
                deps.update(a.name for a in node.names if a.name in mods)
        graph[name] = deps - {name}

    def reaches(a, b, seen=()):
        return any(d == b or (d not in seen and reaches(d, b, seen + (d,))) for d in graph.get(a, ()))
    circles = sorted(m for m in graph if reaches(m, m))
    assert circles == [], "lab scripts in an import circle: %s" % circles
    assert graph["lablib"] <= {"labinv"}, graph["lablib"]


# --- the broken-path drills (scripts/lab/partition.py, issue 52) ---------------------------------------------------

partition = _load("partition", "partition.py")


def _cut_result(**kw):
    r = {"drill": "cut prefill host (prefill1 drops decode1, 40 s)", "late_failed": 0, "late": 70, "late_errors": [],
         "late_slow": 0, "late_max_s": 1.3, "early_timeouts": 0, "early_max_s": 21.3,
         "ejected": [(9.2, "took decode1/decode0 out")], "back_s": 9.2, "out_after": []}
    r.update(kw)
    return r


def test_partition_goals_pass_and_each_one_missed_fails_the_drill():
    assert partition.problems(_cut_result()) == []
    assert "2 of 70 requests sent more than 20 s after the cut failed" in partition.problems(_cut_result(late_failed=2))[0]
    assert "took over 10 s (slowest 12.5 s)" in partition.problems(_cut_result(late_slow=1, late_max_s=12.5))[0]
    assert "reached the client's 60 s timeout (slowest 90.4 s)" in partition.problems(
        _cut_result(early_timeouts=13, early_max_s=90.4))[0]
    assert "took nothing out of rotation" in partition.problems(_cut_result(ejected=[]))[0]
    assert "not back in rotation with passing pairs within 60 s" in partition.problems(
        _cut_result(back_s=None, out_after=["decode1/decode0"]))[0]


def test_partition_classes_split_the_load_at_twenty_seconds_into_the_cut():
    cut = 1000.0
    records = [{"sent": 990.0, "ended": 995.0, "ok": True},   # done before the cut: neither class
               {"sent": 995.0, "ended": 1060.0, "ok": False},  # open at the cut: early
               {"sent": 1010.0, "ended": 1011.0, "ok": True},  # early
               {"sent": 1021.0, "ended": 1022.0, "ok": True}]  # late
    early, late = partition.classify(records, cut)
    assert [r["sent"] for r in early] == [995.0, 1010.0] and [r["sent"] for r in late] == [1021.0]


def test_partition_reads_the_deciders_state():
    state = {"started": 200.0, "ejected": {"out": {"d1/decode0": {}}},
             "last": {"p1/prefill0|d1/decode0": {"result": "pass", "tokens": 40},
                      "p1/prefill1|d1/decode0": {"result": "pass", "tokens": 0}}}
    assert partition.out_of_rotation(state) == ["d1/decode0"]
    assert not partition.passed_since(state, "d1/decode0", 100.0)  # a pair passed without KV by transfer
    state["last"]["p1/prefill1|d1/decode0"]["tokens"] = 12
    assert partition.passed_since(state, "d1/decode0", 100.0) and not partition.passed_since(state, "d1/decode0", 300.0)


def test_the_drills_load_may_lose_only_the_aborted_requests_of_a_cuts_first_twenty_seconds():
    """CI's run at this stop: the drills' own load lost 1 and 2 requests to the abort's 503 in the cuts' first seconds
    (partition.py's goals allow them); a later failure, or another error, is not allowed."""
    start, r = 1000.0, {"kill_epoch": 1250.5}
    aborted = "InternalServerError: Error code: 503 - " + partition.ABORT_MARK + " (pd-canary: pair p -> d broken)"
    failures = [{"t": 253.16, "error": "APIError: " + partition.ABORT_MARK}, {"t": 260.23, "error": aborted},
                {"t": 271.0, "error": aborted},                   # sent 20.5 s into the cut: must not fail
                {"t": 255.0, "error": "APITimeoutError: Request timed out."}]
    assert partition.aborted_early(failures, start, r) == 2
    # one of the previous drill (it ended at 1254 here) is its own, not this one's
    assert partition.aborted_early(failures, start, r, since=1254.0) == 1
    assert partition.ABORT_MARK.startswith("pd-bundle: this request waited for its KV")
