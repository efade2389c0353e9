"""plugins/callback/pd_bundle_speedups.py: modules ship with their bytecode, which Python uses when it can, and
ignores (compiling the source, as without the hook) when it cannot."""
import importlib.util
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location('pd_bundle_speedups', REPO / 'plugins' / 'callback' / 'pd_bundle_speedups.py')
sp = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sp)


def _zip_with(tmp_path, name, source, pyc=None):
    path = tmp_path / ('%s.zip' % name)
    with zipfile.ZipFile(path, 'w') as zf:
        if pyc is None:
            zf.writestr = sp._with_bytecode(zf.writestr)
            zf.writestr(zipfile.ZipInfo('%s.py' % name, (2020, 1, 1, 0, 0, 0)), source)
        else:
            zf.writestr(zipfile.ZipInfo('%s.py' % name, (2020, 1, 1, 0, 0, 0)), source)
            zf.writestr(zipfile.ZipInfo('%s.pyc' % name, (2020, 1, 1, 0, 0, 0)), pyc)
    return path


def _import_from(path, name):
    sys.path.insert(0, str(path))
    try:
        sys.modules.pop(name, None)
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(path))
        sys.modules.pop(name, None)
        importlib.invalidate_caches()


def test_every_source_gets_its_bytecode(tmp_path):
    path = _zip_with(tmp_path, 'pdmod_a', b'VALUE = 1\n')
    assert sorted(zipfile.ZipFile(path).namelist()) == ['pdmod_a.py', 'pdmod_a.pyc']
    assert _import_from(path, 'pdmod_a').VALUE == 1


def test_python_loads_the_bytecode(tmp_path):
    """A .pyc carrying the source's hash but other code: what Python runs is the .pyc's."""
    source = b'VALUE = 1\n'
    forged = sp.pyc_of(b'VALUE = 2\n', 'pdmod_b.py')
    forged = forged[:8] + importlib.util.source_hash(source) + forged[16:]
    assert _import_from(_zip_with(tmp_path, 'pdmod_b', source, forged), 'pdmod_b').VALUE == 2


@pytest.mark.parametrize('case', ['other python', 'stale'])
def test_unusable_bytecode_falls_back_to_the_source(tmp_path, case):
    source = b'VALUE = 1\n'
    pyc = sp.pyc_of(b'VALUE = 2\n', 'pdmod_c.py')
    if case == 'other python':  # another magic number, hash matching the source
        pyc = b'\x00\x00\r\n' + pyc[4:8] + importlib.util.source_hash(source) + pyc[16:]
    # stale: the hash of another source (VALUE = 2): Python checks it and compiles the source
    assert _import_from(_zip_with(tmp_path, 'pdmod_c', source, pyc), 'pdmod_c').VALUE == 1


def _payload_names(module):
    """The file names in the AnsiballZ zip ansible-core builds for an ansible.builtin module."""
    import base64
    import io
    import re
    from ansible.executor import module_common
    from ansible.parsing.dataloader import DataLoader
    from ansible.plugins.loader import init_plugin_loader
    from ansible.template import Templar
    init_plugin_loader()
    path = importlib.import_module('ansible.modules.%s' % module).__file__
    built = module_common.modify_module(module_name=module, module_path=path, module_args={},
                                        templar=Templar(loader=DataLoader()),
                                        task_vars={'ansible_python_interpreter': '/usr/bin/python3'})
    zip_b64 = max(re.findall(rb'[A-Za-z0-9+/=]{2000,}', built.b_module_data), key=len)
    return zipfile.ZipFile(io.BytesIO(base64.b64decode(zip_b64))).namelist()


def test_ansible_s_module_payload_carries_the_bytecode():
    """Through ansible-core's own builder: with the hook, every source of a module's payload has its .pyc (an
    ansible-core that renamed or reshaped what the hook wraps fails here instead of silently losing the speed)."""
    from ansible.executor import module_common
    assert callable(module_common.recursive_finder) and callable(module_common._add_module_to_zip)
    sp.install_module_bytecode()
    assert getattr(module_common.recursive_finder, 'pd_bundle_speedups', False)
    names = _payload_names('ping')
    sources = {n for n in names if n.endswith('.py')}
    assert 'ansible/module_utils/basic.py' in sources and 'ansible/modules/ping.py' in sources
    assert {n for n in names if n.endswith('.pyc')} == {n + 'c' for n in sources}


def test_the_heap_is_frozen_before_workers_fork_and_garbage_is_not_kept():
    """4. What the controller holds is frozen (the workers' collector never scans it); an unreachable cycle made
    before is collected first, not frozen with the rest."""
    import gc
    import weakref

    class Node:
        pass
    a, b = Node(), Node()
    a.other, b.other = b, a
    gone = weakref.ref(a)
    del a, b
    try:
        sp.freeze_heap()
        assert gc.get_freeze_count() > 0 and gone() is None
    finally:
        gc.unfreeze()
