"""The store tier fails open: a prefill whose Mooncake store cannot answer skips it and serves by P2P
(PD_BUNDLE_STORE_BREAKER_MS on store-tier prefill instances, vllm_store_tier_timeout_ms; installed as part of
sitecustomize.py for vLLM units only).
Why (issue 44, measured with mooncake-transfer-engine 0.3.13.post1): with no master answering, every call of the
store client (batch_is_exist, batch_put_from_multi_buffers, batch_get_into_multi_buffers) retries inside Mooncake for
about 4.4 s and then returns RPC_FAIL (-900); MC_RPC_TIMEOUT_MS does not shorten it. vLLM's store connector looks a
prompt up synchronously in the scheduler loop, so every request cost the engine 4.4 s and serving stopped (issue 44:
187 of 200 requests failed with both masters down). The client itself reconnects once a master leads again.
This is a circuit breaker around the store client, in front of Mooncake's public Python API only (no vLLM internals):
the module mooncake.store gets a MooncakeDistributedStore whose instances wrap the real one.
- Closed (the store answers): every call goes through. A lookup (batch_is_exist, is_exist; read-only) that has not
  answered within the bound is abandoned in its thread and answered as a miss; a lookup, put or get that answers
  RPC_FAIL, or a lookup answering any error, opens the breaker.
- Open: the data calls answer at once as Mooncake does with no master: RPC_FAIL per key (a miss, a failed put, a failed
  load, which vLLM already handles: the prompt is computed, nothing is stored). One probe thread asks the store every
  PROBE_INTERVAL_S for a key; its first answer that is not an error closes the breaker: reuse resumes with no restart.
Every change of state is one line on stderr (the unit's journal). The upstream change that retires it: vLLM's store
connector bounding its lookups (lookup_async with a deadline) and Mooncake's client failing fast with no master.
"""
import concurrent.futures
import os
import sys
import threading
import time

# patch_on_import, refuse_patch, env_seconds: defined above this file in sitecustomize.py (pd_bundle_import_hook.py); unit tests set them.

BREAKER_ENV = "PD_BUNDLE_STORE_BREAKER_MS"
BREAKER_MODULE = "mooncake.store"
BREAKER_CLASS = "MooncakeDistributedStore"
# Mooncake's ErrorCode::RPC_FAIL: what its client answers for each key when no master answers.
RPC_FAIL = -900
# Read-only calls: safe to abandon in their thread after the bound (a put or get writes or reads the engine's buffers
# and is never abandoned: it only opens the breaker by its answer).
LOOKUPS = ("batch_is_exist", "is_exist")
# Per-key calls whose keys are the first argument: with the breaker open each key answers RPC_FAIL.
BATCHES = ("batch_is_exist", "batch_put_from_multi_buffers", "batch_get_into_multi_buffers", "batch_put_from",
           "batch_get_into")
SINGLES = ("is_exist", "put", "put_from", "get_into")
PROBE_KEY = "pd-bundle-store-breaker-probe"
PROBE_INTERVAL_S = 2.0
# The lines the breaker prints (tests/infra and the store drills look for them in the prefill's journal).
BREAKER_ACTIVE = "pd-bundle: the store tier fails open"
BREAKER_OPEN = "pd-bundle: store breaker open"
BREAKER_CLOSED = "pd-bundle: store breaker closed"


def breaker_bound(environ=os.environ):
    """The lookup bound in seconds, 0 when off or malformed."""
    return env_seconds(environ, BREAKER_ENV)


def _failed(name, result):
    """Whether a store answer says the store cannot answer: RPC_FAIL anywhere, or any error of a lookup."""
    items = result if isinstance(result, (list, tuple)) else [result]
    ints = [r for r in items if isinstance(r, int) and not isinstance(r, bool)]
    if any(r == RPC_FAIL for r in ints):
        return True
    return name in LOOKUPS and any(r < 0 for r in ints)


def _refused(name, args):
    """The answer of an open breaker, in the shape of the call's own answer."""
    if name in BATCHES:
        return [RPC_FAIL] * len(args[0]) if args else []
    return RPC_FAIL


class Breaker:
    """The breaker's state, shared by a store's calls and its probe."""

    def __init__(self, store, bound, clock=time.monotonic, log=None, interval=PROBE_INTERVAL_S):
        self.store, self.bound, self.clock, self.interval = store, bound, clock, interval
        self.log = log or (lambda line: print(line, file=sys.stderr, flush=True))
        self.lock = threading.Lock()
        self.opened_at = None
        self.opens = 0
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="pd-store-lookup")

    @property
    def is_open(self):
        return self.opened_at is not None

    def trip(self, why):
        with self.lock:
            if self.opened_at is not None:
                return
            self.opened_at = self.clock()
            self.opens += 1
        self.log("%s: %s; the store is skipped (prompts are computed, nothing is stored) until it answers again"
                 % (BREAKER_OPEN, why))
        threading.Thread(target=self.probe, name="pd-store-probe", daemon=True).start()

    def close(self):
        with self.lock:
            opened, self.opened_at = self.opened_at, None
        if opened is not None:
            self.log("%s: the store answers again after %.1f s; reuse resumes" % (BREAKER_CLOSED, self.clock() - opened))

    def probe_once(self):
        """One probe; True when the store answered (and the breaker closed)."""
        try:
            answer = self.store.batch_is_exist([PROBE_KEY])
        except Exception:  # noqa: BLE001 - any failure is "not yet"
            return False
        if _failed("batch_is_exist", answer):
            return False
        self.close()
        return True

    def probe(self, sleep=time.sleep):
        while self.is_open:
            sleep(self.interval)
            if self.probe_once():
                return

    def call(self, name, method, args, kwargs):
        if self.is_open:
            return _refused(name, args)
        if name in LOOKUPS and self.bound > 0:
            future = self.pool.submit(method, *args, **kwargs)
            try:
                result = future.result(timeout=self.bound)
            except concurrent.futures.TimeoutError:
                self.trip("%s did not answer within %d ms" % (name, round(self.bound * 1000)))
                return _refused(name, args)
            except Exception as e:  # noqa: BLE001 - the caller's own handling sees a refusal
                self.trip("%s raised %s" % (name, e))
                return _refused(name, args)
        else:
            try:
                result = method(*args, **kwargs)
            except Exception as e:
                self.trip("%s raised %s" % (name, e))
                raise
        if _failed(name, result):
            self.trip("%s answered %s" % (name, "RPC_FAIL" if RPC_FAIL in (result if isinstance(result, list)
                                                                         else [result]) else "an error"))
        return result


class FailOpenStore:
    """A MooncakeDistributedStore whose data calls go through a Breaker; every other attribute is the real store's."""

    def __init__(self, real, bound, **breaker_kwargs):
        self._pd_real = real
        self._pd_breaker = Breaker(real, bound, **breaker_kwargs)

    def __getattr__(self, name):
        attr = getattr(self._pd_real, name)
        if name not in BATCHES + SINGLES or not callable(attr):
            return attr
        breaker = self._pd_breaker

        def guarded(*args, **kwargs):
            return breaker.call(name, attr, args, kwargs)

        return guarded


def breaker_check(module):
    """Refuse a mooncake.store that lacks what the breaker wraps."""
    cls = getattr(module, BREAKER_CLASS, None)
    missing = [n for n in ("setup", "batch_is_exist", "batch_put_from_multi_buffers", "batch_get_into_multi_buffers")
               if not hasattr(cls, n)]
    if cls is None or missing:
        refuse_patch("pd_bundle_store_breaker", "mooncake.store", "no %s" % BREAKER_CLASS if cls is None
                     else "%s has no %s" % (BREAKER_CLASS, ", ".join(missing)),
                     "set vllm_store_tier_timeout_ms: 0 for this Mooncake and re-run site.yml")
    return cls


def breaker_patch(module, bound):
    real = breaker_check(module)

    def MooncakeDistributedStore(*args, **kwargs):  # noqa: N802 - the name vLLM imports
        return FailOpenStore(real(*args, **kwargs), bound)

    module.MooncakeDistributedStore = MooncakeDistributedStore
    print("%s (%s=%d)" % (BREAKER_ACTIVE, BREAKER_ENV, round(bound * 1000)), file=sys.stderr, flush=True)


def install_store_breaker(environ=os.environ):
    """Hook mooncake.store's import; returns True when asked for."""
    bound = breaker_bound(environ)
    if not bound:
        return False
    patch_on_import(BREAKER_MODULE, lambda module: breaker_patch(module, bound))
    return True


install_store_breaker()
