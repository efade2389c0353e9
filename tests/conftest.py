"""Shared helpers: run render mode once per inventory/variant, parse env files like systemd does."""
import fnmatch
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
# The collection's own Python by its fully qualified name (ansible_collections.pd_bundle.serving...: the filter
# plugins import plugins/plugin_utils/preflight so), as Ansible's collection loader finds it in a run:
# collections/ansible_collections/pd_bundle/serving links to this clone. The one place the tests set it.
if str(REPO / 'collections') not in sys.path:
    sys.path.insert(0, str(REPO / 'collections'))
# inventory/prod's example vault (the router API key) is encrypted with this TEST-ONLY password;
# operators re-encrypt it with their own (inventory/prod/group_vars/vllm_router/main.yml).
VAULT_PASS_TEST_ONLY = REPO / 'tests' / 'fixtures' / 'vault-pass-TEST-ONLY'


def ansible_bin(name):
    """Prefer the ansible next to the running python (the project venv), else PATH."""
    cand = Path(sys.executable).with_name(name)
    return str(cand) if cand.exists() else name


def render(inventory, out_dir, extra_vars=None):
    cmd = [ansible_bin('ansible-playbook'), 'playbooks/render.yml', '-i', str(inventory),
           '-e', 'render_dir=%s' % out_dir]
    if extra_vars:
        cmd += ['-e', json.dumps(extra_vars)]
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / 'ansible.cfg'), ANSIBLE_NOCOLOR='1',
               ANSIBLE_VAULT_PASSWORD_FILE=str(VAULT_PASS_TEST_ONLY))
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


def parse_env_file(path):
    """Key/values of an EnvironmentFile (the subset of systemd's syntax the bundle emits)."""
    out = {}
    for line in Path(path).read_text().splitlines():
        line = line.strip()
        if not line or line.startswith('#'):
            continue
        key, _, val = line.partition('=')
        if len(val) >= 2 and val[0] == val[-1] and val[0] in '"\'':
            val = val[1:-1]
        out[key] = val
    return out


def unit_exec_start(unit_path):
    for line in Path(unit_path).read_text().splitlines():
        if line.startswith('ExecStart='):
            return line[len('ExecStart='):]
    raise AssertionError('no ExecStart in %s' % unit_path)


def expand_exec(exec_start, env):
    """Expand ExecStart like systemd: ${VAR} is one argument, $VAR splits on whitespace."""
    argv = []
    for tok in exec_start.split():
        m = re.fullmatch(r'\$\{(\w+)\}', tok)
        if m:
            argv.append(env.get(m.group(1), ''))
            continue
        m = re.fullmatch(r'\$(\w+)', tok)
        if m:
            argv.extend(env.get(m.group(1), '').split())
            continue
        argv.append(tok)
    return argv


def command_line(argv):
    return ' '.join(shlex.quote(a) for a in argv)


def readme_render_line():
    """README's render-mode command line (the one indented `ansible-playbook ... playbooks/render.yml` line)."""
    readme = (REPO / 'README.md').read_text()
    lines = re.findall(r'^ {4}(ansible-playbook [^\n]*playbooks/render\.yml[^\n]*)$', readme, re.M)
    assert len(lines) == 1, 'README.md should print one render-mode line, found %r' % lines
    return lines[0].strip()


def run_as_printed(argv, timeout=900):
    """An ansible-playbook line run as a reader runs it: only what the line says (no vault password from the
    environment), the repo's ansible.cfg."""
    argv = [ansible_bin('ansible-playbook')] + list(argv[1:])
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / 'ansible.cfg'), ANSIBLE_NOCOLOR='1')
    env.pop('ANSIBLE_VAULT_PASSWORD_FILE', None)
    return subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope='session')
def prod_inventory():
    """inventory/prod as Ansible resolves it (ansible-inventory --list, the TEST-ONLY vault password):
    ({group: [hosts]}, {host: vars})."""
    res = subprocess.run([ansible_bin('ansible-inventory'), '-i', str(REPO / 'inventory' / 'prod'), '--list'],
                         cwd=REPO, capture_output=True, text=True, check=True,
                         env=dict(os.environ, ANSIBLE_VAULT_PASSWORD_FILE=str(VAULT_PASS_TEST_ONLY)))
    data = json.loads(res.stdout)
    groups = {g: v.get('hosts', []) for g, v in data.items() if isinstance(v, dict) and g != '_meta'}
    return groups, data['_meta']['hostvars']


@pytest.fixture(scope='session')
def prod_render():
    """inventory/prod rendered by README's render-mode line, run as printed (into the directory it names,
    emptied first): one full render serves the render tests and tests/render/test_readme_commands.py."""
    argv = shlex.split(readme_render_line())
    out = Path(next(a.split('=', 1)[1] for a in argv if a.startswith('render_dir=')))
    shutil.rmtree(out, ignore_errors=True)
    res = run_as_printed(argv)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    return out


@pytest.fixture(scope='session')
def store_render(tmp_path_factory):
    """inventory/prod in store mode, with the seed's older mooncake.json size names as input."""
    out = tmp_path_factory.mktemp('render-store')
    res = render(REPO / 'inventory' / 'prod', out, {
        'vllm_kv_connector': 'MooncakeStoreConnector',
        'vllm_router_implementation': 'vllm-router',  # store mode runs on vllm-router (smg's is not built)
        'vllm_mooncake_store_config': {'cpu_memory_pool_size': '8gb', 'gpu_memory_pool_size': '512MiB'},
    })
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    return out


# Inventory patches (tests/preflight's cases, the render tests' variations): {FILE: {DOTTED.PATH: value}}.
DELETE = '__delete__'


def _set_path(doc, dotted, value):
    """Set (or delete, value __delete__) DOTTED.PATH in doc; integer parts index lists."""
    parts = dotted.split('.')
    node = doc
    for i, part in enumerate(parts[:-1]):
        key = int(part) if isinstance(node, list) else part
        nxt = node[key] if isinstance(node, list) else node.get(key)
        if nxt is None:
            nxt = {}
            node[key] = nxt
        node = nxt
    last = int(parts[-1]) if isinstance(node, list) else parts[-1]
    if value == DELETE:
        del node[last]
    else:
        node[last] = value


def apply_patch(inv, patch):
    for rel, changes in patch.items():
        path = inv / rel
        doc = (yaml.safe_load(path.read_text()) if path.exists() else None) or {}
        for dotted, value in changes.items():
            _set_path(doc, dotted, value)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(doc, sort_keys=False, default_flow_style=False))


def render_manifest(root):
    """'<sha256>  <host>/<path>' for every file of a render, sorted: what byte-identical compares."""
    import hashlib
    lines = []
    for p in sorted(Path(root).rglob('*')):
        if p.is_file():
            lines.append('%s  %s' % (hashlib.sha256(p.read_bytes()).hexdigest(), p.relative_to(root).as_posix()))
    return '\n'.join(lines) + '\n'


# --- skips: printed always, a failure where none is expected ------------------------------------------------
# `make unit` prints every skip with its reason (-rs). CI (CI=true: as root, the project venv, whose requirements.txt
# pins the Mooncake wheel, and scripts/install-deps.sh's haproxy and keepalived) also passes --fail-on-skip (the
# Makefile's unit target): there a skip that EXPECTED_SKIPS does not list fails the run, so a test that silently
# stopped running (root lost, no Mooncake Python, a daemon not installed) cannot pass as "skipped".
# {node id pattern (fnmatch, relative to the repo): text the skip's reason must contain}. None today: every unit and
# integration test runs in CI. Add an entry only for a skip CI cannot avoid, with the reason it gives.
EXPECTED_SKIPS = {}


def pytest_addoption(parser):
    parser.addoption('--fail-on-skip', action='store_true', default=False,
                     help='fail the run on a skip that tests/conftest.py EXPECTED_SKIPS does not list (make unit in CI)')


def unexpected_skips(skips, expected):
    """The (node id, reason) of skips that no entry of expected ({id pattern: reason text}) allows."""
    return [(nid, why) for nid, why in skips
            if not any(fnmatch.fnmatchcase(nid, pat) and text in why for pat, text in expected.items())]


class SkipGate:
    """--fail-on-skip: records every skip (a test's, or a whole module's at collection) and fails the session
    on one that EXPECTED_SKIPS does not allow, listing them."""

    def __init__(self, config):
        self.config, self.skips, self.unexpected = config, [], []

    def _repo_id(self, nodeid):
        path, sep, rest = nodeid.partition('::')
        full = (Path(self.config.rootpath) / path).resolve()
        return (full.relative_to(REPO).as_posix() if full.is_relative_to(REPO) else path) + sep + rest

    def _record(self, report):
        if report.skipped and not hasattr(report, 'wasxfail'):
            why = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
            self.skips.append((self._repo_id(report.nodeid), why))

    def pytest_runtest_logreport(self, report):
        self._record(report)

    def pytest_collectreport(self, report):
        self._record(report)

    def pytest_sessionfinish(self, session):
        self.unexpected = unexpected_skips(self.skips, EXPECTED_SKIPS)
        if self.unexpected and session.exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter):
        if self.unexpected:
            terminalreporter.section('unexpected skips (--fail-on-skip: they fail this run)', red=True)
            for nid, why in self.unexpected:
                terminalreporter.line('SKIPPED %s: %s' % (nid, why), red=True)
            terminalreporter.line('A test that should run here did not. Make it run (root, the project venv, '
                                  'scripts/install-deps.sh), or list it in tests/conftest.py EXPECTED_SKIPS with why.')


def pytest_configure(config):
    if config.getoption('--fail-on-skip', default=False):
        config.pluginmanager.register(SkipGate(config), 'pd-skip-gate')
