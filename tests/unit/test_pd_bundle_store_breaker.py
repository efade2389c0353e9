"""The store tier fails open: a store client whose calls answer RPC_FAIL, raise or hang opens the breaker; while open
every data call answers at once as Mooncake does with no master; a probe closes it when the store answers again; a
mooncake.store that lacks what the breaker wraps refuses to start."""
import threading
import time
import types

import pytest

from conftest import load_patch

sb = load_patch("pd_bundle_store_breaker")


class FakeStore:
    """Mooncake's MooncakeDistributedStore as the breaker sees it: up, down (RPC_FAIL after a while), or hung."""

    def __init__(self):
        self.mode, self.calls, self.hang = "up", [], threading.Event()

    def setup(self, *args):
        return 0

    def batch_is_exist(self, keys):
        self.calls.append(("batch_is_exist", list(keys)))
        if self.mode == "hung":
            self.hang.wait(5)
        if self.mode != "up":
            return [sb.RPC_FAIL] * len(keys)
        return [1 if k.startswith("hit") else 0 for k in keys]

    def batch_put_from_multi_buffers(self, keys, addrs, sizes, config=None):
        self.calls.append(("put", list(keys)))
        if self.mode == "raise":
            raise RuntimeError("connection reset")
        return [sb.RPC_FAIL if self.mode != "up" else 0 for _ in keys]

    def batch_get_into_multi_buffers(self, keys, addrs, sizes):
        self.calls.append(("get", list(keys)))
        return [sb.RPC_FAIL if self.mode != "up" else 16 for _ in keys]


def store(bound=0.2):
    lines = []
    real = FakeStore()
    s = sb.FailOpenStore(real, bound, log=lines.append, interval=0.01)
    return s, real, lines


def test_closed_breaker_passes_calls_and_answers_through():
    s, real, lines = store()
    assert s.setup("h") == 0
    assert s.batch_is_exist(["hit-1", "miss-2"]) == [1, 0]
    assert s.batch_put_from_multi_buffers(["a"], [0], [1]) == [0]
    assert not s._pd_breaker.is_open and lines == []


def test_rpc_fail_opens_then_calls_answer_at_once_in_their_own_shape():
    s, real, lines = store()
    real.mode = "down"
    s._pd_breaker.probe = lambda: None  # no probe: the state stays open for the assertions
    assert s.batch_is_exist(["hit-1", "x"]) == [sb.RPC_FAIL, sb.RPC_FAIL]
    assert s._pd_breaker.is_open and lines[0].startswith(sb.BREAKER_OPEN)
    real.calls.clear()
    assert s.batch_is_exist(["a", "b", "c"]) == [sb.RPC_FAIL] * 3
    assert s.batch_put_from_multi_buffers(["a", "b"], [0, 0], [1, 1]) == [sb.RPC_FAIL] * 2
    assert s.batch_get_into_multi_buffers(["a"], [0], [1]) == [sb.RPC_FAIL]
    assert real.calls == [], "an open breaker must not call the store"
    assert len(lines) == 1, "one line per change of state, not per call"


def test_a_hung_lookup_is_answered_as_a_miss_within_the_bound():
    s, real, lines = store(bound=0.2)
    s._pd_breaker.probe = lambda: None
    real.mode = "hung"
    t = time.monotonic()
    assert s.batch_is_exist(["hit-1"]) == [sb.RPC_FAIL]
    assert time.monotonic() - t < 1.0
    assert s._pd_breaker.is_open and "did not answer within 200 ms" in lines[0]
    real.hang.set()


def test_a_put_that_raises_opens_and_still_raises_to_vllm():
    s, real, lines = store()
    s._pd_breaker.probe = lambda: None
    real.mode = "raise"
    with pytest.raises(RuntimeError):
        s.batch_put_from_multi_buffers(["a"], [0], [1])
    assert s._pd_breaker.is_open


def test_a_lookup_miss_or_a_failed_put_of_an_answering_store_does_not_open():
    s, real, lines = store()
    assert s.batch_is_exist(["miss"]) == [0]
    real.batch_put_from_multi_buffers = lambda keys, *a: [-200] * len(keys)  # e.g. no space: the store answered
    assert s.batch_put_from_multi_buffers(["a"], [0], [1]) == [-200]
    assert not s._pd_breaker.is_open


def test_the_probe_closes_the_breaker_when_the_store_answers_again():
    s, real, lines = store()
    real.mode = "down"
    s.batch_is_exist(["a"])
    assert s._pd_breaker.is_open
    time.sleep(0.1)
    assert s._pd_breaker.is_open, "a store that still answers RPC_FAIL keeps it open"
    real.mode = "up"
    deadline = time.monotonic() + 2
    while s._pd_breaker.is_open and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not s._pd_breaker.is_open
    assert lines[-1].startswith(sb.BREAKER_CLOSED)
    assert s.batch_is_exist(["hit-1"]) == [1], "reuse resumes with no restart"


def test_bound_from_env():
    assert sb.breaker_bound({}) == 0
    assert sb.breaker_bound({sb.BREAKER_ENV: "1000"}) == 1.0
    assert sb.breaker_bound({sb.BREAKER_ENV: "x"}) == 0
    assert sb.install_store_breaker({}) is False


def test_patch_wraps_every_store_the_module_makes(capsys):
    mod = types.ModuleType("mooncake.store")
    mod.MooncakeDistributedStore = FakeStore
    sb.breaker_patch(mod, 0.5)
    made = mod.MooncakeDistributedStore()
    assert isinstance(made, sb.FailOpenStore) and made.setup("h") == 0
    assert sb.BREAKER_ACTIVE in capsys.readouterr().err


def test_a_mooncake_that_does_not_fit_refuses_loudly(capsys):
    mod = types.ModuleType("mooncake.store")

    class Old:
        def setup(self):
            pass

    mod.MooncakeDistributedStore = Old
    with pytest.raises(RuntimeError, match="vllm_store_tier_timeout_ms: 0"):
        sb.breaker_patch(mod, 0.5)
    assert "batch_is_exist" in capsys.readouterr().err
    with pytest.raises(RuntimeError, match="no MooncakeDistributedStore"):
        sb.breaker_patch(types.ModuleType("mooncake.store"), 0.5)
