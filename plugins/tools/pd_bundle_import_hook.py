"""Patch a module right after Python imports it: the one import hook of the bundle's vLLM and Mooncake patches
(the pd_bundle_*.py beside it), and the one way each refuses to start where it does not fit (refuse_patch).
sitecustomize.py runs before vLLM is imported and must not import vLLM itself (torch at every Python start, the
API server's included)."""
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


def vllm_version():
    """'vLLM <version>' of the vLLM this process imported ('unknown' before it did)."""
    return "vLLM %s" % getattr(sys.modules.get("vllm"), "__version__", "unknown")


def env_seconds(environ, name):
    """A millisecond setting of the environment (a patch's switch and bound) in seconds; 0 when off or malformed."""
    try:
        return max(int(environ.get(name, "0")), 0) / 1000.0
    except ValueError:
        return 0.0


def refuse_patch(patch, subject, what, fix, why=""):
    """The engine does not start: one line (stderr: the unit's journal) naming the patch, what it does not fit
    (subject, e.g. vllm_version()) and why, and the way out; then the exception."""
    msg = "pd-bundle: patch %s does not fit %s: %s.%s Fix: %s, or adapt plugins/tools/%s.py." % (
        patch, subject, what, " " + why if why else "", fix, patch)
    print(msg, file=sys.stderr, flush=True)
    raise RuntimeError(msg)


def patch_on_import(name, patch):
    """Install the hook for module name; returns the finder."""
    finder = PatchOnImport(name, patch)
    sys.meta_path.insert(0, finder)
    return finder
