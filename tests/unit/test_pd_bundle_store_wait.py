"""plugins/tools/pd_bundle_store_wait.py: decode retries a store lookup while the prompt's whole
blocks are still being put by prefill, for a bounded time."""
import importlib.util
import sys
import types
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "plugins" / "tools" / "pd_bundle_store_wait.py"
spec = importlib.util.spec_from_file_location("pd_bundle_store_wait", SRC)
sw = importlib.util.module_from_spec(spec)
_hook_spec = importlib.util.spec_from_file_location("pd_bundle_import_hook", SRC.parent / "pd_bundle_import_hook.py")
_hook = importlib.util.module_from_spec(_hook_spec)
_hook_spec.loader.exec_module(_hook)
sw.patch_on_import = _hook.patch_on_import  # sitecustomize.py concatenates the hook above the module
spec.loader.exec_module(sw)
sys.meta_path[:] = [f for f in sys.meta_path if type(f).__name__ != "PatchOnImport"]


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


class Sched:
    """A named fake of MooncakeStoreScheduler: answers the hits it is told, records load specs."""
    _block_size = 128

    def __init__(self, hits):
        self.hits, self.load_specs = list(hits), {}

    def lookup(self, request, num_computed_tokens):
        hit = self.hits.pop(0)
        if hit > num_computed_tokens:
            self.load_specs[request.request_id] = hit
        return max(hit - num_computed_tokens, 0), True


def req(n=1426, rid="r1"):
    return types.SimpleNamespace(num_tokens=n, request_id=rid)


def test_waits_for_the_full_blocks_then_loads_them():
    clock = Clock()
    s = Sched([0, 0, 1408])
    f = sw.wrap_lookup(Sched.lookup, 1.0, clock)
    assert f(s, req(), 0) == (None, False)  # the put has not landed: retry later
    clock.t = 0.05
    assert f(s, req(), 0) == (None, False)
    clock.t = 0.1
    assert f(s, req(), 0) == (1408, True)  # all 11 blocks found
    assert s.load_specs == {"r1": 1408}


def test_gives_up_after_the_wait_with_what_was_found():
    clock = Clock()
    s = Sched([256, 256])
    f = sw.wrap_lookup(Sched.lookup, 1.0, clock)
    assert f(s, req(), 0) == (None, False)
    assert s.load_specs == {}  # the partial hit's spec is dropped; the retry makes it again
    clock.t = 1.5
    assert f(s, req(), 0) == (256, True)


def test_no_wait_below_one_block_when_local_cache_covers_it_or_off():
    clock = Clock()
    f = sw.wrap_lookup(Sched.lookup, 1.0, clock)
    assert f(Sched([0]), req(n=100), 0) == (0, True)  # under one block: nothing is ever stored
    assert f(Sched([0]), req(), 1408) == (0, True)  # decode's own prefix cache has every block
    assert sw.store_wait_seconds({}) == 0 and sw.store_wait_seconds({sw.WAIT_ENV: "x"}) == 0
    assert sw.store_wait_seconds({sw.WAIT_ENV: "1000"}) == 1.0
    assert sw.install_store_wait({}) is False


def test_patches_the_scheduler_class_on_import(tmp_path, monkeypatch):
    pkg = tmp_path / "fakepkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "sched.py").write_text(
        "class MooncakeStoreScheduler:\n"
        "    def get_num_new_matched_tokens(self, request, n):\n"
        "        return 0, False\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    finder = sw.patch_on_import("fakepkg.sched", sw.patch_scheduler(1.0))
    try:
        import fakepkg.sched as mod  # noqa: PLC0415
    finally:
        if finder in sys.meta_path:
            sys.meta_path.remove(finder)
    assert mod.MooncakeStoreScheduler.get_num_new_matched_tokens.__name__ == "get_num_new_matched_tokens"
    s = mod.MooncakeStoreScheduler()
    s._block_size = 128
    assert s.get_num_new_matched_tokens(req(), 0) == (None, False)  # wrapped: waits for the blocks
