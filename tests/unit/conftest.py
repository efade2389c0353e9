"""The repo's module_utils under the name Ansible gives them (ansible.cfg: module_utils = ./plugins/module_utils).

Ansible ships plugins/module_utils/<name>.py inside each module's payload as ansible.module_utils.<name>; the
unit tests load plugins/modules/*.py straight from their files, so the same names are registered here, before
any test module is collected, for `from ansible.module_utils.sysfs import ...` to find."""

import importlib.util
import sys
from pathlib import Path

MODULE_UTILS = Path(__file__).resolve().parents[2] / 'plugins' / 'module_utils'


def _register_module_utils():
    for path in sorted(MODULE_UTILS.glob('*.py')):
        name = 'ansible.module_utils.%s' % path.stem
        if name in sys.modules:
            continue
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)


_register_module_utils()


TOOLS = Path(__file__).resolve().parents[2] / 'plugins' / 'tools'


def load_patch(name):
    """plugins/tools/<name>.py as sitecustomize.py runs it: pd_bundle_import_hook.py's names (the import hook,
    refuse_patch, vllm_version) defined above it."""
    hook_spec = importlib.util.spec_from_file_location('pd_bundle_import_hook', TOOLS / 'pd_bundle_import_hook.py')
    hook = importlib.util.module_from_spec(hook_spec)
    hook_spec.loader.exec_module(hook)
    spec = importlib.util.spec_from_file_location(name, TOOLS / ('%s.py' % name))
    mod = importlib.util.module_from_spec(spec)
    for shared in ('patch_on_import', 'refuse_patch', 'vllm_version', 'env_seconds'):
        setattr(mod, shared, getattr(hook, shared))
    spec.loader.exec_module(mod)
    return mod
