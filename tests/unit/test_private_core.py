"""plugins/plugin_utils/private_core.py: every private ansible-core attribute the bundle touches is listed there and
gated; the gate turns the speed-ups off (one line saying why) on an untested series, a missing attribute, or
PD_BUNDLE_SPEEDUPS=off."""
import ast
import importlib.util
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location('private_core_under_test', REPO / 'plugins' / 'plugin_utils' / 'private_core.py')
pc = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pc)

# The ansible-core side of the bundle (plugins/tools patch vLLM and Mooncake: docs/upgrading.md, their own gate).
SCANNED = ['action', 'callback', 'filter', 'modules', 'module_utils', 'plugin_utils']
PRIVATE_NAME = re.compile(r'^_[A-Za-z][A-Za-z0-9_]*$')
# Strings that look private but name no attribute: the copy module's own argument, which the copy action sends.
NOT_ATTRIBUTES = {'_original_basename'}


def _private(name):
    return bool(PRIVATE_NAME.match(name)) and not name.endswith('__')


def _strings(node):
    """The private-looking string constants in NODE (a name, or a tuple or list of them)."""
    items = node.elts if isinstance(node, (ast.Tuple, ast.List)) else [node]
    return {i.value for i in items if isinstance(i, ast.Constant) and isinstance(i.value, str) and _private(i.value)}


def defined(source):
    """The private names a file defines at module level (functions, classes, globals): the bundle's own, which the
    other files may reach into (a sibling's helper)."""
    own = set()
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            own.add(node.name)
        elif isinstance(node, ast.Assign):
            own.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return own


def touched(source, ansible_names, bundle_own=frozenset()):
    """Private names SOURCE touches on objects it did not define: attributes read or called, methods overridden in a
    subclass of an ansible-core class, and attribute names given as strings (getattr, a class dict). BUNDLE_OWN: the
    names the bundle's other files define."""
    tree = ast.parse(source)
    own, used = set(bundle_own), set()
    for node in tree.body:  # the module's own functions, classes and globals
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            own.add(node.name)
        elif isinstance(node, ast.Assign):
            own.update(t.id for t in node.targets if isinstance(t, ast.Name))
    for cls in [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]:
        of_ansible = any(isinstance(b, ast.Name) and b.id in ansible_names for b in cls.bases)
        for item in cls.body:
            if isinstance(item, ast.FunctionDef) and _private(item.name):
                (used if of_ansible else own).add(item.name)
        if not of_ansible:  # attributes a class of our own sets on itself
            for n in ast.walk(cls):
                if isinstance(n, ast.Assign):
                    own.update(t.attr for t in n.targets if isinstance(t, ast.Attribute))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            used.add(node.attr)
        elif isinstance(node, ast.Call):  # names as strings: getattr(obj, '_x'), type(name, bases, {'_x': ...})
            fn = getattr(node.func, 'id', None)
            if fn in ('getattr', 'setattr', 'hasattr', 'delattr') and len(node.args) > 1:
                used.update(_strings(node.args[1]))
            elif fn == 'type' and len(node.args) == 3 and isinstance(node.args[2], ast.Dict):
                used.update(v for k in node.args[2].keys for v in _strings(k))
        elif isinstance(node, ast.For) and any(isinstance(c, ast.Call) and getattr(c.func, 'id', None) in (
                'getattr', 'setattr', 'hasattr') for c in ast.walk(node)):
            used.update(_strings(node.iter))  # for attr in ('a', '_b'): getattr(obj, attr)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            used.update(a.name for a in node.names if _private(a.name.split('.')[-1]))
    return {n for n in used - own - NOT_ATTRIBUTES - pc.ACTION_PLUGIN_API if not n.startswith('_pd')}


def ansible_imports(source):
    """Names a file imports from ansible (its base classes among them)."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or '').startswith('ansible'):
            names.update(a.asname or a.name for a in node.names)
    return names


def bundle_touches():
    files = [p for sub in SCANNED for p in sorted((REPO / 'plugins' / sub).rglob('*.py'))]  # packages too
    bundle_own = set().union(*(defined(p.read_text()) for p in files))
    found = {}
    for path in files:
        src = path.read_text()
        for name in touched(src, ansible_imports(src), bundle_own):
                found.setdefault(name, []).append(str(path.relative_to(REPO)))
    return found


def listed():
    return {path.split('.')[-1] for _, path in pc.PRIVATE}


def test_every_private_attribute_the_bundle_touches_is_listed():
    found = bundle_touches()
    unlisted = {n: where for n, where in found.items() if n not in listed()}
    assert not unlisted, ('private ansible-core attributes touched but not in plugins/plugin_utils/private_core.py '
                          'PRIVATE (list and gate them, or use a public interface): %s' % unlisted)


def test_no_stale_entry():
    stale = {n for n in listed() if _private(n)} - set(bundle_touches())
    assert not stale, 'PRIVATE lists %s, which nothing in plugins/ touches any more' % sorted(stale)


def test_the_scan_reads_the_packages_of_plugins():
    """plugins/plugin_utils/preflight/ (the preflight checks, a package) is scanned, every module of it."""
    package = REPO / 'plugins' / 'plugin_utils' / 'preflight'
    scanned = {p for sub in SCANNED for p in (REPO / 'plugins' / sub).rglob('*.py')}
    assert len(list(package.glob('*.py'))) >= 12 and set(package.glob('*.py')) <= scanned


def test_the_scan_sees_a_new_private_use():
    src = ('from ansible.plugins.action import ActionBase\n'
           'class A(ActionBase):\n'
           '    def _fixup_perms2(self, paths):\n'
           '        return self._low_level_execute_command("true")\n'
           'x = getattr(A, "_remove_tmp_path")\n')
    assert touched(src, ansible_imports(src)) == {'_fixup_perms2', '_low_level_execute_command', '_remove_tmp_path'}


def test_every_listed_interface_resolves_on_this_ansible_core():
    assert pc.missing() == []


@pytest.fixture()
def fresh(monkeypatch):
    monkeypatch.delenv('PD_BUNDLE_SPEEDUPS', raising=False)
    monkeypatch.setattr(pc, '_STATE', {})
    return monkeypatch


def test_on_where_tested(fresh):
    lines = []
    assert pc.speedups_on(lines.append) and lines == []


def test_off_on_an_untested_series_with_one_line(fresh):
    fresh.setattr(pc, 'core_series', lambda: (2, 99))
    lines = []
    assert not pc.speedups_on(lines.append) and not pc.speedups_on(lines.append)
    assert len(lines) == 1 and 'ansible-core 2.99' in lines[0] and 'stock speed' in lines[0]


def test_off_when_a_listed_attribute_is_gone(fresh):
    fresh.setattr(pc, 'PRIVATE', dict(pc.PRIVATE, **{}) | {('ansible.plugins.action', 'ActionBase._gone_in_2_21'): 'x'})
    lines = []
    assert not pc.speedups_on(lines.append)
    assert 'ansible.plugins.action.ActionBase._gone_in_2_21' in lines[0]


def test_off_by_setting(fresh):
    fresh.setenv('PD_BUNDLE_SPEEDUPS', 'off')
    lines = []
    assert not pc.speedups_on(lines.append) and 'PD_BUNDLE_SPEEDUPS' in lines[0]
