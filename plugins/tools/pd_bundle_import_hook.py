"""Patch a vLLM module right after Python imports it: the one import hook of the bundle's vLLM patches
(pd_bundle_side_channel.py, pd_bundle_store_wait.py). sitecustomize.py runs before vLLM is imported and
must not import vLLM itself (torch at every Python start, the API server's included)."""
import importlib.util
import sys


class PatchOnImport:
    """A meta-path finder: when module `name` is imported, its real loader runs, then patch(module). Once."""

    def __init__(self, name, patch):
        self.name, self.patch = name, patch

    def find_spec(self, name, path=None, target=None):
        if name != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        run, patch = spec.loader.exec_module, self.patch

        def exec_module(module):
            run(module)
            patch(module)

        spec.loader.exec_module = exec_module
        return spec


def patch_on_import(name, patch):
    """Install the hook for module name; returns the finder."""
    finder = PatchOnImport(name, patch)
    sys.meta_path.insert(0, finder)
    return finder
