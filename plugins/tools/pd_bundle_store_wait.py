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
"""
import os
import time

# patch_on_import: defined above this file in sitecustomize.py (pd_bundle_import_hook.py); unit tests set it.

WAIT_ENV = "PD_BUNDLE_STORE_LOOKUP_WAIT_MS"
SCHEDULER = "vllm.distributed.kv_transfer.kv_connector.v1.mooncake.store.scheduler"


def store_wait_seconds(environ=os.environ):
    """The wait in seconds, 0 when off or malformed."""
    try:
        return max(int(environ.get(WAIT_ENV, "0")), 0) / 1000.0
    except ValueError:
        return 0.0


def wrap_lookup(original, wait, clock=time.monotonic):
    """get_num_new_matched_tokens that retries (None) while the prompt's whole blocks are missing."""
    first_seen = {}

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        tokens, load_async = original(self, request, num_computed_tokens)
        block = getattr(self, "_block_size", 0) or 0
        full = request.num_tokens // block * block if block else 0
        if tokens is not None and full and num_computed_tokens + tokens < full:
            if len(first_seen) > 10000:  # requests aborted while waiting never come back
                first_seen.clear()
            if clock() - first_seen.setdefault(request.request_id, clock()) < wait:
                getattr(self, "load_specs", {}).pop(request.request_id, None)  # re-made on the retry
                return None, False
        first_seen.pop(request.request_id, None)
        return tokens, load_async

    return get_num_new_matched_tokens


def patch_scheduler(wait):
    """The patch for the scheduler module: its lookup waits up to `wait` seconds for the whole prompt."""
    def patch(module):
        cls = module.MooncakeStoreScheduler
        cls.get_num_new_matched_tokens = wrap_lookup(cls.get_num_new_matched_tokens, wait)
    return patch


def install_store_wait(environ=os.environ):
    """Hook the scheduler's import; returns True when a wait is configured."""
    wait = store_wait_seconds(environ)
    if wait > 0:
        patch_on_import(SCHEDULER, patch_scheduler(wait))
    return wait > 0


install_store_wait()
