"""Pure parts of the lab's drill and proof scripts (scripts/lab)."""
import importlib.util
from pathlib import Path

LAB = Path(__file__).resolve().parents[2] / "scripts" / "lab"


def _load(name, file):
    spec = importlib.util.spec_from_file_location(name, LAB / file)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


load = _load("load", "load.py")
proof = _load("bad_input_proof", "bad-input-proof.py")


def test_summarize_counts_failures():
    recs = [{"t": 0.1, "ok": True, "error": ""}, {"t": 1.26, "ok": False, "error": "HTTP 502"}]
    s = load.summarize(recs)
    assert (s["requests"], s["failed"], s["succeeded"]) == (2, 1, 1)
    assert s["failures"] == [{"t": 1.26, "error": "HTTP 502"}]


def test_summarize_latency_of_successes_and_slow_list():
    recs = [{"t": float(i), "latency": 0.5 + i / 100, "ok": True, "error": ""} for i in range(99)]
    recs += [{"t": 99.0, "latency": 45.0, "ok": True, "error": ""},
             {"t": 100.0, "latency": 120.0, "ok": False, "error": "TimeoutError"}]
    s = load.summarize(recs)
    assert s["latency_p50_s"] == 1.0 and s["latency_max_s"] == 45.0
    assert s["slow"] == [{"t": 99.0, "latency": 45.0}]
    assert load.summarize([])["latency_p50_s"] is None


def test_recap_and_failed_task():
    out = """TASK [preflight : Preflight | Ports are numbers] ****
fatal: [router1]: FAILED! => changed=false
PLAY RECAP ****
decode1                    : ok=3    changed=0    unreachable=0    failed=0    skipped=1
router1                    : ok=2    changed=1    unreachable=0    failed=1    skipped=0
"""
    assert proof.failed_task(out) == "preflight : Preflight | Ports are numbers"
    rc = proof.recap(out)
    assert rc["decode1"]["changed"] == 0 and rc["router1"]["failed"] == 1


def test_snapshot_diff_names_host_and_kind():
    a = {"h": {"files": "x  /etc/a\n", "units": "Id=a\nMainPID=1\n"}}
    b = {"h": {"files": "x  /etc/a\n", "units": "Id=a\nMainPID=2\n"}}
    assert proof.diff(a, a) == []
    d = proof.diff(a, b)
    assert len(d) == 1 and d[0].startswith("h units") and "MainPID=2" in d[0]


drills = _load("drills", "drills.py")


def _kill(**kw):
    r = {"drill": "kill -9 router", "host": "router1", "restarted_s": 5.0, "serving_s": 6.5,
         "router_ok_s": 40.0, "serving_limit_s": 30}
    r.update(kw)
    return r


def test_drill_problems_asserts_restart_serving_and_router_path():
    assert drills.drill_problems(_kill(), 30, 180) == []  # 40 s end to end: over the goal, reported
    assert "did not restart" in drills.drill_problems(_kill(restarted_s=None), 30, 180)[0]
    assert "did not restart" in drills.drill_problems(_kill(restarted_s=31.0), 30, 180)[0]
    assert "not serving within 30 s" in drills.drill_problems(_kill(serving_s=None), 30, 180)[0]
    assert "not serving within 30 s" in drills.drill_problems(_kill(serving_s=30.5), 30, 180)[0]
    assert "through the router" in drills.drill_problems(_kill(router_ok_s=None), 30, 180)[0]


def test_serves_needs_n_in_a_row_and_until_serving_waits(monkeypatch):
    answers = iter([True, True, False, True, True, True])
    monkeypatch.setattr(load, "one_request", lambda *a, **k: (next(answers), ""))
    assert load.serves("u", "m", n=2) is True
    assert load.serves("u", "m", n=2) is False  # the first of two failed, the second is not sent
    assert load.until_serving("u", "m", limit=5, step=0) is not None  # the next three succeed
    monkeypatch.setattr(load, "one_request", lambda *a, **k: (False, "HTTP 502"))
    assert load.until_serving("u", "m", limit=0.05, step=0.01) is None
