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
