"""plugins/tools/pd_bundle_store_wait.py: decode retries a store lookup while the prompt's whole
blocks are still being put by prefill, for a bounded time."""
import importlib
import re
import sys
import types

import pytest

from conftest import load_patch

sw = load_patch("pd_bundle_store_wait")
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


def patched_module(tmp_path, monkeypatch, source, wait=1.0):
    """A fake scheduler module (source) imported through the bundle's import hook with the wait's patch."""
    name = "fakesched_%s" % tmp_path.name.replace("-", "_")
    (tmp_path / ("%s.py" % name)).write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    finder = sw.patch_on_import(name, sw.patch_scheduler(wait))
    try:
        return importlib.import_module(name)
    finally:
        if finder in sys.meta_path:
            sys.meta_path.remove(finder)
        sys.modules.pop(name, None)


# vLLM 0.32's MooncakeStoreScheduler in miniature: the two attributes the wait reads are made in __init__.
SCHEDULER = (
    "class MooncakeStoreScheduler:\n"
    "    def __init__(self, vllm_config, kv_cache_config):\n"
    "        self.{block} = {size}\n"
    "        self.load_specs = {specs}\n"
    "    def get_num_new_matched_tokens(self, request, n):\n"
    "        return 0, False\n")


def test_patches_the_scheduler_class_on_import(tmp_path, monkeypatch, capsys):
    mod = patched_module(tmp_path, monkeypatch, SCHEDULER.format(block="_block_size", size=128, specs="{}"))
    assert mod.MooncakeStoreScheduler.get_num_new_matched_tokens.__name__ == "get_num_new_matched_tokens"
    s = mod.MooncakeStoreScheduler(None, None)
    # the scheduler says, in its unit's journal, that its lookups wait (tests/infra/test_e2e.py looks for this)
    assert "%s: a lookup that finds fewer than the prompt's whole blocks (128 tokens each) is retried for up to " \
        "1000 ms" % sw.ACTIVE in capsys.readouterr().err
    assert s.get_num_new_matched_tokens(req(), 0) == (None, False)  # wrapped: waits for the blocks


def test_a_renamed_block_size_refuses_to_start_instead_of_waiting_for_0_blocks(tmp_path, monkeypatch, capsys):
    """Another vLLM whose scheduler calls the block size otherwise: the wait would compute 0 whole blocks and
    never wait. The scheduler refuses to be made (the engine, and its unit, fail), naming the attribute and the
    way out; it never says the wait is active."""
    mod = patched_module(tmp_path, monkeypatch, SCHEDULER.format(block="_kv_block_size", size=128, specs="{}"))
    with pytest.raises(RuntimeError) as err:
        mod.MooncakeStoreScheduler(None, None)
    msg = str(err.value)
    assert "MooncakeStoreScheduler has no usable _block_size (missing)" in msg and "PD_BUNDLE_STORE_LOOKUP_WAIT_MS=1000" in msg
    assert "vllm_store_lookup_wait_ms: 0" in msg
    assert sw.ACTIVE not in capsys.readouterr().err


@pytest.mark.parametrize("size, specs, named", [(128, "[]", "load_specs (list)"), (0, "{}", "_block_size (0)"),
                                                ("None", "{}", "_block_size (NoneType)")])
def test_attributes_of_another_kind_refuse_to_start(tmp_path, monkeypatch, size, specs, named):
    mod = patched_module(tmp_path, monkeypatch, SCHEDULER.format(block="_block_size", size=size, specs=specs))
    with pytest.raises(RuntimeError, match=r"no usable %s" % re.escape(named)):
        mod.MooncakeStoreScheduler(None, None)


def test_a_scheduler_module_without_the_lookup_fails_its_import(tmp_path, monkeypatch):
    with pytest.raises(RuntimeError, match="has no MooncakeStoreScheduler.get_num_new_matched_tokens"):
        patched_module(tmp_path, monkeypatch, "class MooncakeStoreScheduler:\n    pass\n")
