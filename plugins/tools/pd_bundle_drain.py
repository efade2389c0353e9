"""ASGI middleware for vLLM's --middleware: /health answers 503 while a drain file exists.

A rolling restart creates the drain file first. The router's active health check then takes the
instance out of the rotation while it still serves the requests it already has; once those are
done the instance restarts (systemd removes its RuntimeDirectory, and the drain file with it) and
comes back after its first good health check. vLLM has no drain switch of its own, and the
router cannot re-add a PD worker over HTTP once removed, so health is the lever.

    --middleware pd_bundle_drain.DrainMiddleware   (module on PYTHONPATH)
    PD_BUNDLE_DRAIN_FILE=/run/vllm-<instance>/drain
"""
import os

DRAIN_BODY = b"draining\n"


def draining(path=None):
    path = path if path is not None else os.environ.get("PD_BUNDLE_DRAIN_FILE", "")
    return bool(path) and os.path.exists(path)


class DrainMiddleware:
    def __init__(self, app, drain_file=None):
        self.app = app
        self.drain_file = drain_file

    async def __call__(self, scope, receive, send):
        if scope.get("type") == "http" and scope.get("path") == "/health" and draining(self.drain_file):
            await send({"type": "http.response.start", "status": 503,
                        "headers": [(b"content-type", b"text/plain"),
                                    (b"content-length", str(len(DRAIN_BODY)).encode())]})
            await send({"type": "http.response.body", "body": DRAIN_BODY})
            return
        await self.app(scope, receive, send)
