"""The speechrt server: one shared Engine (scheduler) per device, the Realtime sessions it admits, and their
limits, served over HTTP and WebSocket on one port by the ASGI app of streaming/http.py (uvicorn).

Sessions: one coroutine per connection; a cap on admitted sessions (one more is told and closed with
1013); a closed connection's work is cancelled at once; an idle session is closed; graceful shutdown
stops admitting, lets final transcripts and answers in flight finish (up to `drain_seconds`), and tells
the sessions whose work did not."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import socket
import time
from dataclasses import dataclass

from speechrt.errors import UserError

from .asr_options import FINAL_MARGIN_S, LOADED_FINAL_MARGIN_S
from .engine import Engine
from .http import UvicornServer, build_app, uvicorn_config
from .metrics import Counters, metrics_text
from .realtime.events import error_event
from .realtime.policy import TurnPolicy
from .realtime.protocol import ProtocolError, check_session_model
from .realtime.session import RealtimeSession
from .realtime.vad import SileroVAD, VadWorker

log = logging.getLogger(__name__)
WARM_UP_TIMEOUT_S = 300  # start() waits this long at most for the engine to warm the models up


@dataclass(frozen=True)
class ServerOptions:
    host: str = "127.0.0.1"
    port: int = 8765
    api_key: str | None = None
    origins: tuple[str, ...] = ()  # browser origins allowed besides loopback pages ("*" allows any)
    private_metrics: bool = False  # with api_key: /metrics and the full /healthz need the key too
    max_sessions: int = 32
    max_message_bytes: int = 1 << 20  # larger events get an error event; the session goes on
    max_frame_bytes: int = 64 << 20  # larger WebSocket frames close the connection (1009)
    max_send_queue_bytes: int = 8 << 20  # events waiting for a client that does not read; then it is closed
    socket_send_buffer: int = 256 << 10  # kernel send buffer per connection (the kernel doubles it)
    max_buffer_seconds: float = 120.0  # uncommitted input audio per session
    max_item_chars: int = 32_768  # text of one conversation item
    max_conversation_chars: int = 1 << 20  # text of all the items of a conversation
    idle_timeout: float = 300.0  # seconds without an event either way before the session is closed
    stall_timeout: float = 60.0  # seconds the engine may spend in one step before the sessions waiting are told
    drain_seconds: float = 15.0  # graceful shutdown: time given to transcripts and answers in flight
    ping_interval: float = 20.0  # WebSocket pings; a client that does not answer within ping_timeout is closed
    ping_timeout: float = 20.0
    partial_interval: float = 1.0  # seconds between live transcript updates of a turn; 0: none
    # seconds of padding after a turn's audio that its final transcript's encoder reads (asr_options.FINAL_MARGIN_S;
    # 30: whole windows). Less is faster and may lose words (python -m speechrt.bench.margin_study)
    final_margin: float = FINAL_MARGIN_S
    # the final margin while the engine is loaded (busy 90 % of the last 2 s, 30 % on other work than live
    # transcripts: transcripts.LoadedMargins); None: never less than final_margin (nor is a larger one). 3 s keeps
    # the capacity of 3-s finals on slow CPUs (docs/onnx-runtime.md)
    loaded_final_margin: float | None = LOADED_FINAL_MARGIN_S
    speculative_replies: bool = True  # begin a reply during a pause, before it ends the turn (realtime/reply.py)
    silence_duration_ms: int | None = None  # server default for server_vad (None: the API's 500 ms)
    max_batch: int = 8
    max_rest_requests: int = 16  # REST requests served at once; one more is answered 429
    max_upload_bytes: int = 25 << 20  # largest audio file /v1/audio/transcriptions accepts (413 past it)
    debug: bool = False  # /debug endpoints: fault injection into the engine (tests)

    def __post_init__(self):
        if not 0 <= self.port <= 65535:
            raise UserError(f"port must be in [0, 65535] (0 picks a free one), got {self.port}")
        if self.max_send_queue_bytes < 1024:
            raise UserError(f"max_send_queue_bytes must be >= 1024, got {self.max_send_queue_bytes}")
        if self.max_sessions < 1:
            raise UserError(f"max_sessions must be >= 1, got {self.max_sessions}")
        if self.max_batch < 1:
            raise UserError(f"max_batch must be >= 1, got {self.max_batch}")
        if self.max_rest_requests < 1:
            raise UserError(f"max_rest_requests must be >= 1, got {self.max_rest_requests}")
        if self.max_upload_bytes < 1024:
            raise UserError(f"max_upload_bytes must be >= 1024, got {self.max_upload_bytes}")
        if not 1024 <= self.max_message_bytes <= self.max_frame_bytes:
            raise UserError(
                f"max_message_bytes must be at least 1024 and at most max_frame_bytes "
                f"({self.max_frame_bytes}), got {self.max_message_bytes}"
            )
        TurnPolicy.from_options(self)  # checks the turn-taking options (final_margin, partial_interval, ...)
        for name in (
            "idle_timeout",
            "stall_timeout",
            "drain_seconds",
            "ping_interval",
            "ping_timeout",
            "max_buffer_seconds",
        ):
            if not getattr(self, name) > 0:
                raise UserError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.api_key is not None and not self.api_key:
            raise UserError("api_key must not be empty (omit it to disable authentication)")


class SpeechServer:
    """`asr`, `lm`, `tts`: the pipelines (speechrt.pipelines) every session shares; lm and tts may be None
    (transcription only)."""

    def __init__(self, options: ServerOptions, asr, lm=None, tts=None):
        self.options = options
        self.asr, self.lm, self.tts = asr, lm, tts
        # the loaded models by family (/healthz, session model and voice checks)
        self.names = {"asr": [asr.name], "lm": [lm.name] if lm is not None else [], "tts": [tts.name] if tts else []}
        self.conversation_ready = lm is not None and tts is not None
        self.vad = VadWorker(SileroVAD())
        self.turn_policy = TurnPolicy.from_options(options)  # every session's (streaming/realtime/policy.py)
        self.engine = Engine(asr, lm, max_batch=options.max_batch, tts=tts, loaded_margin=options.loaded_final_margin)
        self.sessions: set[RealtimeSession] = set()
        self.counters = Counters()
        self.shutting_down = False
        self.replica: str | None = None  # the Ray Serve replica serving it (session.created, /healthz, /metrics)
        self._stopped: asyncio.Task | None = None
        self._uvicorn = None
        self._serving: asyncio.Task | None = None
        self._watchdog: asyncio.Task | None = None
        self._socket: socket.socket | None = None

    # -- sessions ---------------------------------------------------------------------------------------
    async def serve_session(self, conn, intent: str | None, model: str | None = None):
        """Run a Realtime session on an accepted connection until either side closes it. `model`: the URL's
        ?model= (OpenAI's clients send theirs): a name this server cannot answer for ends the connection
        with an error event that lists the valid ones."""
        if self.shutting_down or self.open_sessions() >= self.options.max_sessions:
            self.counters.sessions_rejected += 1
            why = (
                "the server is shutting down"
                if self.shutting_down
                else f"the server is full: {self.options.max_sessions} sessions at most; try again later"
            )
            await conn.send(json.dumps(error_event(why, "session_limit_reached", "server_error")))
            await conn.close(1013, "try again later")
            return
        if model is not None:
            try:
                check_session_model(model, self.names, "model")
            except ProtocolError as e:
                self.counters.sessions_rejected += 1
                await conn.send(json.dumps(error_event(str(e), e.code, e.type, e.param)))
                await conn.close(1008, "unknown model")
                return
        session = RealtimeSession(self, conn, intent, model)
        self.sessions.add(session)
        self.counters.sessions_total += 1
        try:
            await session.run()
        except Exception:  # noqa: BLE001 - one session's failure never reaches the others
            log.exception("session %s failed", session.id)
        finally:
            self.sessions.discard(session)
            await session.close()

    def open_sessions(self) -> int:
        """Sessions whose connection is open: one whose client has closed no longer counts against
        --max-sessions while the events it left are dropped and its work cancelled."""
        return sum(not s.conn.closed for s in self.sessions)

    def health(self, full: bool) -> tuple[int, dict]:
        body = {"status": "draining" if self.shutting_down else "ok"}
        if full:
            body.update(
                sessions=len(self.sessions),
                max_sessions=self.options.max_sessions,
                models=self.names,
                runners={
                    f: str(p.info) for f, p in (("asr", self.asr), ("lm", self.lm), ("tts", self.tts)) if p is not None
                },
                conversation=self.conversation_ready,
                uptime_s=round(time.time() - self.counters.started, 1),
            )
            if self.replica is not None:
                body["replica"] = self.replica
        return (503 if self.shutting_down else 200), body

    def metrics_text(self) -> str:
        return metrics_text(
            len(self.sessions),
            self.engine.queue_depth(),
            self.counters,
            self.engine.metrics,
            self.vad,
            replica=self.replica,
        )

    async def _watch_idle(self):
        while True:
            await asyncio.sleep(min(5.0, self.options.idle_timeout / 4))
            now = time.monotonic()
            for s in list(self.sessions):
                if now - s.last_activity > self.options.idle_timeout:
                    await s.end(
                        f"session idle for more than {self.options.idle_timeout:g} s (no events either way); closing",
                        "idle_timeout",
                        1000,
                    )

    # -- lifecycle --------------------------------------------------------------------------------------
    async def start(self, listen: bool = True) -> SpeechServer:
        """Start the engine (returning once it has warmed the models up) and the idle watchdog; with `listen`,
        also serve build_app on options.host:port (without it another ASGI server serves the app: Ray Serve's
        ingress, streaming/scale.py)."""
        self.engine.start()
        # ready means warm: a first session's turns do not wait behind the models' first runs
        if not await asyncio.to_thread(self.engine.wait_warm, WARM_UP_TIMEOUT_S):
            log.warning("the engine has not warmed up in %d s; serving anyway", WARM_UP_TIMEOUT_S)
        self._watchdog = asyncio.create_task(self._watch_idle())
        if not listen:
            return self
        self._socket = listen_socket(self.options.host, self.options.port)
        # accepted connections inherit it: what a client that stops reading can hold up in the kernel is bounded
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.options.socket_send_buffer)
        self._uvicorn = UvicornServer(uvicorn_config(build_app(self), self.options))
        self._serving = asyncio.create_task(self._uvicorn.serve(sockets=[self._socket]))
        while not self._uvicorn.started:
            if self._serving.done():  # it failed to start: raise its error
                await self._serving
            await asyncio.sleep(0.01)
        return self

    @property
    def port(self) -> int:
        return self._socket.getsockname()[1]

    async def shutdown(self, graceful: bool = True, notice: str | None = None):
        """Stop admitting sessions; with `graceful`, let final transcripts and answers in flight finish (up
        to drain_seconds) while live transcripts stop; then tell the sessions whose work did not finish
        (with `notice`: every session, in those words), close every connection with 1001 (going away), and
        stop. A second call waits for the first."""
        if self._stopped is None:
            self._stopped = asyncio.ensure_future(self._shutdown(graceful, notice))
        await asyncio.shield(self._stopped)

    async def _shutdown(self, graceful: bool, notice: str | None):
        self.shutting_down = True
        if self._watchdog:
            self._watchdog.cancel()
        sessions = list(self.sessions)
        if graceful:  # (again until none is left: a turn being committed as the drain began joins late)
            deadline = time.monotonic() + self.options.drain_seconds
            while (pending := [t for s in sessions for t in s.drain()]) and time.monotonic() < deadline:
                await asyncio.wait(pending, timeout=deadline - time.monotonic())
        for s in sessions:
            unfinished = graceful and s.has_essential_work()
            why = notice or "the server is shutting down"
            await s.end(
                why + (": work in flight was not finished" if unfinished else ""),
                "server_shutting_down",
                1001,
                error=unfinished or not graceful or notice is not None,
            )
        if self._uvicorn is not None:
            self._uvicorn.should_exit = True
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._serving, 15)
        self.engine.stop()
        self.vad.close()


def listen_socket(host: str, port: int) -> socket.socket:
    """A listening socket on host:port, or a UserError that says why not (the port is taken, the address
    is not this machine's)."""
    try:
        return socket.create_server((host, port))
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            raise UserError(
                f"{host}:{port} is in use (another server, or a speechrt serve still running?): stop "
                "it, or choose another --port (0 picks a free one)"
            ) from None
        raise UserError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None


async def serve_forever(server: SpeechServer):
    import signal

    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    print(
        f"speechrt: serving on http://{server.options.host}:{server.port}  "
        f"(Realtime API at ws://{server.options.host}:{server.port}/v1/realtime)",
        flush=True,
    )
    await stop.wait()
    print("speechrt: shutting down, finishing turns in flight", flush=True)
    await server.shutdown(graceful=True)
