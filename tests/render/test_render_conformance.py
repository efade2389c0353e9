"""Issue 45: inventory/prod's render read against the real packages of the versions it names (vLLM, vllm-router and
both Mooncake builds, from the registry, pinned and hash-checked by inventory/prod's pip locks, cached under
$PD_LAB_CACHE/conformance: scripts/conformance/conformance.py). Every vLLM, router, master and store-client flag, every
kv_transfer_config key and connector must exist in that version; and the same check, on a copy of the render with one
wrong flag or key per program, fails naming each."""
import importlib.util
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("conformance", REPO / "scripts" / "conformance" / "conformance.py")
conformance = importlib.util.module_from_spec(spec)
spec.loader.exec_module(conformance)


@pytest.fixture(scope="module")
def versions(prod_inventory):
    groups, hostvars = prod_inventory
    return conformance.versions_of(groups, hostvars)


def test_prod_render_conforms_to_the_versions_it_names(prod_render, versions):
    # The routers run smg, the default (vllm-router's flags are read the same way: tests/unit/test_conformance.py).
    assert set(versions) == {"vllm", "smg", "mooncake_master", "mooncake_client"}
    problems, summary = conformance.check(prod_render, versions, REPO / "inventory" / "prod")
    print("\n".join(summary))
    assert problems == []
    # Every program's command lines were read (a render that lost them would pass vacuously).
    assert all(" 0 flags" not in line and " 0 documents" not in line for line in summary), summary
    assert any(line.startswith("vllm units: ") and " run vllm serve, " in line for line in summary), summary


def _append(path, var, extra):
    lines = path.read_text().splitlines()
    for n, line in enumerate(lines):
        if line.startswith(var + '="'):
            lines[n] = line[:-1] + " " + extra + '"'
            break
    else:
        lines.append('%s="%s"' % (var, extra))
    path.write_text("\n".join(lines) + "\n")


def test_a_wrong_flag_or_key_fails_naming_it(prod_render, versions, tmp_path):
    copy = tmp_path / "render"
    shutil.copytree(prod_render, copy)
    env = copy / "gpu-p1" / "etc" / "vllm" / "prefill0.env"
    _append(env, "SERVE_EXTRA_ARGS", "--gpu-memory-utilisation 0.9")
    env.write_text(env.read_text().replace('"kv_role":"kv_producer","engine_id"', '"kv_role":"kv_producer","kv_rol":"x","engine_id"', 1))
    _append(copy / "router-1" / "etc" / "vllm-router" / "router.env", "VLLM_ROUTER_ARGS", "--prefil-policy x")
    _append(copy / "ctl-1" / "etc" / "mooncake" / "master.env", "MOONCAKE_MASTER_ARGS", "--rpc-port=1")
    _append(copy / "gpu-p1" / "etc" / "vllm" / "mooncake-store-client.env", "MOONCAKE_CLIENT_ARGS", "--no_such_flag=1")
    unit = copy / "gpu-d1" / "etc" / "systemd" / "system" / "vllm@.service"
    unit.write_text(unit.read_text().replace("/bin/vllm serve ", "/bin/vllm serv ", 1))
    problems, _ = conformance.check(copy, versions, REPO / "inventory" / "prod")
    text = "\n".join(problems)
    for want in ("--gpu-memory-utilisation (gpu-p1/etc/vllm/prefill0.env, host gpu-p1) is not a flag of vllm 0.33.0",
                 "kv_transfer_config key kv_rol (gpu-p1/etc/vllm/prefill0.env, host gpu-p1) is not a field of "
                 "vllm 0.33.0's KVTransferConfig",
                 "--prefil-policy (router-1/etc/vllm-router/router.env, host router-1) is not a flag of "
                 "smg 1.13.0",
                 "--rpc-port (ctl-1/etc/mooncake/master.env, host ctl-1) is not a flag of "
                 "mooncake-transfer-engine-non-cuda 0.3.13.post1",
                 "--no_such_flag (gpu-p1/etc/vllm/mooncake-store-client.env, host gpu-p1) is not a flag of "
                 "mooncake-transfer-engine-cuda13 0.3.14",
                 "gpu-d1/etc/systemd/system/vllm@.service runs `vllm serv`: vllm 0.33.0's vllm has no subcommand "
                 "'serv' (it has: "):
        assert want in text, text
    assert len(problems) == 6, text


def test_a_patch_target_the_version_lacks_fails_naming_it(versions):
    """Each vLLM patch's declared targets exist in the version's source (test above); one renamed does not."""
    package, version = versions["vllm"]
    wheel = conformance.Wheel(conformance.fetch(package, version, conformance.lock_pins(REPO / "inventory" / "prod")))
    declared = conformance.patch_targets()
    targets, calls = declared["pd_bundle_sender_tasks"]
    module = next(iter(targets))
    declared["pd_bundle_sender_tasks"] = ({module: ("MooncakeConnectorWorker._sender_workr",)}, calls)
    assert conformance.patch_problems(wheel, "vllm %s" % version, declared) == [
        "pd_bundle_sender_tasks: %s has no MooncakeConnectorWorker._sender_workr in vllm %s" % (module, version)]
