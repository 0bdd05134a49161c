"""The speechrt server: one shared Engine (scheduler) per device, the Realtime sessions it admits, and their
limits (config.ServerOptions), served over HTTP and WebSocket on one port by the ASGI app of streaming/http/app.py
(uvicorn).

Sessions: one coroutine per connection; a cap on admitted sessions (one more is told and closed with
1013); a closed connection's work is cancelled at once; an idle session is closed; graceful shutdown
stops admitting, lets final transcripts and answers in flight finish (up to `drain_seconds`), and tells
the sessions whose work did not."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import time

from speechrt.pipelines.tool_calls import BARE

from .config import ServerOptions
from .engine import Engine
from .http.app import UvicornServer, build_app, uvicorn_config
from .http.metrics import Counters, LoopClock, metrics_text
from .listen import listen_socket
from .realtime.events import error_event
from .realtime.policy import TurnPolicy
from .realtime.protocol import ProtocolError, check_session_model
from .realtime.session import RealtimeSession
from .realtime.vad import VadWorker, silero_for

log = logging.getLogger(__name__)
WARM_UP_TIMEOUT_S = 300  # start() waits this long at most for the engine to warm the models up


class SpeechServer:
    """`asr`, `lm`, `tts`: the pipelines (speechrt.pipelines) every session shares; lm and tts may be None
    (transcription only)."""

    def __init__(self, options: ServerOptions, asr, lm=None, tts=None):
        self.options = options
        self.asr, self.lm, self.tts = asr, lm, tts
        # the loaded models by family (/healthz, session model and voice checks)
        self.names = {"asr": [asr.name], "lm": [lm.name] if lm is not None else [], "tts": [tts.name] if tts else []}
        self.conversation_ready = lm is not None and tts is not None
        self.call_format = getattr(lm, "call_format", BARE)  # how the language model writes a tool call
        # every stream's Silero in one batched call per tick, on the recognizer's device
        self.vad = VadWorker(silero_for(getattr(getattr(asr, "runner", None), "device", "cpu")))
        self.turn_policy = TurnPolicy.from_options(options)  # every session's (streaming/realtime/policy.py)
        self.engine = Engine(asr, lm, max_batch=options.max_batch, tts=tts, loaded_margin=options.loaded_final_margin)
        self.sessions: set[RealtimeSession] = set()
        self.counters = Counters()
        self.loop_clock = LoopClock()  # the event loop's CPU per session (/metrics)
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
        if self.shutting_down or not self.has_room():
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
                self.sessions_changed()
                await conn.send(json.dumps(error_event(str(e), e.code, e.type, e.param)))
                await conn.close(1008, "unknown model")
                return
        session = RealtimeSession(self, conn, intent, model)
        self.sessions.add(session)
        self.counters.sessions_total += 1
        self.loop_clock.opened(session)
        try:
            await session.run()
        except Exception:  # noqa: BLE001 - one session's failure never reaches the others
            log.exception("session %s failed", session.id)
        finally:
            self.loop_clock.closed(session)
            self.sessions.discard(session)
            self.sessions_changed()
            await session.close()

    def has_room(self) -> bool:
        """Whether one more session may be admitted (--max-sessions); the session is added at once, with no wait
        in between. A server sharing its cap with others (streaming/workers) answers for all of them."""
        return self.open_sessions() < self.options.max_sessions

    def sessions_changed(self) -> None:
        """Called when a session admitted by has_room ended or was turned away after it (a shared cap updates)."""

    def rest_room(self, active: int) -> bool:
        """Whether one more REST request may run, `active` running here (--max-rest-requests); it starts at once."""
        return active < self.options.max_rest_requests

    def rest_changed(self, active: int) -> None:
        """Called when a REST request admitted by rest_room ended, `active` still running here."""

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
            self.engine.figures(),
            self.vad,
            replica=self.replica,
            loop=self.loop_clock,
        )

    async def _watch_idle(self):
        while True:
            await asyncio.sleep(min(5.0, self.options.idle_timeout / 4))
            # in a call of its own: no session stays referenced from this frame between rounds (a loop variable
            # here kept the last session looked at, and its resamplers, alive after it ended: to the process's
            # end once shutdown cancelled this task, where nanobind printed soxr's "leaked instances")
            await self._close_idle_sessions()

    async def _close_idle_sessions(self):
        now = time.monotonic()
        for s in [s for s in self.sessions if now - s.last_activity > self.options.idle_timeout]:
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
        self.loop_clock.bind()  # (start runs on the event loop's thread)
        # ready means warm: a first session's turns do not wait behind the models' first runs
        if not await asyncio.to_thread(self.engine.wait_warm, WARM_UP_TIMEOUT_S):
            log.warning("the engine has not warmed up in %d s; serving anyway", WARM_UP_TIMEOUT_S)
        self._watchdog = asyncio.create_task(self._watch_idle())
        if not listen:
            return self
        self._socket = listen_socket(self.options.host, self.options.port)
        # accepted connections inherit it: what a client that stops reading can hold up in the kernel is bounded
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.options.socket_send_buffer)
        await self.serve_http([self._socket], build_app(self))
        return self

    async def serve_http(self, sockets: list[socket.socket], app) -> UvicornServer:
        """Serve the ASGI `app` with uvicorn on the listening `sockets` (none: connections are handed in one by
        one, streaming/workers); return once it serves. shutdown() stops it."""
        self._uvicorn = UvicornServer(uvicorn_config(app, self.options))
        self._serving = asyncio.create_task(self._uvicorn.serve(sockets=sockets))
        while not self._uvicorn.started:
            if self._serving.done():  # it failed to start: raise its error
                await self._serving
            await asyncio.sleep(0.01)
        return self._uvicorn

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
            await asyncio.wait([self._watchdog])  # ended, and not kept: nothing of its frame outlives the server
            self._watchdog = None
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
