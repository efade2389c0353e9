"""The sender-tasks patch: a prefill serves each decode's KV request in its own task, so a stale request that waits
out its timeout does not hold up the requests behind it; a connector that no longer fits refuses to start."""
import asyncio
import types

import pytest

from conftest import load_patch

st = load_patch("pd_bundle_sender_tasks")


def connector_module():
    """A stand-in for vLLM 0.32's connector module: its _sender_worker as vLLM writes it (one request at a time per
    task), and a send_kv_to_decode that waits for a request's prefill side (never, for a stale one)."""
    mod = types.ModuleType("fake_connector")

    class Status:
        ERROR = "error"

    class Response:
        def __init__(self, status, err_msg):
            self.status, self.err_msg = status, err_msg

    class Worker:
        def __init__(self):
            self.sender_worker_queue = asyncio.Queue()
            self.served = []
            self._xfer_meta_decoder = types.SimpleNamespace(decode=lambda b: b.decode())
            self._encoder = types.SimpleNamespace(encode=lambda r: r.err_msg.encode())

        async def send_kv_to_decode(self, identity, sock, meta):
            if meta == "bad":
                raise ValueError("no such transfer")
            await asyncio.sleep(30 if meta == "stale" else 0.01)  # a stale request waits out the abort timeout
            self.served.append(meta)

        async def _sender_worker(self, sock):
            while True:
                identity, metadata_bytes = await self.sender_worker_queue.get()
                try:
                    await self.send_kv_to_decode(identity, sock, self._xfer_meta_decoder.decode(metadata_bytes))
                finally:
                    self.sender_worker_queue.task_done()

    mod.MooncakeConnectorWorker = Worker
    mod.MooncakeXferResponse = Response
    mod.MooncakeXferResponseStatus = Status
    return mod


class Sock:
    def __init__(self):
        self.sent = []

    async def send_multipart(self, parts):
        self.sent.append(parts)


def _serve(worker, sock, messages, wait=0.3):
    async def go():
        for m in messages:
            worker.sender_worker_queue.put_nowait((b"decode", m.encode()))
        task = asyncio.ensure_future(worker._sender_worker(sock))
        await asyncio.sleep(wait)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    asyncio.run(go())


def test_vllms_worker_serves_nothing_behind_a_stale_request():
    """The fault as vLLM has it: one task, a stale request first, the fresh one waits behind it."""
    mod = connector_module()
    w = mod.MooncakeConnectorWorker()
    _serve(w, Sock(), ["stale", "fresh"])
    assert w.served == []


def test_patched_worker_serves_the_fresh_request_beside_the_stale_one():
    mod = connector_module()
    st.sender_patch(mod)
    w, sock = mod.MooncakeConnectorWorker(), Sock()
    _serve(w, sock, ["stale", "fresh", "stale", "fresh2", "bad"])
    assert sorted(w.served) == ["fresh", "fresh2"]
    assert sock.sent == [(b"decode", b"no such transfer")]  # an error is answered as vLLM answers it


def test_a_connector_that_no_longer_fits_refuses_to_start():
    mod = connector_module()
    del mod.MooncakeXferResponse
    with pytest.raises(RuntimeError, match="has no MooncakeXferResponse.*vllm_mooncake_sender_per_request: false"):
        st.sender_patch(mod)
    mod = connector_module()

    async def other(self, sock):  # a rewrite that no longer reads the queue
        return None

    mod.MooncakeConnectorWorker._sender_worker = other
    with pytest.raises(RuntimeError, match="no longer calls sender_worker_queue.get()"):
        st.sender_patch(mod)


def test_installed_only_when_asked_for():
    assert st.install_sender_tasks({}) is False
    assert st.install_sender_tasks({"PD_BUNDLE_SENDER_TASKS": "0"}) is False
