"""HTTP and WebSocket on one port: the ASGI app (FastAPI) of a SpeechServer — the Realtime API at
/v1/realtime, the OpenAI REST endpoints (rest.py), /healthz, /metrics, the demo page, and (with
`debug`) fault injection — and how uvicorn runs it.
The same app can be mounted by another ASGI server (Ray Serve's ingress)."""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path

import uvicorn
from fastapi import FastAPI, Request, WebSocket
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse, Response

from ..engine import Fault
from .access import authorized, json_error, origin_ok
from .rest import RestAPI

STATIC = Path(__file__).parent / "static"
REALTIME_PATHS = ("/v1/realtime", "/realtime")
ENDPOINTS = (
    "/v1/realtime (WebSocket), POST /v1/audio/transcriptions, POST /v1/audio/translations, "
    "POST /v1/audio/speech, POST /v1/chat/completions, GET /v1/models, /healthz, /metrics, /"
)


class WebSocketConnection:
    """A session's connection: text events in and out, and a close with a code and reason."""

    def __init__(self, ws: WebSocket):
        self.ws, self.closed = ws, False

    async def receive(self) -> str | bytes | None:
        """The next message, or None once the connection is closed."""
        if self.closed:
            return None
        try:
            msg = await self.ws.receive()
        except RuntimeError:  # the connection is gone
            msg = {"type": "websocket.disconnect"}
        if msg["type"] == "websocket.disconnect":
            self.closed = True
            return None
        return msg["text"] if msg.get("text") is not None else (msg.get("bytes") or b"")

    async def send(self, text: str) -> None:
        await self.ws.send_text(text)

    async def close(self, code: int, reason: str = "") -> None:
        if self.closed:
            return
        self.closed = True
        with contextlib.suppress(Exception):  # the client may be gone already
            await self.ws.close(code, reason[:120])


def build_app(server) -> FastAPI:
    o = server.options
    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)

    def sees_everything(request) -> bool:
        return not o.private_metrics or authorized(request.headers, o.api_key)

    async def realtime(ws: WebSocket):
        denial = None
        if not authorized(ws.headers, o.api_key):
            server.counters.auth_failures += 1
            denial = json_error(
                401, "invalid or missing API key (send 'Authorization: Bearer <key>')", "invalid_api_key"
            )
        elif not origin_ok(ws.headers.get("origin"), o.origins, o.host):
            denial = json_error(
                403,
                f"origin {ws.headers.get('origin')!r} is not allowed (start the server with --allow-origin to add it)",
                "origin_not_allowed",
            )
        if denial is not None:
            await ws.send_denial_response(denial)
            return
        await ws.accept(subprotocol="realtime" if "realtime" in ws.scope.get("subprotocols", []) else None)
        await server.serve_session(WebSocketConnection(ws), ws.query_params.get("intent"), ws.query_params.get("model"))

    async def realtime_http(request: Request):
        return json_error(426, f"{request.url.path} is a WebSocket endpoint (OpenAI Realtime API)", "upgrade_required")

    for path in REALTIME_PATHS:
        app.add_api_websocket_route(path, realtime)
        app.add_api_route(path, realtime_http, methods=["GET"], include_in_schema=False)

    @app.api_route("/healthz", methods=["GET", "HEAD"])
    async def healthz(request: Request):
        status, body = server.health(full=sees_everything(request))
        return JSONResponse(body, status_code=status, headers={"Cache-Control": "no-store"})

    @app.api_route("/metrics", methods=["GET", "HEAD"])
    async def metrics(request: Request):
        if not sees_everything(request):
            return json_error(
                401,
                "/metrics needs the API key ('Authorization: Bearer <key>'): the server was "
                "started with --private-metrics",
                "invalid_api_key",
            )
        return Response(
            server.metrics_text(), media_type="text/plain; version=0.0.4", headers={"Cache-Control": "no-store"}
        )

    @app.api_route("/", methods=["GET", "HEAD"])
    @app.api_route("/index.html", methods=["GET", "HEAD"])
    async def page():
        return Response((STATIC / "index.html").read_bytes(), media_type="text/html; charset=utf-8")

    @app.api_route("/audio-worklet.js", methods=["GET", "HEAD"])
    async def worklet():
        return Response((STATIC / "audio-worklet.js").read_bytes(), media_type="text/javascript")

    RestAPI(server).register(app)

    if o.debug:

        @app.post("/debug/fault")
        async def fault(request: Request):
            try:
                server.engine.faults.add(Fault(**(await request.json())))
            except (TypeError, ValueError) as e:
                return json_error(400, f"bad fault: {e}; fields: stage (asr|lm|tts), count, stall_s", "invalid_value")
            return JSONResponse({"injected": True})

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException):
        if exc.status_code == 404:
            return json_error(404, f"no such path {request.url.path!r}; endpoints: {ENDPOINTS}", "not_found")
        return json_error(exc.status_code, str(exc.detail), "http_error")

    return app


class DenialNoise(logging.Filter):
    """uvicorn logs 'ASGI callable returned without completing handshake' after a WebSocket handshake is
    refused with an HTTP response (401/403), which is what the app means to do."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "without completing handshake" not in record.getMessage()


class UvicornServer(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self):
        # `speechrt serve` handles SIGINT/SIGTERM itself: a graceful drain first, then exit code 0
        yield


def uvicorn_config(app, o) -> uvicorn.Config:
    logging.getLogger("uvicorn.error").addFilter(DenialNoise())
    return uvicorn.Config(
        app,
        log_config=None,
        log_level="warning",
        access_log=False,
        lifespan="off",
        ws="websockets-sansio",
        ws_max_size=o.max_frame_bytes,
        ws_per_message_deflate=False,
        ws_ping_interval=o.ping_interval,
        ws_ping_timeout=o.ping_timeout,
        timeout_graceful_shutdown=5,
        server_header=False,
    )
