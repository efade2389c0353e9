# Speed only: no task, result or file changes. Two costs of ansible-core 2.19 that every run of the bundle
# paid again and again, each paid once per run here. Both hooks run in the controller when a playbook starts,
# before Ansible forks its workers, which inherit them.
#
# 1. Filter plugins loaded once. The first time a template names a filter that is not Jinja's own, Ansible
#    reads every filter and test plugin file (Jinja2Loader._ensure_non_collection_wrappers) and caches them
#    per process. The controller never did that before forking, so every worker (one per host and task)
#    loaded the bundle's and Ansible's filter files again: a quarter of render mode's CPU time.
# 2. Module code compiled once. A module runs on the host from a zip of its Python sources (AnsiballZ), and
#    Python compiles every source in a zip at each import: about half a CPU second per task on a host, mostly
#    ansible.module_utils.basic. The zip gets each source's bytecode beside it (a hash-checked .pyc, which
#    Python's zipimport validates against the source and prefers). A host whose Python is another version
#    rejects the .pyc (its magic number) and compiles the source, as before.
# 3. A filter file's once-per-process setup (pd_bundle_warm: the roles' defaults parsed) done in the controller.
# 4. Fewer memory pages copied into each worker. A worker is a fork of the controller; Python's garbage collector
#    in it writes to the header of every object it scans, so the kernel copies most of the controller's heap into
#    every worker (one per host and task). Before each task the controller collects its garbage and freezes what
#    is left (gc.freeze: the collector never scans those objects again, in the controller or a worker). Python's
#    documentation recommends this for programs that fork without exec. Garbage is collected first, so nothing
#    that was already unreachable is kept.
import datetime
import gc
import importlib
import importlib.util
import marshal
import sys
import zipfile
from pathlib import Path

import yaml

from ansible.executor import module_common
from ansible.plugins.callback import CallbackBase
from ansible.plugins.loader import filter_loader, test_loader

DOCUMENTATION = """
name: pd_bundle_speedups
type: aggregate
short_description: load filter plugins once and ship modules with their bytecode (speed only)
description:
  - Runs when a playbook starts, in the controller. Prints nothing.
"""


def pyc_of(source, filename):
    """A hash-checked .pyc of SOURCE (bytes), as importlib writes it for --invalidation-mode checked-hash."""
    code = compile(source, filename, 'exec', dont_inherit=True)
    flags = 0b11  # hash-based, check the source
    return (importlib.util.MAGIC_NUMBER + flags.to_bytes(4, 'little')
            + importlib.util.source_hash(source) + marshal.dumps(code))


def _with_bytecode(write):
    """zf.writestr that also writes NAME.pyc for every NAME.py."""
    def writestr(zinfo, data, *args, **kwargs):
        write(zinfo, data, *args, **kwargs)
        name = getattr(zinfo, 'filename', zinfo)
        if not str(name).endswith('.py'):
            return
        source = data if isinstance(data, bytes) else str(data).encode('utf-8')
        try:
            pyc = pyc_of(source, str(name))
        except (SyntaxError, ValueError):  # left to the host's Python, as without this hook
            return
        info = module_common._make_zinfo(str(name) + 'c', datetime.datetime(*zinfo.date_time), zf=None)
        info.compress_type = getattr(zinfo, 'compress_type', info.compress_type)
        write(info, pyc, *args, **kwargs)
    return writestr


def _patch(fn):
    """fn(..., zf, ...) with zf.writestr adding bytecode while fn runs (recursive_finder and _add_module_to_zip
    take the payload's ZipFile); a call without one runs fn as it is."""
    def wrapper(*args, **kwargs):
        zf = next((a for a in (*args, *kwargs.values()) if isinstance(a, zipfile.ZipFile)), None)
        if zf is None:
            return fn(*args, **kwargs)
        zf.writestr = _with_bytecode(zf.writestr)
        try:
            return fn(*args, **kwargs)
        finally:
            del zf.writestr  # the class's method again (a bound copy left on the instance would be a cycle)
    wrapper.pd_bundle_speedups = True
    return wrapper


def install_module_bytecode():
    for attr in ('recursive_finder', '_add_module_to_zip'):
        fn = getattr(module_common, attr, None)
        if fn is not None and not getattr(fn, 'pd_bundle_speedups', False):
            setattr(module_common, attr, _patch(fn))


def freeze_heap():
    """4. The controller's garbage collected, the rest frozen, before the next workers fork."""
    gc.collect()
    gc.freeze()


_WARMED = set()


def warm_module(module):
    """3. A filter file's own once-per-process work (its pd_bundle_warm(): bundle.py parses the roles' defaults)
    done here, once, instead of in each worker."""
    warm = getattr(module, 'pd_bundle_warm', None)
    if callable(warm) and id(module) not in _WARMED:
        _WARMED.add(id(module))
        warm()


def warm_module_of(plugin):
    """warm_module for the file a loaded filter or test plugin comes from."""
    warm_module(sys.modules.get(getattr(getattr(plugin, 'j2_function', None), '__module__', None) or ''))


def bundle_collection():
    """NAMESPACE.NAME of the collection this file belongs to: from its path in an installed collection
    (.../ansible_collections/NS/NAME/plugins/callback/), else from the clone's galaxy.yml."""
    parts = Path(__file__).parts
    if len(parts) > 6 and parts[-6] == 'ansible_collections':
        return '%s.%s' % (parts[-5], parts[-4])
    meta = yaml.safe_load((Path(__file__).resolve().parents[2] / 'galaxy.yml').read_text())
    return '%s.%s' % (meta['namespace'], meta['name'])


def import_collection_filters():
    """1 and 3 for the bundle's own filters (the collection's, which the templates name by FQCN and loader.all()
    does not list): each file imported under the module name Ansible's loader gives it, so a worker finds it in
    sys.modules instead of executing it again."""
    package = 'ansible_collections.%s.plugins.filter' % bundle_collection()
    for path in sorted((Path(__file__).resolve().parents[1] / 'filter').glob('*.py')):
        if path.stem == '__init__':
            continue
        warm_module(importlib.import_module('%s.%s' % (package, path.stem)))


def _private_core():
    """plugins/plugin_utils/private_core.py, the gate of every private ansible-core use: the module bundle_template
    imports (this file is loaded from callback_plugins by path; the collection is importable once a playbook runs)."""
    return importlib.import_module('ansible_collections.%s.plugins.plugin_utils.private_core' % bundle_collection())


def speedups_on(warn):
    return _private_core().speedups_on(warn)


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = 'aggregate'
    CALLBACK_NAME = 'pd_bundle_speedups'
    # On for every run that reads the repo's callback_plugins path (ansible.cfg, the molecule envs).
    CALLBACK_NEEDS_ENABLED = False

    def v2_playbook_on_start(self, playbook):
        if speedups_on(self._display.warning):
            self.install()
        freeze_heap()  # 4: Python's own gc API, no private ansible-core interface

    @staticmethod
    def install():
        """1-3: on private ansible-core interfaces (plugins/plugin_utils/private_core.py lists them)."""
        for loader in (filter_loader, test_loader):
            for plugin in loader.all():  # fills the loader's cache of non-collection plugins
                warm_module_of(plugin)
        import_collection_filters()
        install_module_bytecode()

    def v2_playbook_on_task_start(self, task, is_conditional):
        freeze_heap()

    def v2_playbook_on_handler_task_start(self, task):
        freeze_heap()
