"""scripts/conformance/conformance.py's parts on small inputs: what it reads from a package's source, and that each
check fails naming the flag or key, the file it came from and the version (tests/render/test_render_conformance.py runs it
on inventory/prod's render against the real wheels)."""
import importlib.util
import json
import textwrap
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("conformance", REPO / "scripts" / "conformance" / "conformance.py")
c = importlib.util.module_from_spec(spec)
spec.loader.exec_module(c)


def test_argparse_flags_reads_literals_and_prefixed_fstrings():
    src = textwrap.dedent('''
        def add(parser, prefix=""):
            parser.add_argument("--port", "-p", type=int)
            group.add_argument(f"--{prefix}policy", default="x")
            parser.add_argument("model_tag", nargs="?")
            parser.add_argument(f"--{other}x")
            other.call("--not-an-argument")
        ''')
    assert c.argparse_flags(src, {"prefix": ""}) == {"--port", "-p", "--policy"}
    assert c.argparse_flags(src, {"prefix": "router-"}) == {"--port", "-p", "--router-policy"}


def test_class_fields_follow_bases_in_the_same_source():
    src = textwrap.dedent('''
        class BaseFrontendArgs:
            enable_scale_out: bool = False
            def add_cli_args(cls): pass
        class FrontendArgs(BaseFrontendArgs):
            port: int = 8000
            middleware: list = None
            CONSTANT = 1
        class Other:
            x: int
        ''')
    got = c.class_fields(src, lambda n, bases: n.endswith("FrontendArgs"))
    assert got == {"BaseFrontendArgs": ["enable_scale_out"], "FrontendArgs": ["enable_scale_out", "port", "middleware"]}
    assert c.class_fields(src, {"Other"}) == {"Other": ["x"]}


def test_connectors_and_the_keys_a_package_reads():
    src = 'F.register_connector("MooncakeConnector", "vllm.x.mooncake.mooncake_connector", "MooncakeConnector")\n'
    assert c.registered_connectors(src) == {"MooncakeConnector": "vllm.x.mooncake.mooncake_connector"}
    reader = 'n = extra.get("num_workers", 10)\np = cfg["mooncake_protocol"]\nlog("device_name")\n'
    assert c.read_keys(reader) == {"num_workers", "mooncake_protocol"}


def test_gflags_names_from_helpxml():
    xml = ('<?xml version="1.0"?><AllFlags><program>m</program><flag><file>a.cpp</file><name>rpc_port</name>'
           '</flag><flag><name>enable_ha</name></flag></AllFlags>')
    assert c.gflags_names(xml) == {"rpc_port", "enable_ha"}


def test_a_flag_the_version_lacks_fails_naming_flag_file_and_version():
    cmds = [("vllm", "gpu-p1", Path("gpu-p1/etc/vllm/prefill0.env"), ["--max-model-len", "--no-enable-prefix-caching",
                                                                       "--max-modle-len"]),
            ("mooncake_master", "ctl-1", Path("ctl-1/etc/mooncake/master.env"), ["--rpc_port", "--rpc-port"])]
    known = {"vllm": {"--max-model-len", "--enable-prefix-caching"}, "mooncake_master": {"rpc_port"}}
    labels = {"vllm": "vllm 0.33.0", "mooncake_master": "mooncake-transfer-engine-non-cuda 0.3.13.post1"}
    assert c.flag_problems(cmds, known, labels) == [
        "--max-modle-len (gpu-p1/etc/vllm/prefill0.env, host gpu-p1) is not a flag of vllm 0.33.0",
        "--rpc-port (ctl-1/etc/mooncake/master.env, host ctl-1) is not a flag of "
        "mooncake-transfer-engine-non-cuda 0.3.13.post1"]


def test_kv_transfer_config_keys_connectors_and_extra_keys_are_checked_down_the_multiconnector():
    facts = {"kv_fields": {"kv_connector", "kv_role", "kv_connector_extra_config"},
             "connectors": {"MultiConnector": "v.multi", "MooncakeConnector": "v.mooncake.conn"},
             "extra_keys": {"MultiConnector": {"connectors"}, "MooncakeConnector": {"num_workers"}}}
    good = {"kv_connector": "MultiConnector", "kv_role": "kv_producer", "kv_connector_extra_config": {"connectors": [
        {"kv_connector": "MooncakeConnector", "kv_role": "kv_producer",
         "kv_connector_extra_config": {"num_workers": 10}}]}}
    where = Path("gpu-p1/etc/vllm/prefill0.env")
    assert c.kv_problems([("gpu-p1", where, good)], facts, "vllm 0.33.0") == []
    bad = json.loads(json.dumps(good))
    bad["kv_rol"] = "x"
    bad["kv_connector_extra_config"]["connectors"][0]["kv_connector_extra_config"]["num_worker"] = 1
    bad["kv_connector_extra_config"]["connectors"].append({"kv_connector": "NoSuchConnector"})
    assert c.kv_problems([("gpu-p1", where, bad)], facts, "vllm 0.33.0") == [
        "kv_transfer_config key kv_rol (gpu-p1/etc/vllm/prefill0.env, host gpu-p1) is not a field of vllm 0.33.0's "
        "KVTransferConfig",
        "kv_connector_extra_config key num_worker of MooncakeConnector (gpu-p1/etc/vllm/prefill0.env, host gpu-p1, "
        "connectors[0]) is read nowhere in vllm 0.33.0's connector package v.mooncake.conn",
        "kv_connector NoSuchConnector (gpu-p1/etc/vllm/prefill0.env, host gpu-p1, connectors[1]) is not a connector "
        "vllm 0.33.0 registers"]


def test_versions_of_reads_hostvars_over_defaults_and_refuses_two_versions():
    groups = {"vllm_prefill": ["p1"], "vllm_decode": ["d1"], "vllm_router": ["r1"], "mooncake_master": ["m1"]}
    defaults = {"vllm_package": "vllm", "vllm_version": "0.33.0", "vllm_router_version": "0.1.17",
                "vllm_router_implementation": "vllm-router", "vllm_router_smg_version": "1.13.0",
                "mooncake_package": "mooncake-transfer-engine-cuda13", "mooncake_version": "0.3.14"}
    hostvars = {"m1": {"mooncake_package": "mooncake-transfer-engine-non-cuda", "mooncake_version": "0.3.13.post1"}}
    assert c.versions_of(groups, hostvars, defaults) == {
        "vllm": ("vllm", "0.33.0"), "vllm-router": ("vllm-router", "0.1.17"),
        "mooncake_master": ("mooncake-transfer-engine-non-cuda", "0.3.13.post1"),
        "mooncake_client": ("mooncake-transfer-engine-cuda13", "0.3.14")}
    hostvars["d1"] = {"vllm_version": "0.32.0"}
    with pytest.raises(ValueError, match="vllm as vllm==0.32.0 and vllm==0.33.0"):
        c.versions_of(groups, hostvars, defaults)


def test_rendered_reads_units_and_environment_files(tmp_path):
    unit = tmp_path / "gpu-p1" / "etc" / "systemd" / "system" / "vllm@.service"
    unit.parent.mkdir(parents=True)
    unit.write_text("[Service]\nExecStart=/opt/vllm/venv/bin/vllm serve ${SERVE_MODEL} --port ${SERVE_PORT} "
                    "--middleware m.M $SERVE_EXTRA_ARGS\n")
    env = tmp_path / "gpu-p1" / "etc" / "vllm" / "prefill0.env"
    env.parent.mkdir(parents=True)
    env.write_text("# c\nSERVE_EXTRA_ARGS=\"--max-model-len 4096 --enforce-eager\"\n"
                   "SERVE_KV_TRANSFER_CONFIG='{\"kv_connector\":\"MooncakeConnector\"}'\n")
    master = tmp_path / "ctl-1" / "etc" / "mooncake" / "master.env"
    master.parent.mkdir(parents=True)
    master.write_text('MOONCAKE_MASTER_ARGS="--rpc_port=50051 --enable_ha=true"\n')
    cmds, kv = c.rendered(tmp_path)
    assert [(p, h, str(f), flags) for p, h, f, flags in cmds] == [
        ("vllm", "gpu-p1", "gpu-p1/etc/systemd/system/vllm@.service", ["--port", "--middleware"]),
        ("vllm", "gpu-p1", "gpu-p1/etc/vllm/prefill0.env", ["--max-model-len", "--enforce-eager"]),
        ("mooncake_master", "ctl-1", "ctl-1/etc/mooncake/master.env", ["--rpc_port", "--enable_ha"])]
    assert kv == [("gpu-p1", Path("gpu-p1/etc/vllm/prefill0.env"), {"kv_connector": "MooncakeConnector"})]


def test_rendered_names_each_router_by_the_program_its_unit_runs(tmp_path):
    """A router host's flags are read against smg where its unit starts smg's launcher, else against vllm-router: a
    flag of one program is a wrong flag of the other."""
    for host, exec_start in (("router-1", "/opt/vllm-router/venv/bin/python /opt/vllm-router/bin/%s $VLLM_ROUTER_ARGS"
                              % c.SMG_LAUNCHER), ("router-2", "/opt/vllm-router/venv/bin/vllm-router $VLLM_ROUTER_ARGS")):
        unit = tmp_path / host / "etc" / "systemd" / "system" / "vllm-router.service"
        unit.parent.mkdir(parents=True)
        unit.write_text("[Service]\nExecStart=%s\n" % exec_start)
        env = tmp_path / host / "etc" / "vllm-router" / "router.env"
        env.parent.mkdir(parents=True)
        env.write_text('VLLM_ROUTER_ARGS="--pd-disaggregation --host 10.0.0.41"\n')
    cmds, _ = c.rendered(tmp_path)
    assert [(p, h) for p, h, _, _ in cmds] == [("smg", "router-1"), ("vllm-router", "router-2")]
    known = {"smg": {"--pd-disaggregation", "--host"}, "vllm-router": {"--vllm-pd-disaggregation", "--host"}}
    assert c.flag_problems(cmds, known, {"smg": "smg 1.13.0", "vllm-router": "vllm-router 0.1.17"}) == [
        "--pd-disaggregation (router-2/etc/vllm-router/router.env, host router-2) is not a flag of vllm-router 0.1.17"]


def _wheel(tmp_path, files):
    path = tmp_path / "w.whl"
    with zipfile.ZipFile(path, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
    return c.Wheel(path)


def test_vllm_commands_are_the_console_scripts_and_the_cli_subcommands(tmp_path):
    wheel = _wheel(tmp_path, {
        "vllm-0.33.0.dist-info/entry_points.txt": "[console_scripts]\nvllm = vllm.entrypoints.cli.main:main\n"
                                                  "other = vllm.other:main\n",
        "vllm/entrypoints/cli/serve.py": "class ServeSubcommand(CLISubcommand):\n    name = 'serve'\n",
        "vllm/entrypoints/cli/bench/main.py": "class BenchSubcommand:\n    name = 'bench'\n    help = 'x'\n",
        "vllm/entrypoints/openai/x.py": "class Other:\n    name = 'not-a-subcommand'\n"})
    known = c.vllm_commands(wheel)
    assert known == {"vllm": {"serve", "bench"}, "other": set()}
    unit = tmp_path / "r" / "h1" / "etc" / "systemd" / "system" / "vllm@.service"
    unit.parent.mkdir(parents=True)
    unit.write_text("[Service]\nExecStart=/opt/vllm/venv/bin/vllm serve ${SERVE_MODEL} --port ${SERVE_PORT}\n")
    cmds = c.rendered_commands(tmp_path / "r")
    assert cmds == [("h1", Path("h1/etc/systemd/system/vllm@.service"), "vllm", "serve")]
    assert c.command_problems(cmds, known, "vllm 0.33.0") == []
    # The check can fail: a subcommand the version lacks, and a program it does not install.
    unit.write_text("[Service]\nExecStart=/opt/vllm/venv/bin/vllm srve ${SERVE_MODEL}\n")
    assert c.command_problems(c.rendered_commands(tmp_path / "r"), known, "vllm 0.33.0") == [
        "h1/etc/systemd/system/vllm@.service runs `vllm srve`: vllm 0.33.0's vllm has no subcommand 'srve' "
        "(it has: bench, serve)"]
    unit.write_text("[Service]\nExecStart=/opt/vllm/venv/bin/python -m vllm.entrypoints.openai.api_server\n")
    assert c.command_problems(c.rendered_commands(tmp_path / "r"), known, "vllm 0.33.0") == [
        "h1/etc/systemd/system/vllm@.service runs 'python', which vllm 0.33.0 does not install as a console script "
        "(it has: other, vllm)"]


def test_lock_pins_read_every_lock_of_the_inventory():
    pins = c.lock_pins(REPO / "inventory" / "prod")
    assert ("vllm", "0.33.0") in pins and ("mooncake-transfer-engine-non-cuda", "0.3.13.post1") in pins


MODULE = textwrap.dedent('''
    from .utils import MooncakeBootstrapServer
    try:
        import zmq
    except ImportError:
        zmq = None
    def bind(sock):
        return sock.bind_to_random_port("tcp://*")
    class Worker:
        handlers = {}
        def __init__(self):
            self._block_size = 16
        async def _sender_worker(self, sock):
            item = await self.queue.get()
            await self.send_kv_to_decode(item)
    ''')


def test_missing_in_source_reads_names_class_attributes_and_self_assignments():
    assert c.missing_in_source(MODULE, ("MooncakeBootstrapServer", "zmq", "bind", "Worker._sender_worker",
                                        "Worker._block_size", "Worker.handlers")) == []
    assert c.missing_in_source(MODULE, ("get_addr", "Worker._sender_workr", "Worker.load_specs")) == [
        "get_addr", "Worker._sender_workr", "Worker.load_specs"]


def test_calls_missing_is_the_patches_substring_test_on_the_function_or_module():
    assert c.calls_missing(MODULE, None, ("bind_to_random_port",)) == []
    assert c.calls_missing(MODULE, "Worker._sender_worker", ("self.queue.get()", "send_kv_to_decode(")) == []
    assert c.calls_missing(MODULE, "Worker._sender_worker", ("bind_to_random_port", "task_done()")) == [
        "bind_to_random_port", "task_done()"]
    assert c.calls_missing(MODULE, "Worker.gone", ("x",)) == ["x"]


def test_patch_targets_are_read_from_the_patches_declarations(tmp_path):
    got = c.patch_targets()
    assert set(got) == {"pd_bundle_side_channel", "pd_bundle_sender_tasks", "pd_bundle_store_wait",
                        "pd_bundle_multi_metrics"}
    wait_targets, _ = got["pd_bundle_store_wait"]
    assert list(wait_targets.values()) == [("MooncakeStoreScheduler.get_num_new_matched_tokens",
                                            "MooncakeStoreScheduler._block_size", "MooncakeStoreScheduler.load_specs")]
    (tmp_path / "pd_bundle_x.py").write_text('M = "m"\nX_TARGETS = {M: tuple(sorted(NAMES))}\n')
    with pytest.raises(ValueError, match="pd_bundle_x.py: X_TARGETS is not a literal"):
        c.patch_targets(tmp_path)
