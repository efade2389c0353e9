"""The drain middleware: /health is 503 only while the drain file exists; all else passes through."""
import asyncio
import json
import importlib.util
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "plugins" / "tools" / "pd_bundle_drain.py"
spec = importlib.util.spec_from_file_location("pd_bundle_drain", SRC)
drain = importlib.util.module_from_spec(spec)
spec.loader.exec_module(drain)


async def _app(scope, receive, send):
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


def _call(mw, path, scope_type="http"):
    sent = []

    async def send(msg):
        sent.append(msg)

    async def receive():
        return {"type": "http.request"}

    asyncio.run(mw({"type": scope_type, "path": path}, receive, send))
    return sent[0].get("status"), sent[1].get("body")


def test_health_is_503_while_drain_file_exists(tmp_path):
    flag = tmp_path / "drain"
    mw = drain.DrainMiddleware(_app, drain_file=str(flag))
    assert _call(mw, "/health") == (200, b"ok")
    flag.touch()
    assert _call(mw, "/health") == (503, b"draining\n")
    # Requests keep being served while draining: only the health answer changes.
    assert _call(mw, "/v1/completions") == (200, b"ok")
    flag.unlink()
    assert _call(mw, "/health") == (200, b"ok")


def test_env_variable_names_the_file(tmp_path, monkeypatch):
    flag = tmp_path / "d"
    flag.touch()
    monkeypatch.setenv("PD_BUNDLE_DRAIN_FILE", str(flag))
    assert _call(drain.DrainMiddleware(_app), "/health")[0] == 503
    monkeypatch.setenv("PD_BUNDLE_DRAIN_FILE", "")
    assert _call(drain.DrainMiddleware(_app), "/health")[0] == 200


def _post(mw, path, headers=(), query=b"", method="POST"):
    sent = []

    async def send(msg):
        sent.append(msg)

    async def receive():
        return {"type": "http.request"}

    asyncio.run(mw({"type": "http", "path": path, "method": method, "headers": list(headers), "query_string": query},
                   receive, send))
    return sent[0].get("status"), sent[1].get("body")





def test_heal_needs_the_key_and_post(tmp_path):
    killed = []
    mw = drain.DrainMiddleware(_app, drain_file=str(tmp_path / "drain"), key="kkk", kill=lambda: killed.append(1))
    assert _post(mw, drain.HEAL_PATH)[0] == 403
    assert _post(mw, drain.HEAL_PATH, [(b"authorization", b"Bearer wrong")])[0] == 403
    assert _post(mw, drain.HEAL_PATH, [(b"authorization", b"Bearer kkk")], method="GET")[0] == 405
    nokey = drain.DrainMiddleware(_app, drain_file=str(tmp_path / "drain"), key="", kill=lambda: killed.append(1))
    assert _post(nokey, drain.HEAL_PATH, [(b"authorization", b"Bearer ")])[0] == 403
    assert not killed and not (tmp_path / "drain").exists()


def test_heal_drains_waits_for_requests_then_ends_the_process(tmp_path):
    killed, slept = [], []
    flag = tmp_path / "drain"
    now = [0.0]

    def sleep(s):
        slept.append(s)
        now[0] += s

    mw = drain.DrainMiddleware(_app, drain_file=str(flag), key="kkk", kill=lambda: killed.append(now[0]),
                               clock=lambda: now[0], sleep=sleep)
    mw.in_flight = 2  # two requests being served: the heal waits for them, up to the drain timeout
    mw.heal("pair broken", grace=4, timeout=10)
    assert flag.exists() and _call(mw, "/health")[0] == 503
    assert slept[0] == 4 and killed == [pytest_approx(14.0)]


def pytest_approx(x):
    import pytest
    return pytest.approx(x)


def test_heal_endpoint_starts_one_heal_only(tmp_path):
    killed = []
    mw = drain.DrainMiddleware(_app, drain_file=str(tmp_path / "drain"), key="kkk", kill=lambda: killed.append(1),
                               sleep=lambda s: None)
    assert _post(mw, drain.HEAL_PATH, [(b"authorization", b"Bearer kkk")], b"reason=x&grace=0") == (202, b"healing\n")
    mw.healing.join(5)
    assert killed == [1]
    assert _post(mw, drain.HEAL_PATH, [(b"authorization", b"Bearer kkk")]) == (202, b"already healing\n")
    assert killed == [1]


def test_requests_in_flight_are_counted_for_the_api_only(tmp_path):
    seen = []

    async def app(scope, receive, send):
        seen.append(mw.in_flight)
        await _app(scope, receive, send)

    mw = drain.DrainMiddleware(app, drain_file=str(tmp_path / "drain"), key="k")
    _call(mw, "/v1/completions")
    _call(mw, "/metrics")
    assert seen == [1, 0] and mw.in_flight == 0


def test_eject_takes_the_instance_out_of_rotation_until_put_back_or_its_ttl_ends(tmp_path):
    now = [100.0]
    mw = drain.DrainMiddleware(_app, drain_file=str(tmp_path / "drain"), key="kkk", clock=lambda: now[0])
    auth = [(b"authorization", b"Bearer kkk")]
    assert _post(mw, drain.EJECT_PATH, query=b"ttl=30")[0] == 403  # never without the key
    assert _post(mw, drain.EJECT_PATH, auth, method="GET")[0] == 405
    assert _post(mw, drain.EJECT_PATH, auth, query=b"ttl=x")[0] == 400
    assert _call(mw, "/health") == (200, b"ok")
    assert _post(mw, drain.EJECT_PATH, auth, query=b"ttl=30&reason=pair+broken") == (200, b"ejected\n")
    # out of every router's rotation (their health checks), serving what comes anyway (the canary's probes)
    assert _call(mw, "/health") == (503, b"ejected\n") and _call(mw, "/v1/completions") == (200, b"ok")
    now[0] += 31  # the canary stopped renewing it: back by itself
    assert _call(mw, "/health") == (200, b"ok")
    _post(mw, drain.EJECT_PATH, auth, query=b"ttl=30")
    assert _post(mw, drain.EJECT_PATH, auth, query=b"ttl=0") == (200, b"in rotation\n")
    assert _call(mw, "/health") == (200, b"ok")
    # a drain wins over an ejection: the rolling restart's answer
    _post(mw, drain.EJECT_PATH, auth, query=b"ttl=30")
    (tmp_path / "drain").touch()
    assert _call(mw, "/health") == (503, b"draining\n")


def test_abort_ends_requests_still_waiting_for_their_kv_and_nothing_else():
    """A decode request whose KV cannot arrive (the app never answers) is ended with 503 and the reason; one that
    already streams its answer, one from another prefill and one started before SINCE are left alone."""
    async def app(scope, receive, send):
        body = (await receive())["body"]
        if b"streaming" in body or b"head" in body:  # a stream: its head at once; a first token once KV arrived
            await send({"type": "http.response.start", "status": 200, "headers": []})
        if b"streaming" in body:
            await send({"type": "http.response.body", "body": b"data: {\"text\": \"a\"}\n\n", "more_body": True})
        await asyncio.sleep(30)  # waiting for KV that never comes
        await send({"type": "http.response.body", "body": b"late"})

    mw = drain.DrainMiddleware(app, drain_file="", key="kkk")

    def body(remote, extra=""):
        return json.dumps({"prompt": "p" + extra, "kv_transfer_params": {
            "do_remote_prefill": True, "remote_bootstrap_addr": remote}}).encode()

    async def scenario():
        answers = {}

        async def client(name, payload):
            sent = []

            async def send(msg):
                sent.append(msg)

            async def receive():
                return {"type": "http.request", "body": payload, "more_body": False}

            task = asyncio.ensure_future(mw({"type": "http", "path": "/v1/completions", "method": "POST"}, receive, send))
            try:
                await asyncio.wait_for(task, 2)
            except asyncio.TimeoutError:
                pass
            answers[name] = (sent[0]["status"] if sent else None, b"".join(m.get("body", b"") for m in sent[1:]))

        old = asyncio.ensure_future(client("old", body("http://p1:8998", "old")))
        await asyncio.sleep(0.05)
        since = __import__("time").time()
        others = [asyncio.ensure_future(client(n, b)) for n, b in (
            ("stuck", body("http://p1:8998")), ("streaming", body("http://p1:8998", "streaming")),
            ("head", body("http://p1:8998", "head")),
            ("elsewhere", body("http://p2:8998")))]
        await asyncio.sleep(0.1)
        assert mw.abort_waiting(since, "p1:8998/", "pair p1 -> d1 broken") == 2
        await asyncio.gather(old, *others)
        return answers

    answers = asyncio.run(scenario())
    assert answers["stuck"][0] == 503 and b"pair p1 -> d1 broken" in answers["stuck"][1]
    assert answers["streaming"][0] == 200 and answers["elsewhere"][0] is None and answers["old"][0] is None
    # a stream whose head went out before its first token: its one event is the error, then it ends
    assert answers["head"][0] == 200 and answers["head"][1].startswith(b"data: {\"error\"") and b"broken" in answers["head"][1]
    assert mw.in_flight == 0
    assert drain.remote_of(b'{"kv_transfer_params": {"do_remote_decode": true}}') is None
    assert drain.remote_of(b"not json") is None


def test_abort_needs_the_key_and_a_number():
    mw = drain.DrainMiddleware(_app, drain_file="", key="kkk")
    assert _post(mw, drain.ABORT_PATH, query=b"since=1")[0] == 403
    assert _post(mw, drain.ABORT_PATH, [(b"authorization", b"Bearer kkk")], query=b"since=x")[0] == 400
    assert _post(mw, drain.ABORT_PATH, [(b"authorization", b"Bearer kkk")], query=b"since=1") == (200, b"aborted 0\n")
