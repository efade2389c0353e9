"""Unit tests for plugins/filter/preflight.py (pure functions; no ansible needed)."""
import importlib.util
import os

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
_spec = importlib.util.spec_from_file_location("preflight_filter", os.path.join(REPO, "plugins", "filter", "preflight.py"))
pf = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pf)


def test_effective_overlays_inventory_and_drops_templated_defaults():
    defaults = {"a": 1, "b": "{{ x }}", "c": [1], "d": "{% if x %}y{% endif %}"}
    got = pf.effective({"a": 2, "b": "10.0.0.1", "zzz": 3}, defaults)
    assert got == {"a": 2, "b": "10.0.0.1", "c": [1]}


def test_effective_skips_values_that_cannot_be_templated():
    class HV(dict):
        def __getitem__(self, key):
            if key == "bad":
                raise RuntimeError("undefined")
            return dict.__getitem__(self, key)
    got = pf.effective(HV(bad="x", a=5), {"bad": 1, "a": 0})
    assert got == {"a": 5}


@pytest.mark.parametrize("value,ok", [(80, True), ("8080", True), (0, False), (65536, False), ("80a", False),
                                      ([80], False), (True, False), (None, False), (65535, True)])
def test_is_port(value, ok):
    assert pf.is_port(value) is ok


@pytest.mark.parametrize("value,ok", [(True, True), (False, True), ("yes", True), ("False", True), (1, True),
                                      ("maybe", False), (2, False), (None, False), ([], False)])
def test_is_boollike(value, ok):
    assert pf.is_boollike(value) is ok


@pytest.mark.parametrize("value,ok", [("10.0.0.1", True), ("fe80::1", True), ("[2001:db8::1]", True),
                                      ("host.example", False), ("10.0.0.256", False), (10, False), ("", False)])
def test_is_ip(value, ok):
    assert pf.is_ip(value) is ok


@pytest.mark.parametrize("value,ok", [("10.0.0.0/8", True), ("10.10.9.5", True), ("fd00::/64", True),
                                      ("10.0.0.5/8", False), ("10.0.0.0/33", False), ("monitoring", False),
                                      ("", False), (None, False), (10, False)])
def test_is_cidr(value, ok):
    assert pf.is_cidr(value) is ok


def test_bad_tokens():
    assert pf.bad_tokens(["--a", "0.9", 3]) == []
    assert pf.bad_tokens(["--a 0.9", "", True, {"x": 1}, "ok"]) == ["--a 0.9", "", True, {"x": 1}]
    assert pf.bad_tokens("--enforce-eager") == ["--enforce-eager"]


def test_duplicates():
    assert pf.duplicates([1, 2, 3]) == []
    assert pf.duplicates([1, 2, 1, 3, 1, 2]) == [1, 2]
    assert pf.duplicates(["a", "b", "a"]) == ["a"]
    assert pf.duplicates(None) == []


def test_port_conflicts_collision_and_range():
    table = [[8100, "vllm_instances[p0].port"], [8998, "vllm_instances[p0].bootstrap_port"],
             ["8100", "vllm_instances[p1].bootstrap_port"], [16000, "vllm_router_port"], ["80a", "ignored"]]
    msgs = pf.port_conflicts(table, 15000, 17000)
    assert msgs[0] == "port 8100 is used by vllm_instances[p0].port and vllm_instances[p1].bootstrap_port"
    assert len(msgs) == 2 and "port 16000 (vllm_router_port) is inside the transfer engine range" in msgs[1]
    assert pf.port_conflicts(table[:2], None, None) == []
    # the range bounds themselves are inside
    assert pf.port_conflicts([[15000, "x"]], 15000, 17000) and pf.port_conflicts([[17000, "x"]], 15000, 17000)


def test_endpoint_conflicts():
    eps = [{"host": "a", "label": "p0.port", "ip": "10.0.0.1", "port": 8100},
           {"host": "b", "label": "p0.port", "ip": "10.0.0.1", "port": "8100"},
           {"host": "b", "label": "p1.port", "ip": "10.0.0.2", "port": 8100}]
    assert pf.endpoint_conflicts(eps) == ["10.0.0.1:8100 is claimed by p0.port on a and p0.port on b"]
    assert pf.endpoint_conflicts(eps[1:]) == []


def test_router_override_errors():
    prefills = [{"url": "http://10.0.0.1:8100", "bootstrap_port": 8998, "where": "vllm_instances[p0] on a"}]
    decodes = [{"url": "http://10.0.0.3:8200", "where": "vllm_instances[d0] on c"}]
    assert pf.router_override_errors([], [], prefills, decodes) == []
    assert pf.router_override_errors([{"url": "http://10.0.0.1:8100/", "bootstrap_port": 8998}],
                                     ["http://10.0.0.3:8200"], prefills, decodes) == []
    errs = pf.router_override_errors([{"url": "http://10.0.0.9:8100", "bootstrap_port": 8998},
                                      {"url": "http://10.0.0.1:8100", "bootstrap_port": 9000}, "http://x",
                                      {"url": "http://10.0.0.1:8100", "bootstrap_port": 70000}],
                                     ["http://10.0.0.4:8200"], prefills, decodes)
    assert len(errs) == 4  # "http://x" is no dict: the spec's (elements: dict) to refuse
    assert "vllm_router_prefill_urls[0].url=http://10.0.0.9:8100 is not a prefill instance" in errs[0]
    assert "bootstrap_port=9000 but vllm_instances[p0] on a uses bootstrap port 8998" in errs[1]
    assert "vllm_router_prefill_urls[3].bootstrap_port=70000 is not a port" in errs[2]
    assert "vllm_router_decode_urls[0]=http://10.0.0.4:8200" in errs[3]
    # A string of URLs: the spec's list type splits it on commas, the role reads it as written.
    assert "must be a YAML list" in pf.router_override_errors([], "http://x", prefills, decodes)[0]
    assert pf.router_override_errors("http://x", {"a": 1}, prefills, decodes) == []  # the spec's types


def test_role_files(tmp_path):
    (tmp_path / "a" / "defaults").mkdir(parents=True)
    (tmp_path / "a" / "defaults" / "main.yml").write_text("x: 1\n")
    (tmp_path / "a" / "meta").mkdir()
    (tmp_path / "a" / "meta" / "argument_specs.yml").write_text("argument_specs: {}\n")
    (tmp_path / "b" / "defaults" / "main").mkdir(parents=True)
    (tmp_path / "b" / "defaults" / "main" / "z.yml").write_text("y: 2\n")
    (tmp_path / "b" / "defaults" / "main" / "a.yaml").write_text("y: 3\n")
    (tmp_path / "c").mkdir()  # a role with nothing yet
    (tmp_path / "README.md").write_text("not a role")
    got = pf.role_files(str(tmp_path))
    assert got["defaults"] == [str(tmp_path / "a/defaults/main.yml"), str(tmp_path / "b/defaults/main/a.yaml"),
                               str(tmp_path / "b/defaults/main/z.yml")]
    assert got["specs"] == [{"role": "a", "path": str(tmp_path / "a/meta/argument_specs.yml")}]
    assert pf.role_files(str(tmp_path / "missing")) == {"defaults": [], "specs": []}


def test_filter_names():
    names = pf.FilterModule().filters()
    assert all(n.startswith("preflight_") for n in names)


def test_load_roles_reads_defaults_and_main_specs(tmp_path):
    (tmp_path / "a" / "defaults").mkdir(parents=True)
    (tmp_path / "a" / "defaults" / "main.yml").write_text("a_x: 1\na_y: !unsafe '{{ raw }}'\n")
    (tmp_path / "a" / "meta").mkdir()
    (tmp_path / "a" / "meta" / "argument_specs.yml").write_text(
        "argument_specs:\n  main:\n    options:\n      a_x: {type: int, choices: [1, 2]}\n  other:\n    options: {}\n")
    (tmp_path / "b" / "defaults").mkdir(parents=True)
    (tmp_path / "b" / "defaults" / "main.yml").write_text("b_x: [1]\n")
    got = pf.load_roles(str(tmp_path), {"a": ["grp"]})
    assert got["defaults"] == {"a_x": 1, "a_y": "{{ raw }}", "b_x": [1]}
    assert got["specs"] == [{"role": "a", "file": os.path.join(tmp_path.name, "a", "meta", "argument_specs.yml"),
                             "groups": ["grp"], "options": {"a_x": {"type": "int", "choices": [1, 2]}}}]


def test_load_roles_groups_default_to_all(tmp_path):
    (tmp_path / "r" / "meta").mkdir(parents=True)
    (tmp_path / "r" / "meta" / "argument_specs.yml").write_text("argument_specs: {main: {}}\n")
    assert pf.load_roles(str(tmp_path))["specs"][0]["groups"] == ["all"]
    assert pf.load_roles(str(tmp_path))["specs"][0]["options"] == {}


def test_spec_failures_name_role_file_and_errors():
    failed = {"failed": True, "results": [
        {"failed": False, "item": {"role": "ok"}},
        {"failed": True, "item": {"role": "vllm", "file": "roles/vllm/meta/argument_specs.yml"},
         "argument_errors": ["x is not int", "y missing"]},
        {"failed": True, "item": {"role": "etcd", "file": "roles/etcd/meta/argument_specs.yml"}, "msg": "boom"}]}
    fix = " Fix: give each named variable what the spec declares (docs/variables.md lists every variable)."
    assert pf.spec_failures(failed) == [
        "role vllm (roles/vllm/meta/argument_specs.yml): x is not int; y missing." + fix,
        "role etcd (roles/etcd/meta/argument_specs.yml): boom." + fix]
    assert pf.spec_failures({"failed": True, "msg": "single"}) == ["role ? (?): single." + fix]


SPEC_FILE = "roles/x/meta/argument_specs.yml"
SPEC_OPTIONS = {
    "x_protocol": {"type": "str", "choices": ["rdma", "tcp"], "description": ["The protocol.", "RoCE is rdma."]},
    "x_port": {"type": "int", "default": 8000},
    "x_flag": {"type": "bool"},
    "x_ports": {"type": "list", "elements": "int"},
    "x_token": {"type": "int", "no_log": True},
    "x_name": {"type": "str"},
    "x_instances": {"type": "list", "elements": "dict", "options": {
        "name": {"type": "str", "required": True}, "port": {"type": "int", "required": True}}},
}


def _spec_failed(host_vars):
    failed = {"failed": True, "results": [{"failed": True, "argument_errors": ["raw"],
                                           "item": {"role": "x", "file": SPEC_FILE, "options": SPEC_OPTIONS}}]}
    return pf.spec_failures(failed, "h1", host_vars)


def test_spec_failures_name_variable_host_declared_type_and_fix():
    got = _spec_failed({"x_protocol": "roce", "x_port": "80a", "x_flag": "sometimes", "x_ports": ["ssh"],
                        "x_token": "secret-value", "x_name": "fine"})
    assert got == [
        'x_protocol="roce" on h1 is not one of: rdma, tcp (%s declares type: str, choices: [rdma, tcp]). Fix: set '
        'x_protocol to one of: rdma, tcp. The protocol. RoCE is rdma.' % SPEC_FILE,
        'x_port="80a" on h1 is not an integer (%s declares type: int). Fix: set x_port to an integer, e.g. 8000.'
        % SPEC_FILE,
        'x_flag="sometimes" on h1 is not a boolean (%s declares type: bool). Fix: set x_flag to true or false '
        '(unquoted).' % SPEC_FILE,
        'x_ports=["ssh"] on h1 is not a list of integers (%s declares type: list, elements: int). Fix: set x_ports '
        'to a YAML list of integers (one item per entry).' % SPEC_FILE,
        'x_token=(value not shown) on h1 is not an integer (%s declares type: int). Fix: set x_token to an integer.'
        % SPEC_FILE]
    assert "secret-value" not in " ".join(got)


def test_spec_failures_name_the_instance_and_its_key():
    got = _spec_failed({"x_instances": [{"name": "p0", "port": "80a", "bootsrap_port": 1}, {"port": 1}]})
    assert got == [
        'x_instances[p0] on h1 has unknown key(s) bootsrap_port (%s declares the keys name, port). Fix: correct the '
        'key\'s name, or remove it.' % SPEC_FILE,
        'x_instances[p0].port="80a" on h1 is not an integer (%s declares type: int). Fix: set x_instances[p0].port '
        'to an integer.' % SPEC_FILE,
        'x_instances[1] on h1 lacks the required key(s) name (%s). Fix: add name to it.' % SPEC_FILE]
    assert _spec_failed({"x_instances": ["p0"]}) == [
        'x_instances=["p0"] on h1 is not a list of dicts (%s declares type: list, elements: dict). Fix: set '
        'x_instances to a YAML list of dicts (one item per entry).' % SPEC_FILE]


def test_spec_failures_fall_back_on_the_raw_errors():
    """Nothing the spec refuses among the host's values (a value that could not be templated): the raw errors."""
    assert _spec_failed({"x_name": "fine"}) == ["role x (%s) on h1: raw. Fix: give each named variable what the spec "
                                                "declares (docs/variables.md lists every variable)." % SPEC_FILE]


def test_example_secrets_refused_and_own_secrets_pass(tmp_path):
    """Vault data the repo's own TEST-ONLY/LAB-ONLY passwords decrypt is public: named with the file,
    the variables and the fix. A secret under another password passes."""
    from ansible.parsing.vault import VaultLib, VaultSecret
    example = tmp_path / 'vault-pass-TEST-ONLY'
    example.write_text('example\n')
    pub = VaultLib([('default', VaultSecret(b'example'))])
    own = VaultLib([('default', VaultSecret(b'my own'))])
    inv = tmp_path / 'inv'
    (inv / 'group_vars' / 'vllm_router').mkdir(parents=True)
    (inv / 'group_vars' / 'vllm_router' / 'vault.yml').write_bytes(pub.encrypt(b'vault_router_key: abc\n'))
    inline = pub.encrypt(b'xyz').decode()
    (inv / 'group_vars' / 'all.yml').write_text(
        'common_pip_offline: true\nhaproxy_keys:\n  - name: app\n    key: !vault |\n'
        + ''.join('      %s\n' % line for line in inline.splitlines()))
    (inv / 'host_vars').mkdir()
    (inv / 'host_vars' / 'h1.yml').write_bytes(own.encrypt(b'vault_x: 1\n'))
    msgs = pf.example_secrets([str(inv)], password_files=[str(example)], repo=str(tmp_path))
    assert len(msgs) == 2, msgs
    router = next(m for m in msgs if 'vault.yml' in m)
    assert 'vault_router_key' in router and 'vault-pass-TEST-ONLY' in router and 'Fix:' in router
    inline_msg = next(m for m in msgs if 'all.yml' in m)
    assert 'the variable key in' in inline_msg
    assert pf.example_secrets([str(inv / 'host_vars')], password_files=[str(example)], repo=str(tmp_path)) == []


def test_prod_inventory_as_shipped_holds_an_example_secret():
    """inventory/prod's router key is encrypted with tests/fixtures/vault-pass-TEST-ONLY: deploying it
    as shipped is refused (render mode is not)."""
    msgs = pf.example_secrets([os.path.join(REPO, 'inventory', 'prod')])
    assert msgs and 'vault-pass-TEST-ONLY' in msgs[0]


class _Unresolvable(dict):
    """hostvars[host] whose x_name is a template that cannot be resolved (it raises on access, as HostVarsVars does)."""

    def __getitem__(self, key):
        if key == "x_name":
            raise ValueError("'x_base' is undefined")
        return dict.__getitem__(self, key)


def test_spec_errors_check_each_host_against_the_roles_it_runs_in_one_call():
    specs = [{"role": "x", "file": SPEC_FILE, "groups": ["gx"], "options": SPEC_OPTIONS},
             {"role": "preflight", "file": "own", "groups": ["all"], "options": {"x_port": {"type": "bool"}}}]
    hostvars = {"h1": {"group_names": ["gx"], "x_port": "80a", "x_name": "fine"},
                "h2": {"group_names": ["other"], "x_port": "80a"},  # does not run role x
                "h3": {"group_names": ["gx"], "x_port": 8080}}
    assert pf.spec_errors(hostvars, ["h1", "h2", "h3"], specs) == [
        'x_port="80a" on h1 is not an integer (%s declares type: int). Fix: set x_port to an integer, e.g. 8000.'
        % SPEC_FILE]  # and not the preflight role's own spec (checked as that role starts)
    assert pf.spec_errors(hostvars, ["h2", "h3"], specs) == []  # a --limit leaves h1 out
    specs[0]["groups"] = ["all"]
    assert [m.split(" is ")[0] for m in pf.spec_errors(hostvars, ["h1", "h2"], specs)] == [
        'x_port="80a" on h1', 'x_port="80a" on h2']
    bad = {"h1": _Unresolvable(group_names=["gx"], x_name="{{ x_base }}/n")}
    assert pf.spec_errors(bad, ["h1"], specs) == [
        "role x (%s) on h1: x_name cannot be templated ('x_base' is undefined). Fix: give each named variable what "
        "the spec declares (docs/variables.md lists every variable)." % SPEC_FILE]


def test_effective_all_is_effective_per_host():
    hostvars = {"h1": {"x_port": 1}, "h2": {}}
    defaults = {"x_port": 8000, "x_dir": "{{ x_base }}/d"}
    assert pf.effective_all(hostvars, ["h2", "h1"], defaults) == {"h2": {"x_port": 8000}, "h1": {"x_port": 1}}
    assert pf.effective_all(hostvars, [], defaults) == {}
