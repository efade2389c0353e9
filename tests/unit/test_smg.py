"""Unit tests for smg as the router (plugins/filter/smg.py, plugins/tools/pd_bundle_smg_launch.py): its command line
carries no worker and no key, its manifest registers every worker with what smg needs to transfer KV (a worker
without it falls back to passthrough, silently), and the read-back fails when smg lists something else."""
import importlib.util
import os
import subprocess
import sys

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def _load(name, *path):
    spec = importlib.util.spec_from_file_location(name, os.path.join(REPO, *path))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


smg = _load("smg_filter", "plugins", "filter", "smg.py")
launch = _load("pd_bundle_smg_launch", "plugins", "tools", "pd_bundle_smg_launch.py")

CFG = {"kv_connector": "mooncake", "host": "10.0.0.41", "port": 8000, "prefill_policy": "cache_aware",
       "decode_policy": "round_robin", "prometheus_host": "10.0.0.41", "prometheus_port": 29000,
       "max_concurrent_requests": 0, "health_check_interval_secs": 2, "health_failure_threshold": 1,
       "health_success_threshold": 1, "request_timeout_secs": 0, "extra_args": [],
       "manifest": "/etc/vllm-router/workers.json", "discovery_interval_secs": 2, "shutdown_grace_secs": 20}
PREFILLS = [{"url": "http://10.0.1.21:8100", "bootstrap_port": 8998, "engine_id": "gpu-p1-prefill0"},
            {"url": "http://10.0.1.21:8101/", "bootstrap_port": 8999, "engine_id": "gpu-p1-prefill1"}]
DECODES = ["http://10.0.1.31:8200"]


def test_argv_has_no_worker_and_no_key():
    argv = smg.smg_argv(CFG)
    assert argv[:1] == ["--pd-disaggregation"]
    assert argv[argv.index("--discovery-file") + 1] == "/etc/vllm-router/workers.json"
    assert argv[argv.index("--discovery-provider") + 1] == "file"
    assert "--no-remove-unhealthy-workers" in argv
    for absent in ("--prefill", "--decode", "--api-key", "--worker-urls", "--max-concurrent-requests",
                   "--request-timeout-secs"):
        assert absent not in argv
    argv = smg.smg_argv(dict(CFG, max_concurrent_requests=64, request_timeout_secs=600, extra_args=["--log-json"]))
    assert argv[argv.index("--max-concurrent-requests") + 1] == "64"
    assert argv[argv.index("--request-timeout-secs") + 1] == "600"
    assert argv[-1] == "--log-json"


def test_argv_uses_only_flags_smg_has():
    """Every flag the bundle writes is one smg 1.13.0's launcher parses (its --help, recorded)."""
    known = set(open(os.path.join(REPO, "tests", "fixtures", "smg-1.13.0-launch-flags.txt")).read().split())
    argv = smg.smg_argv(dict(CFG, max_concurrent_requests=1, request_timeout_secs=1))
    assert sorted(a for a in argv if a.startswith("--") and a not in known) == []


def test_manifest_registers_what_kv_transfer_needs():
    m = smg.smg_manifest(PREFILLS, DECODES)
    assert m["version"] == 1
    by_url = {w["url"]: w for w in m["workers"]}
    assert by_url["http://10.0.1.21:8101"] == {
        "id": "10.0.1.21-8101", "url": "http://10.0.1.21:8101", "worker_type": "prefill", "bootstrap_port": 8999,
        "kv_connector": "MooncakeConnector", "kv_engine_id": "gpu-p1-prefill1"}
    assert by_url["http://10.0.1.31:8200"] == {"id": "10.0.1.31-8200", "url": "http://10.0.1.31:8200",
                                                "worker_type": "decode", "kv_connector": "MooncakeConnector"}
    # Only the fields smg accepts: one more and it ignores the whole manifest.
    assert {k for w in m["workers"] for k in w} <= set(smg.MANIFEST_FIELDS)
    # The order is the URLs', so the file changes only when membership does.
    assert smg.smg_manifest(list(reversed(PREFILLS)), DECODES) == m


@pytest.mark.parametrize("prefill", [{"url": "http://p:1", "bootstrap_port": 8998},
                                     {"url": "http://p:1", "engine_id": "p-0"}])
def test_manifest_refuses_a_prefill_that_would_pass_through(prefill):
    with pytest.raises(ValueError, match="passthrough"):
        smg.smg_manifest([prefill], DECODES)


def test_manifest_refuses_store_mode():
    with pytest.raises(ValueError, match="not built for smg"):
        smg.smg_manifest(PREFILLS, DECODES, "nixl")


def _listed(manifest, **over):
    out = []
    for w in manifest["workers"]:
        row = {"id": "01a2", "url": w["url"], "worker_type": w["worker_type"], "is_healthy": True, "status": "ready"}
        if "kv_engine_id" in w:
            row["kv_engine_id"] = w["kv_engine_id"]
        row.update(over.get(w["url"], {}))
        out.append(row)
    return {"workers": out, "total": len(out)}


def test_membership_in_sync_and_ready():
    m = smg.smg_manifest(PREFILLS, DECODES)
    plan = smg.smg_membership(_listed(m), m)
    assert plan["in_sync"] and plan["ready"]
    assert smg.smg_membership_problems(plan, "router-1") == []


def test_membership_not_ready_is_in_sync_but_not_ready():
    m = smg.smg_manifest(PREFILLS, DECODES)
    plan = smg.smg_membership(_listed(m, **{"http://10.0.1.31:8200": {"is_healthy": False, "status": "not_ready"}}), m)
    assert plan["in_sync"] and not plan["ready"] and plan["unready"] == ["http://10.0.1.31:8200"]


def test_membership_fails_on_missing_extra_and_wrong():
    m = smg.smg_manifest(PREFILLS, DECODES)
    listed = _listed(m, **{"http://10.0.1.21:8100": {"kv_engine_id": "a-fresh-uuid"}})
    listed["workers"] = [w for w in listed["workers"] if w["url"] != "http://10.0.1.31:8200"]
    listed["workers"].append({"url": "http://10.0.9.9:8200", "worker_type": "decode", "is_healthy": True,
                              "status": "ready"})
    plan = smg.smg_membership(listed, m)
    assert not plan["in_sync"]
    assert plan["missing"] == ["http://10.0.1.31:8200"]
    assert plan["extra"] == ["http://10.0.9.9:8200"]
    assert plan["wrong"] == ["http://10.0.1.21:8100"]
    text = " ".join(smg.smg_membership_problems(plan, "router-1"))
    assert "router-1: smg lacks http://10.0.1.31:8200" in text and "10.0.9.9" in text and "engine id" in text


def test_membership_of_an_empty_answer():
    m = smg.smg_manifest(PREFILLS, DECODES)
    assert smg.smg_membership({"workers": []}, m)["missing"] == sorted(w["url"] for w in m["workers"])


def test_policies_differ_where_the_programs_do():
    assert "consistent_hash" in smg.POLICIES["vllm-router"]["prefill"]
    assert "consistent_hash" not in smg.POLICIES["smg"]["prefill"]
    assert "bucket" in smg.POLICIES["smg"]["prefill"] and "bucket" not in smg.POLICIES["smg"]["decode"]


def test_argument_spec_offers_the_union_of_the_policies():
    import yaml
    spec = yaml.safe_load(open(os.path.join(REPO, "roles", "vllm_router", "meta", "argument_specs.yml")))
    opts = spec["argument_specs"]["main"]["options"]
    for kind in ("prefill", "decode"):
        union = {p for impl in smg.POLICIES.values() for p in impl[kind]}
        assert set(opts["vllm_router_%s_policy" % kind]["choices"]) == union
    assert set(opts["vllm_router_implementation"]["choices"]) == set(smg.IMPLEMENTATIONS)


def test_launcher_moves_the_key_from_the_environment_into_argv():
    env = {"VLLM_ROUTER_API_KEY": "s3cret", "OPENAI_API_KEY": "s3cret", "PATH": "/bin"}
    argv, env = launch.router_argv(["--pd-disaggregation"], env)
    assert argv == ["--pd-disaggregation", "--api-key", "s3cret"]
    assert env == {"PATH": "/bin"}  # nothing the router's children could read
    assert launch.router_argv(["--port", "1"], {})[0] == ["--port", "1"]


@pytest.mark.parametrize("bad", [["--api-key", "k"], ["--api-key=k"]])
def test_launcher_refuses_a_key_on_the_command_line(bad):
    with pytest.raises(SystemExit, match="command line"):
        launch.router_argv(bad, {})


def test_launcher_without_smg_fails_loudly():
    """Where smg's launcher functions are not importable, it exits non-zero and names the versions it was tested
    with (it never starts half a router)."""
    r = subprocess.run([sys.executable, "-S", os.path.join(REPO, "plugins", "tools", "pd_bundle_smg_launch.py"),
                        "--pd-disaggregation"], capture_output=True, text=True, env={"PATH": os.environ["PATH"]})
    assert r.returncode != 0
    assert "smg.launch_router" in r.stderr and "1.13.0" in r.stderr
