"""ASGI middleware for vLLM's --middleware: /health answers 503 while a drain file exists, and a canary that finds
this instance wedged can have it drain and restart (POST /pd-bundle/heal).

A rolling restart creates the drain file first. The router's active health check then takes the
instance out of the rotation while it still serves the requests it already has; once those are
done the instance restarts (systemd removes its RuntimeDirectory, and the drain file with it) and
comes back after its first good health check. vLLM has no drain switch of its own, and the
router cannot re-add a PD worker over HTTP once removed, so health is the lever.

Healing (issue 44): the PD canary (plugins/tools/pd_canary.py, on the pool's first router host) POSTs
/pd-bundle/heal with the instance's API key when this instance is wedged: its transfers fail while its process and
/health look fine, and only a restart clears it. The middleware then drains exactly as a rolling restart does (the
drain file: the routers take it out of the rotation), waits the request's grace (its routers' health-check period,
which the canary knows), then until the requests it is serving are done (at most PD_BUNDLE_DRAIN_TIMEOUT seconds,
the vllm role's vllm_drain_timeout), and sends itself SIGTERM: vLLM
shuts down gracefully and systemd (Restart=always) starts it again. No new privilege, no remote shell: the process
ends itself. Without VLLM_API_KEY the endpoint answers 403 (nobody could be told apart).

Ejection (issue 52): the same canary takes an instance whose path is broken out of every router's rotation, without a
restart, by POST /pd-bundle/eject?ttl=SECONDS: /health then answers 503 "ejected" until the canary puts it back
(ttl=0) or the ttl runs out (the canary renews it on each run while the path stays broken, so a canary that stops
cannot leave an instance out for good). Every router of the pool, smg and vllm-router alike, drops it at its next
health check and takes it back at the first good one: the routers' own health checks are the lever, as for a drain.
smg's worker API cannot do it while file discovery owns the workers (measured on smg 1.13.0: a DELETE is undone by
the next discovery pass within 4 s, and PATCH changes only priority, cost, labels and health-check thresholds).
The canary still probes an ejected instance directly (the body says "ejected", not "draining").

    --middleware pd_bundle_drain.DrainMiddleware   (module on PYTHONPATH)
    PD_BUNDLE_DRAIN_FILE=/run/vllm-<instance>/drain
    PD_BUNDLE_DRAIN_TIMEOUT=120
    POST /pd-bundle/heal?reason=TEXT&grace=SECONDS   (Authorization: Bearer VLLM_API_KEY)
    POST /pd-bundle/eject?ttl=SECONDS&reason=TEXT    (the same key; ttl=0 puts it back)
    POST /pd-bundle/abort?since=EPOCH&remote=URL&reason=TEXT   (the same key)

Requests inside a cut path (issue 52 item 6): a PD decode request whose KV cannot arrive waits in vLLM for
VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT + 60 s (the connector's receive timeout), past any client's patience. When the
canary takes a broken path out, it also POSTs /pd-bundle/abort to the decode: the API requests that started since
the path's last good canary, have not begun their answer (still waiting for KV) and, with remote, take their KV from
that prefill, are cancelled as a client that went away is (vLLM aborts them in its engine) and answered 503 with the
reason (a stream whose head went out gets the error as its one event), so their clients can retry at once instead
of waiting out their timeout. A request whose answer has begun (a first byte of body) is never touched; without an
ejection nothing is ever aborted.
"""
import asyncio
import hmac
import json
import urllib.parse
import os
import signal
import sys
import threading
import time

DRAIN_BODY = b"draining\n"
EJECT_BODY = b"ejected\n"
HEAL_PATH = "/pd-bundle/heal"
EJECT_PATH = "/pd-bundle/eject"
ABORT_PATH = "/pd-bundle/abort"
# The answer of a request abort_waiting ended (OpenAI's error shape; 503: the client may retry it).
ABORT_BODY = (b'{"error": {"message": "pd-bundle: this request waited for its KV on a path the canary found broken, '
              b'and was ended (%s); retry it", "type": "ServiceUnavailableError", "code": 503}}')
# An ejection lasts at most this long without renewal (the canary asks for less).
EJECT_TTL_MAX = 3600.0


def remote_of(body):
    """The prefill bootstrap address a PD decode request takes its KV from (kv_transfer_params), else None."""
    try:
        params = json.loads(body or b"{}").get("kv_transfer_params") or {}
    except (ValueError, AttributeError):
        return None
    if not isinstance(params, dict) or not params.get("do_remote_prefill"):
        return None
    return str(params.get("remote_bootstrap_addr") or "") or None


def _addr(url):
    """host:port of a bootstrap address, with or without its scheme (routers write it either way)."""
    return str(url or "").split("://", 1)[-1].rstrip("/")


def draining(path=None):
    path = path if path is not None else os.environ.get("PD_BUNDLE_DRAIN_FILE", "")
    return bool(path) and os.path.exists(path)


def _float_env(name, default):
    try:
        return max(float(os.environ.get(name, default)), 0.0)
    except ValueError:
        return default


def authorized(headers, key):
    """Whether the request carries 'Authorization: Bearer KEY' (compared in constant time); never without a key."""
    if not key:
        return False
    for name, value in headers or []:
        if name.lower() == b"authorization":
            return hmac.compare_digest(value, b"Bearer " + key.encode())
    return False


class DrainMiddleware:
    def __init__(self, app, drain_file=None, key=None, kill=None, clock=time.monotonic, sleep=time.sleep):
        self.app = app
        self.drain_file = drain_file
        self.key = key if key is not None else os.environ.get("VLLM_API_KEY", "")
        self.kill = kill or (lambda: os.kill(os.getpid(), signal.SIGTERM))
        self.clock, self.sleep = clock, sleep
        self.in_flight = 0
        self.healing = None  # the heal thread, once one started
        self.ejected_until = 0.0  # clock() until which /health says "ejected"
        self._entries = {}  # API requests in flight, by id (abort_waiting)

    def ejected(self):
        return self.clock() < self.ejected_until

    def eject(self, ttl, reason):
        """Out of rotation for TTL seconds from now (0: back now). Returns the answer's body."""
        was = self.ejected()
        self.ejected_until = self.clock() + ttl if ttl > 0 else 0.0
        if ttl > 0 and not was:
            print("pd-bundle: ejected for up to %.0f s (%s): /health answers 503 until put back" % (ttl, reason),
                  file=sys.stderr, flush=True)
        elif ttl <= 0 and was:
            print("pd-bundle: put back in rotation (%s)" % reason, file=sys.stderr, flush=True)
        return EJECT_BODY if ttl > 0 else b"in rotation\n"

    def _file(self):
        return self.drain_file if self.drain_file is not None else os.environ.get("PD_BUNDLE_DRAIN_FILE", "")

    async def _control_query(self, scope, send):
        """The query of a control request (heal, eject, abort): POST only, with the instances' key. None once it was
        answered 405 or 403."""
        if scope.get("method") != "POST":
            await self._answer(send, 405, b"POST only\n")
            return None
        if not authorized(scope.get("headers"), self.key):
            await self._answer(send, 403, b"forbidden\n")
            return None
        return urllib.parse.parse_qs((scope.get("query_string") or b"").decode(errors="replace"))

    async def _answer(self, send, status, body, ctype=b"text/plain"):
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", ctype), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    def heal(self, reason, grace=5.0, timeout=None):
        """Drain, wait for the routers and the requests in flight, then end the process (systemd restarts it)."""
        timeout = _float_env("PD_BUNDLE_DRAIN_TIMEOUT", 120.0) if timeout is None else timeout
        path = self._file()
        if path:
            open(path, "a").close()
        print("pd-bundle: heal requested (%s): draining, then exiting for systemd to restart this instance" % reason,
              file=sys.stderr, flush=True)
        self.sleep(grace)
        deadline = self.clock() + timeout
        while self.in_flight > 0 and self.clock() < deadline:
            self.sleep(1.0)
        print("pd-bundle: heal: %d request(s) still in flight after the drain; exiting now" % self.in_flight,
              file=sys.stderr, flush=True)
        self.kill()

    async def __call__(self, scope, receive, send):
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path")
        if path == "/health" and draining(self._file()):
            await self._answer(send, 503, DRAIN_BODY)
            return
        if path == "/health" and self.ejected():
            await self._answer(send, 503, EJECT_BODY)
            return
        if path in (EJECT_PATH, HEAL_PATH, ABORT_PATH):
            query = await self._control_query(scope, send)
            if query is None:
                return
            reason = (query.get("reason") or ["no reason given"])[0][:300]
            if path == EJECT_PATH:
                try:
                    ttl = min(max(float((query.get("ttl") or ["0"])[0]), 0.0), EJECT_TTL_MAX)
                except ValueError:
                    await self._answer(send, 400, b"ttl: a number of seconds\n")
                    return
                await self._answer(send, 200, self.eject(ttl, reason))
            elif path == HEAL_PATH:
                if self.healing is not None:
                    await self._answer(send, 202, b"already healing\n")
                    return
                try:
                    grace = min(max(float((query.get("grace") or ["5"])[0]), 0.0), 60.0)
                except ValueError:
                    grace = 5.0
                self.healing = threading.Thread(target=self.heal, args=(reason, grace), daemon=True)
                self.healing.start()
                await self._answer(send, 202, b"healing\n")
            else:
                try:
                    since = float((query.get("since") or ["0"])[0])
                except ValueError:
                    await self._answer(send, 400, b"since: an epoch in seconds\n")
                    return
                n = self.abort_waiting(since, (query.get("remote") or [None])[0], reason)
                await self._answer(send, 200, b"aborted %d\n" % n)
            return
        if not str(path or "").startswith("/v1/"):
            await self.app(scope, receive, send)
            return
        await self._serve_counted(scope, receive, send)

    async def _serve_counted(self, scope, receive, send):
        """An API request: counted (the heal's drain waits for them) and tracked until its answer starts, so that
        abort_waiting can end it. Its body is read first (small JSON), to learn the prefill it takes its KV from
        (kv_transfer_params.remote_bootstrap_addr), and handed to vLLM unchanged."""
        self.in_flight += 1
        entry = {"since": time.time(), "remote": None, "head": False, "responding": False, "aborted": None, "task": None}
        try:
            received, body = [], b""
            while True:
                msg = await receive()
                received.append(msg)
                if msg.get("type") != "http.request":
                    break
                body += msg.get("body", b"")
                if not msg.get("more_body"):
                    break
            entry["remote"] = remote_of(body)

            async def replay():
                return received.pop(0) if received else await receive()

            async def watch(msg):
                # A stream's head goes out before its first token (vLLM returns the streaming response at once):
                # the answer has begun only with its first byte of body.
                if msg.get("type") == "http.response.start":
                    entry["head"] = True
                elif msg.get("type") == "http.response.body" and msg.get("body"):
                    entry["responding"] = True
                await send(msg)

            entry["task"] = asyncio.ensure_future(self.app(scope, replay, watch))
            self._entries[id(entry)] = entry
            try:
                await entry["task"]
            except asyncio.CancelledError:
                if entry["aborted"] is None:  # our own caller went away: not an abort of ours
                    entry["task"].cancel()
                    raise
                error = ABORT_BODY % entry["aborted"].encode()
                if not entry["head"]:
                    await self._answer(send, 503, error, ctype=b"application/json")
                elif not entry["responding"]:  # a stream's head is out: its one event is the error (the SDK raises it)
                    await send({"type": "http.response.body", "body": b"data: " + error + b"\n\n", "more_body": False})
        finally:
            self._entries.pop(id(entry), None)
            self.in_flight -= 1

    def abort_waiting(self, since, remote=None, reason=""):
        """End every tracked request that started at or after SINCE (epoch), has not started its answer (a PD decode
        still waiting for its KV), and, with REMOTE, takes its KV from that prefill bootstrap address. vLLM aborts
        each in its engine as on a client that went away; the client gets 503 with the reason. Returns the count."""
        n = 0
        for entry in list(self._entries.values()):
            if entry["responding"] or entry["task"] is None or entry["since"] < since:
                continue
            if remote and _addr(entry["remote"]) != _addr(remote):
                continue
            entry["aborted"] = reason or "aborted"
            entry["task"].cancel()
            n += 1
        if n:
            print("pd-bundle: aborted %d request(s) waiting since %.0f%s (%s)" % (
                n, since, " on prefill %s" % remote if remote else "", reason), file=sys.stderr, flush=True)
        return n
