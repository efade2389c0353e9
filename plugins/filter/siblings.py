"""The one loader of plugins/filter files by path, for the filter files that use each other and for the lab scripts.

Filter plugins are not a package: Ansible loads each file of this directory by path under a private name, so a
plain `import bundle` does not reach a sibling. Every reader loads this file the same way, with the standard
library (no loader of its own):

    _load = runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)), 'siblings.py'))['load']
    _bundle = _load('bundle')

Each call executes the file afresh (a new module, not put in sys.modules); callers that want one copy keep it.
A filter file may import the collection's own code by its fully qualified name (preflight_checks.py:
ansible_collections.pd_bundle.serving.plugins.plugin_utils.preflight): Ansible's collection loader finds it in a
run; outside one (the lab scripts), load puts the collections root of this file on sys.path first.
"""
import importlib.util
import os
import sys

FILTER_DIR = os.path.dirname(os.path.abspath(__file__))


def collections_root(filter_dir=FILTER_DIR):
    """The directory that holds ansible_collections/NAMESPACE/NAME for the collection of filter_dir: in an installed
    collection (.../ansible_collections/NS/NAME/plugins/filter) the one above ansible_collections, in a clone
    <repo>/collections (its ansible_collections/pd_bundle/serving links to the clone)."""
    parts = os.path.abspath(str(filter_dir)).split(os.sep)
    if len(parts) > 5 and parts[-5] == 'ansible_collections':
        return os.sep.join(parts[:-5])
    return os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(str(filter_dir)))), 'collections')


def load(name, directory=FILTER_DIR):
    """DIRECTORY/NAME.py (default: this plugins/filter) as a fresh module named _pd_bundle_filter_NAME."""
    root = collections_root()
    if root not in sys.path:
        sys.path.insert(0, root)
    spec = importlib.util.spec_from_file_location('_pd_bundle_filter_' + name, os.path.join(str(directory), name + '.py'))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class FilterModule(object):
    """No filters (Ansible loads every file of the filter directory as a filter plugin)."""

    def filters(self):
        return {}
