"""The drain middleware: /health is 503 only while the drain file exists; all else passes through."""
import asyncio
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
