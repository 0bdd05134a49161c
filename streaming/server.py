"""The speechrt server: OpenAI Realtime API over WebSocket at /v1/realtime, plus /healthz, /metrics
(Prometheus text) and the demo page at / — all on one port. One coroutine per connection, one shared
Engine (scheduler) per device, a cap on admitted sessions."""
from __future__ import annotations

import asyncio
import hmac
import http
import json
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from speechrt.errors import UserError
from speechrt.models.registry import DEFAULTS

from .engine import Engine
from .protocol import error_event
from .session import RealtimeSession
from .vad import SileroVAD

log = logging.getLogger(__name__)
STATIC = Path(__file__).parent / "static"
REALTIME_PATHS = ("/v1/realtime", "/realtime")


@dataclass(frozen=True)
class ServerOptions:
    host: str = "127.0.0.1"
    port: int = 8765
    api_key: str | None = None
    origins: tuple[str, ...] = ()  # extra allowed browser origins ("*" allows any)
    max_sessions: int = 32
    max_message_bytes: int = 1 << 20  # larger events get an error event; the session goes on
    max_buffer_seconds: float = 120.0  # uncommitted input audio per session
    idle_timeout: float = 300.0  # seconds without a client event before the session is closed
    drain_seconds: float = 15.0  # graceful shutdown: time given to turns in flight
    partial_interval: float = 1.0  # seconds between live transcript updates of a turn; 0: none
    silence_duration_ms: int | None = None  # server default for server_vad (None: the API's 500 ms)
    max_batch: int = 8

    def __post_init__(self):
        if self.max_sessions < 1:
            raise UserError(f"max_sessions must be >= 1, got {self.max_sessions}")
        if self.max_message_bytes < 1024:
            raise UserError(f"max_message_bytes must be >= 1024, got {self.max_message_bytes}")
        if not 0 <= self.partial_interval <= 10:
            raise UserError(f"partial_interval must be in [0, 10] seconds (0: no live transcript deltas), "
                            f"got {self.partial_interval}")
        if self.api_key is not None and not self.api_key:
            raise UserError("api_key must not be empty (omit it to disable authentication)")


@dataclass
class Counters:
    sessions_total: int = 0
    sessions_rejected: int = 0
    auth_failures: int = 0
    errors_sent: int = 0
    started: float = field(default_factory=time.time)


class SpeechServer:
    """`asr`, `lm`, `tts`: the pipelines (speechrt.pipelines) every session shares; lm and tts may be None
    (transcription only)."""

    def __init__(self, options: ServerOptions, asr, lm=None, tts=None):
        self.options = options
        self.asr, self.lm, self.tts = asr, lm, tts
        self.names = {"asr": [asr.name], "tts": [tts.name if tts is not None else DEFAULTS["tts"]]}
        self.conversation_ready = lm is not None and tts is not None
        self.vad = SileroVAD()
        self.vad_pool = ThreadPoolExecutor(2, thread_name_prefix="speechrt-vad")
        self.engine = Engine(asr, lm, max_batch=options.max_batch, tts=tts)
        self.sessions: set[RealtimeSession] = set()
        self.counters = Counters()
        self.shutting_down = False
        self._server = None
        self._watchdog = None

    # -- HTTP ------------------------------------------------------------------------------------------
    def _authorized(self, request) -> bool:
        key = self.options.api_key
        if key is None:
            return True
        auth = request.headers.get("Authorization", "")
        if auth.startswith("Bearer ") and hmac.compare_digest(auth[7:].strip(), key):
            return True
        # browsers cannot set headers on a WebSocket: the API's subprotocol form carries the key
        for proto in request.headers.get("Sec-WebSocket-Protocol", "").split(","):
            proto = proto.strip()
            if proto.startswith("openai-insecure-api-key.") and hmac.compare_digest(proto.split(".", 1)[1], key):
                return True
        return False

    def _origin_ok(self, request) -> bool:
        origin = request.headers.get("Origin")
        if origin is None or "*" in self.options.origins or origin in self.options.origins:
            return True
        host = request.headers.get("Host", "")
        return origin in (f"http://{host}", f"https://{host}")

    def _process_request(self, connection, request):
        from websockets.datastructures import Headers
        from websockets.http11 import Response

        def respond(status: int, body: bytes, ctype: str):
            h = Headers([("Content-Type", ctype), ("Content-Length", str(len(body))), ("Cache-Control", "no-store")])
            return Response(status, http.HTTPStatus(status).phrase, h, body)

        def jerr(status, message, code):
            return respond(status, json.dumps({"error": {"message": message, "type": "invalid_request_error",
                                                         "code": code}}).encode(), "application/json")

        path = urlsplit(request.path).path
        if path in REALTIME_PATHS:
            if request.headers.get("Upgrade", "").lower() != "websocket":
                return jerr(426, f"{path} is a WebSocket endpoint (OpenAI Realtime API)", "upgrade_required")
            if not self._authorized(request):
                self.counters.auth_failures += 1
                return jerr(401, "invalid or missing API key (send 'Authorization: Bearer <key>')", "invalid_api_key")
            if not self._origin_ok(request):
                return jerr(403, f"origin {request.headers.get('Origin')!r} is not allowed (start the server with "
                                 "--allow-origin to add it)", "origin_not_allowed")
            return None  # proceed with the WebSocket handshake
        if path == "/healthz":
            body = {"status": "draining" if self.shutting_down else "ok", "sessions": len(self.sessions),
                    "max_sessions": self.options.max_sessions, "models": self.names,
                    "runners": {f: str(p.info) for f, p in (("asr", self.asr), ("lm", self.lm), ("tts", self.tts)) if p},
                    "conversation": self.conversation_ready, "uptime_s": round(time.time() - self.counters.started, 1)}
            return respond(503 if self.shutting_down else 200, json.dumps(body).encode(), "application/json")
        if path == "/metrics":
            return respond(200, self.metrics_text().encode(), "text/plain; version=0.0.4")
        if path in ("/", "/index.html"):
            return respond(200, (STATIC / "index.html").read_bytes(), "text/html; charset=utf-8")
        if path == "/audio-worklet.js":
            return respond(200, (STATIC / "audio-worklet.js").read_bytes(), "text/javascript")
        return jerr(404, f"no such path {path!r}; endpoints: /v1/realtime (WebSocket), /healthz, /metrics, /", "not_found")

    def metrics_text(self) -> str:
        m = self.engine.metrics
        lines = []

        def metric(name, kind, help_, value):
            lines.extend([f"# HELP speechrt_{name} {help_}", f"# TYPE speechrt_{name} {kind}", f"speechrt_{name} {value}"])

        def summary(name, help_, samples):
            s = sorted(samples)
            lines.extend([f"# HELP speechrt_{name} {help_}", f"# TYPE speechrt_{name} summary"])
            for q in (0.5, 0.95, 0.99):
                v = s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")
                lines.append(f'speechrt_{name}{{quantile="{q}"}} {v:.6f}')
            lines.extend([f"speechrt_{name}_count {len(s)}", f"speechrt_{name}_sum {sum(s):.6f}"])

        metric("sessions_active", "gauge", "Open Realtime sessions.", len(self.sessions))
        metric("sessions_total", "counter", "Sessions admitted since start.", self.counters.sessions_total)
        metric("sessions_rejected_total", "counter", "Sessions refused (server full or shutting down).",
               self.counters.sessions_rejected)
        metric("auth_failures_total", "counter", "Handshakes refused for a bad API key.", self.counters.auth_failures)
        metric("queue_depth", "gauge", "Work items waiting for the engine.", self.engine.queue_depth())
        metric("asr_batches_total", "counter", "Transcription batches run.", m.asr_batches)
        metric("asr_utterances_total", "counter", "Utterances transcribed.", m.asr_items)
        metric("asr_partials_cancelled_total", "counter",
               "Live transcripts stopped because their turn's final transcript was asked for.", m.asr_cancelled)
        metric("asr_early_finals_total", "counter",
               "Final transcripts begun when the input went quiet, before Silero confirmed the pause.", m.early_finals)
        rtf = m.asr_seconds / m.asr_audio_seconds if m.asr_audio_seconds else 0.0
        metric("asr_real_time_factor", "gauge", "Transcription compute seconds per second of audio.", f"{rtf:.4f}")
        metric("engine_stream_steps_total", "counter", "Steps of streaming tasks (tokens, audio chunks).", m.stream_steps)
        summary("final_transcript_latency_seconds", "Queue + compute time of final transcripts.", m.final_latency)
        summary("partial_transcript_latency_seconds", "Queue + compute time of partial transcripts.", m.partial_latency)
        summary("first_audio_latency_seconds", "Response start to first audio chunk.", m.first_audio_latency)
        return "\n".join(lines) + "\n"

    # -- WebSocket ---------------------------------------------------------------------------------------
    async def _handler(self, ws):
        if self.shutting_down or len(self.sessions) >= self.options.max_sessions:
            self.counters.sessions_rejected += 1
            why = ("the server is shutting down" if self.shutting_down else
                   f"the server is full: {self.options.max_sessions} sessions at most; try again later")
            await ws.send(json.dumps(error_event(why, "session_limit_reached", "server_error")))
            await ws.close(1013, "try again later")
            return
        intent = parse_qs(urlsplit(ws.request.path).query).get("intent", [None])[0]
        session = RealtimeSession(self, ws, intent)
        self.sessions.add(session)
        self.counters.sessions_total += 1
        graceful = True
        try:
            await session.run()
        except Exception as e:  # connection dropped mid-frame etc.
            from websockets.exceptions import ConnectionClosed
            graceful = False
            if not isinstance(e, ConnectionClosed):
                log.exception("session %s failed", session.id)
        finally:
            await session.finish(graceful=graceful and not self.shutting_down)
            self.sessions.discard(session)

    async def _watch_idle(self):
        while True:
            await asyncio.sleep(min(5.0, self.options.idle_timeout / 4))
            now = time.monotonic()
            for s in list(self.sessions):
                if now - s.last_activity > self.options.idle_timeout and not s.tasks:
                    await s.error(f"session idle for more than {self.options.idle_timeout:.0f} s; closing",
                                  "idle_timeout", type="server_error")
                    await s.ws.close(1000, "idle timeout")

    async def start(self):
        from websockets.asyncio.server import serve

        self.engine.start()
        self._server = await serve(
            self._handler, self.options.host, self.options.port, process_request=self._process_request,
            max_size=self.options.max_message_bytes * 4, max_queue=64, compression=None,
            select_subprotocol=lambda conn, protos: "realtime" if "realtime" in protos else None,
            ping_interval=20, ping_timeout=60)
        self._watchdog = asyncio.create_task(self._watch_idle())
        return self

    @property
    def port(self) -> int:
        return self._server.sockets[0].getsockname()[1]

    async def shutdown(self, graceful: bool = True):
        """Stop admitting sessions; let turns and responses in flight finish (up to drain_seconds);
        then close every connection with 1001 (going away)."""
        self.shutting_down = True
        if graceful:
            busy = [t for s in self.sessions for t in s.tasks]
            if busy:
                await asyncio.wait(busy, timeout=self.options.drain_seconds)
        if self._watchdog:
            self._watchdog.cancel()
        self._server.close()
        await self._server.wait_closed()
        self.engine.stop()
        self.vad_pool.shutdown(wait=False)


async def serve_forever(server: SpeechServer):
    import signal

    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):
            pass
    print(f"speechrt: serving on http://{server.options.host}:{server.port}  "
          f"(Realtime API at ws://{server.options.host}:{server.port}/v1/realtime)", flush=True)
    await stop.wait()
    print("speechrt: shutting down, finishing turns in flight", flush=True)
    await server.shutdown(graceful=True)
