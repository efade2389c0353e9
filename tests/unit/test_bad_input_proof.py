"""scripts/lab/bad-input-proof.py must be able to fail: a docker error, an empty or incomplete snapshot,
a needle found only in a task or host name, a refusal outside preflight, a --check run that changed
something are all failures, never passes."""
import importlib.util
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

LAB = Path(__file__).resolve().parents[2] / "scripts" / "lab"
spec = importlib.util.spec_from_file_location("bad_input_proof", LAB / "bad-input-proof.py")
proof = importlib.util.module_from_spec(spec)
spec.loader.exec_module(proof)

GROUPS = {"etcd": ["etcd1"], "mooncake_master": ["etcd1"], "vllm_prefill": ["prefill1"], "vllm_decode": [],
          "vllm_router": ["router1"]}
PREFILL_VARS = {"firewall_enabled": True, "vllm_model": "/srv/models/tiny-llama",
                "vllm_instances": [{"name": "prefill0", "port": 8100}, {"name": "prefill1", "port": 8101}]}


def _good_prefill_snapshot():
    s = proof.host_spec("prefill1", PREFILL_VARS, GROUPS)
    snap = {k: "x" for k in s["need"]}
    snap.update({f"unit:{u}": "loaded active running 123" for u in s["running"]})
    snap["file:/srv/models/tiny-llama/config.json"] = "x"
    return s, snap


# --- docker errors -------------------------------------------------------------------------------

def test_docker_error_is_a_proof_error_not_an_empty_answer(monkeypatch):
    monkeypatch.setattr(proof, "DOCKER", "false")  # exits 1, like docker exec on a stopped container
    with pytest.raises(proof.ProofError, match=r"rc=1"):
        proof.docker("etcd1", "true")
    monkeypatch.setattr(proof, "DOCKER", "/nonexistent/docker")
    with pytest.raises(proof.ProofError):
        proof.docker("etcd1", "true")


def test_snapshot_with_empty_docker_output_raises(monkeypatch):
    monkeypatch.setattr(proof, "DOCKER", "true")  # rc 0 and nothing on stdout
    s, _ = _good_prefill_snapshot()
    with pytest.raises(proof.ProofError, match="unreadable snapshot"):
        proof.snapshot_host("prefill1", s)


def test_failing_docker_fails_the_whole_proof(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(proof, "DOCKER", "false")
    monkeypatch.setattr(proof, "inventory", lambda paths: ({"prefill1": PREFILL_VARS}, GROUPS))
    monkeypatch.setattr(proof, "playbook", lambda *a, **k: pytest.fail("must not run site.yml without a snapshot"))
    assert proof.main(["--hosts", "prefill1", "--out", str(tmp_path / "r.json"), "--no-check-diff"]) == 1
    assert "docker exec prefill1 failed" in capsys.readouterr().err


# --- snapshots -----------------------------------------------------------------------------------

def test_empty_snapshots_compare_equal_but_are_refused():
    s, good = _good_prefill_snapshot()
    assert proof.diff({"prefill1": {}}, {"prefill1": {}}) == []  # why the check below exists
    assert "empty snapshot" in proof.snapshot_problems("prefill1", {}, s)[0]
    assert "empty snapshot" in proof.snapshot_problems("prefill1", {"dpkg": "1 packages x"}, s)[0]
    assert proof.snapshot_problems("prefill1", good, s) == []


def test_snapshot_missing_an_expected_entry_is_refused():
    s, good = _good_prefill_snapshot()
    for key in ("file:/opt/vllm/plugins/pd_bundle_drain.py", "venv:/opt/vllm/venv",
                "file:/opt/vllm/venv/.pd-bundle-pip.json", "file:/etc/vllm/prefill1.env",
                "file:/etc/pd-bundle/firewall.nft"):
        snap = dict(good)
        del snap[key]
        assert proof.snapshot_problems("prefill1", snap, s) == [f"prefill1: snapshot lacks {key}"]
    no_model = {k: v for k, v in good.items() if not k.startswith("file:/srv/models/")}
    assert "no model file" in proof.snapshot_problems("prefill1", no_model, s)[0]
    for state in ("loaded inactive dead 0", "not-found inactive dead 0", "loaded active running 0"):
        snap = dict(good, **{"unit:vllm@prefill1.service": state})
        assert "vllm@prefill1.service is not loaded, active" in proof.snapshot_problems("prefill1", snap, s)[0]


def test_host_spec_covers_venvs_plugins_and_every_group():
    s = proof.host_spec("prefill1", PREFILL_VARS, GROUPS)
    assert "/opt/vllm/plugins" in s["paths"] and "/srv/models" in s["paths"]
    assert {"/opt/vllm/venv/.pd-bundle-pip.json", "/opt/mooncake/venv/.pd-bundle-pip.json"} <= set(s["paths"])
    assert s["venvs"] == ["/opt/vllm/venv", "/opt/mooncake/venv", "/opt/vllm-router/venv"]
    assert s["running"] == ["vllm@prefill0.service", "vllm@prefill1.service"]
    assert "vllm@prefill1.service" in s["units"] and "vllm" in s["users"]
    etcd = proof.host_spec("etcd1", {"firewall_enabled": "true"}, GROUPS)
    assert set(etcd["running"]) == {"etcd.service", "mooncake-master.service"}
    assert "file:/etc/etcd/etcd.env" in etcd["need"] and "venv:/opt/mooncake/venv" in etcd["need"]
    router = proof.host_spec("router1", {"vllm_router_venv": "/srv/router-venv"}, GROUPS)
    assert router["running"] == ["vllm-router.service"] and "venv:/srv/router-venv" in router["need"]


def test_diff_names_host_key_and_values():
    a = {"h": {"file:/etc/a": "1 644 0:0", "unit:x.service": "loaded active running 1"}}
    b = {"h": {"file:/etc/a": "1 644 0:0", "unit:x.service": "loaded active running 2"}}
    assert proof.diff(a, a) == []
    d = proof.diff(a, b)
    assert len(d) == 1 and d[0].startswith("h: changed") and "running 1 -> loaded active running 2" in d[0]
    assert "removed ['file:/etc/a']" in proof.diff(a, {"h": {"unit:x.service": "loaded active running 1"}})[0]
    assert proof.diff(a, {}) == ["h: only in the first snapshot"]


def _fake_bin(tmp_path, name, script):
    p = tmp_path / "bin" / name
    p.parent.mkdir(exist_ok=True)
    p.write_text("#!/bin/sh\n" + script)
    p.chmod(p.stat().st_mode | stat.S_IEXEC)


def _run_snapshot_py(tmp_path, spec_doc):
    env = dict(os.environ, PATH=f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    return subprocess.run([sys.executable, "-c", proof.SNAPSHOT_PY, json.dumps(spec_doc)],
                          capture_output=True, text=True, env=env)


def test_host_snapshot_script_records_files_links_venvs_units(tmp_path):
    root = tmp_path / "etc"
    (root / "wants").mkdir(parents=True)
    (root / "a.env").write_text("A=1\n")
    (root / "wants" / "x.service").symlink_to("/etc/systemd/system/x.service")
    venv = tmp_path / "venv"
    (venv / "lib" / "python3.11" / "site-packages" / "vllm-0.1.dist-info").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    _fake_bin(tmp_path, "dpkg-query", "echo 'bash 5.2 ii '\n")
    _fake_bin(tmp_path, "systemctl", "printf 'Id=x.service\\nLoadState=loaded\\nActiveState=active\\n"
                                     "SubState=running\\nMainPID=42\\n'\n")
    doc = {"paths": [str(root), str(tmp_path / "absent")], "venvs": [str(venv)], "users": ["root"],
           "units": ["x.service"]}
    res = _run_snapshot_py(tmp_path, doc)
    assert res.returncode == 0, res.stderr
    snap = json.loads(res.stdout)
    assert snap[f"file:{root}/a.env"].split()[1:] == ["644", f"{os.getuid()}:{os.getgid()}"]
    assert snap[f"link:{root}/wants/x.service"] == "/etc/systemd/system/x.service"
    assert snap[f"venv:{venv}"].startswith("1 dists ")
    assert snap["unit:x.service"] == "loaded active running 42" and snap["user:root"].startswith("root:")
    # A new distribution in the venv changes its entry.
    (venv / "lib" / "python3.11" / "site-packages" / "extra-1.0.dist-info").mkdir()
    assert json.loads(_run_snapshot_py(tmp_path, doc).stdout)[f"venv:{venv}"].startswith("2 dists ")


def test_host_snapshot_script_fails_when_a_tool_fails(tmp_path):
    _fake_bin(tmp_path, "dpkg-query", "echo 'bash 5.2 ii '\n")
    _fake_bin(tmp_path, "systemctl", "echo 'System has not been booted with systemd' >&2; exit 1\n")
    doc = {"paths": [], "venvs": [], "users": [], "units": ["x.service"]}
    assert _run_snapshot_py(tmp_path, doc).returncode != 0
    venv = tmp_path / "venv"
    venv.mkdir()
    _fake_bin(tmp_path, "systemctl", "exit 0\n")
    assert _run_snapshot_py(tmp_path, dict(doc, venvs=[str(venv)])).returncode != 0  # a venv with no dists


# --- refusals ------------------------------------------------------------------------------------

def _doc(task, host, msg, changed=0, other_hosts=()):
    hosts = {host: {"failed": True, "msg": msg}}
    hosts.update({h: {"changed": False, "msg": "ok"} for h in other_hosts})
    return {"plays": [{"tasks": [
        {"task": {"name": "preflight : Preflight | Load settings"}, "hosts": {host: {"changed": False}}},
        {"task": {"name": task}, "hosts": hosts}]}],
        "stats": {host: {"changed": changed, "failures": 1}}}


PORT_TASK = "preflight : Preflight | Argument specs | Inventory values match each role's meta/argument_specs.yml"
PORT_MSG = ('vllm_router_port="80a" on router1 is not an integer (roles/vllm_router/meta/argument_specs.yml declares '
            'type: int). Fix: set vllm_router_port to an integer, e.g. 8000.')
PORT_NEEDLES = dict((c, n) for c, _, n in proof.CASES)["wrong_type_port"]


def test_refusal_passes_only_with_needles_in_the_failed_message():
    assert proof.refusal_problem(2, _doc(PORT_TASK, "router1", PORT_MSG), PORT_NEEDLES) is None
    # The needle only in the task name (and in a host name): not a refusal that names the input.
    named = "preflight : Preflight | vllm_router_port=\"80a\" is not an integer"
    why = proof.refusal_problem(2, _doc(named, "router1", "One or more items failed"), PORT_NEEDLES)
    assert why and "no failure message" in why
    # The RDMA case's old needle 'RDMA' was in every rdma task name; the message must say the fault.
    nic = dict((c, n) for c, _, n in proof.CASES)["unknown_nic"]
    why = proof.refusal_problem(2, _doc("rdma : RDMA | Preflight | Select NICs", "decode1",
                                        "RDMA devices: none. Fix: ..."), nic)
    assert why and "no failure message" in why
    # The message must name a host of the run (preflight runs once for the play: it fails on the play's first host,
    # etcd1, and names the host whose value it refuses); a message naming no host of the run does not count.
    once = _doc(PORT_TASK, "etcd1", PORT_MSG)
    once["stats"]["router1"] = {"changed": 0, "failures": 0}
    assert proof.refusal_problem(2, once, PORT_NEEDLES) is None
    assert proof.refusal_problem(2, _doc(PORT_TASK, "decode1", PORT_MSG), PORT_NEEDLES)
    assert proof.refusal_problem(2, _doc(PORT_TASK, "decode1", PORT_MSG.replace("router1", "router10")), PORT_NEEDLES)


def test_refusal_fails_on_success_late_failure_or_change():
    assert proof.refusal_problem(0, _doc(PORT_TASK, "router1", PORT_MSG), PORT_NEEDLES) == "site.yml succeeded"
    assert "no task failed" in proof.refusal_problem(2, {"plays": [], "stats": {}}, PORT_NEEDLES)
    late = _doc("vllm : VLLM | Install | Pinned dependency list", "router1", PORT_MSG)
    assert "not a preflight check" in proof.refusal_problem(2, late, PORT_NEEDLES)
    assert "changed ['router1']" in proof.refusal_problem(2, _doc(PORT_TASK, "router1", PORT_MSG, changed=1),
                                                           PORT_NEEDLES)


def test_first_failure_reads_loop_items_and_unreachable():
    doc = {"plays": [{"tasks": [{"task": {"name": "t"}, "hosts": {
        "a": {"failed": True, "msg": "One or more items failed",
              "results": [{"failed": False, "msg": "ok"}, {"failed": True, "msg": "item says x"}]},
        "b": {"unreachable": True, "msg": "container not running"}}}]}]}
    assert proof.first_failure(doc) == ("t", {"a": ["item says x"], "b": ["container not running"]})


def test_run_doc_skips_timing_lines_and_refuses_garbage():
    doc = {"plays": [], "stats": {"h": {"changed": 0}}}
    assert proof.run_doc("Tuesday 01 December ... ***\n" + json.dumps(doc, indent=4)) == doc
    for bad in ("", "ERROR! the playbook could not be found", "x\n{\n  broken"):
        with pytest.raises(proof.ProofError):
            proof.run_doc(bad)


def test_check_diff_needs_every_host_unchanged():
    ok = {"stats": {h: {"changed": 0, "failures": 0, "unreachable": 0} for h in ("a", "b")}}
    assert proof.check_diff_problem(0, ok, ["a", "b"]) is None
    assert "without a result ['b']" in proof.check_diff_problem(0, {"stats": {"a": ok["stats"]["a"]}}, ["a", "b"])
    assert "changed/failed" in proof.check_diff_problem(0, {"stats": dict(ok["stats"], b={"changed": 1})},
                                                         ["a", "b"])
    assert proof.check_diff_problem(2, ok, ["a", "b"]).startswith("rc=2")
    assert proof.check_diff_problem(0, {"stats": {}}, ["a"])  # an empty run is not a clean run


def test_parallel_runs_still_fail_on_a_change_a_bad_run_or_a_dirty_check(monkeypatch, tmp_path, capsys):
    """The refused runs and the --check run go side by side; one snapshot after all of them must equal the one
    before, every case must be refused and --check must be clean, or the proof fails."""
    s, snap = _good_prefill_snapshot()
    monkeypatch.setattr(proof, "inventory", lambda paths: ({"prefill1": PREFILL_VARS}, GROUPS))
    snaps = iter([snap, dict(snap, **{"file:/etc/vllm/prefill0.env": "changed"})])
    monkeypatch.setattr(proof, "snapshot_host", lambda host, spec: next(snaps))
    refused = {"plays": [{"tasks": [{"task": {"name": "Preflight | x"}, "hosts": {"prefill1": {
        "failed": True, "msg": "x on prefill1. Fix: y"}}}]}], "stats": {"prefill1": {"failures": 1}}}
    clean = {"plays": [], "stats": {"prefill1": {"changed": 0}}}

    def playbook(inventory, *extra, check=False):
        return subprocess.CompletedProcess([], 0 if check else 2, json.dumps(clean if check else refused), "")
    monkeypatch.setattr(proof, "playbook", playbook)
    monkeypatch.setattr(proof, "CASES", [("a", {}, ("x",)), ("b", {}, ("x",))])
    monkeypatch.setattr(proof, "EVEN_ETCD_NEEDLES", ("x",))
    monkeypatch.setattr(proof.LAB, "hosts", lambda group=None: ["prefill1"])
    args = proof.argparse.Namespace(inventory="inv", hosts=["prefill1"], out=str(tmp_path / "r.json"),
                                    check_diff=True, cases=["a", "b", "even_etcd_count"])
    assert proof.prove(args) == 1
    err = capsys.readouterr().err
    assert "hosts changed after the refused runs and --check" in err and "prefill0.env" in err
    report = json.loads((tmp_path / "r.json").read_text())
    assert [r["case"] for r in report["cases"]] == ["a", "b", "even_etcd_count"]
    assert all(r["refused"] for r in report["cases"]) and report["check_diff"]["rc"] == 0
    # Unchanged hosts: passes. A --check run that changes something: fails.
    snaps = iter([snap, snap])
    monkeypatch.setattr(proof, "snapshot_host", lambda host, spec: next(snaps))
    assert proof.prove(args) == 0
    snaps = iter([snap, snap])
    clean["stats"]["prefill1"]["changed"] = 1
    assert proof.prove(args) == 1
    # --cases (the lab step's subset): only those run.
    snaps = iter([snap, snap])
    clean["stats"]["prefill1"]["changed"] = 0
    args.cases = ["b"]
    assert proof.prove(args) == 0
    assert [r["case"] for r in json.loads((tmp_path / "r.json").read_text())["cases"]] == ["b"]
    assert "--check --diff: rc=0" in capsys.readouterr().err
