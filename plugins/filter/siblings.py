"""The one loader of plugins/filter files by path, for the filter files that use each other and for the lab scripts.

Filter plugins are not a package: Ansible loads each file of this directory by path under a private name, so a
plain `import bundle` does not reach a sibling. Every reader loads this file the same way, with the standard
library (no loader of its own):

    _load = runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)), 'siblings.py'))['load']
    _bundle = _load('bundle')

Each call executes the file afresh (a new module, not put in sys.modules); callers that want one copy keep it.
"""
import importlib.util
import os

FILTER_DIR = os.path.dirname(os.path.abspath(__file__))


def load(name, directory=FILTER_DIR):
    """DIRECTORY/NAME.py (default: this plugins/filter) as a fresh module named _pd_bundle_filter_NAME."""
    spec = importlib.util.spec_from_file_location('_pd_bundle_filter_' + name, os.path.join(str(directory), name + '.py'))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class FilterModule(object):
    """No filters (Ansible loads every file of the filter directory as a filter plugin)."""

    def filters(self):
        return {}
