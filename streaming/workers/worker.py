"""One worker process of `speechrt serve --workers N`: its own models, Engine and SpeechServer, serving the
connections the front process hands it (socket.recv_fds) with uvicorn, under the session cap it shares."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import sys
import time

from speechrt.errors import UserError

from ..http.app import build_app
from ..server import SpeechServer
from . import figures

log = logging.getLogger(__name__)
PUBLISH_S = 0.5  # how often a worker publishes its figures for the others' /metrics and /healthz
UNSEEN_S = 10.0  # a handed connection that sent no request for this long no longer counts as coming


class WorkerServer(SpeechServer):
    """A SpeechServer that is worker `index` of several: its sessions count against the cap of them all (the
    Board's admission), its /healthz and /metrics speak for them all, and its connections come from the front."""

    def __init__(self, options, asr, lm=None, tts=None, *, index: int, board):
        super().__init__(options, asr, lm, tts)
        self.index, self.board = index, board
        self.replica = f"worker-{index}"  # session.created names it ("speechrt": {"replica": ...})
        self.coming: dict[tuple, float] = {}  # peer address -> when its connection was handed in, until it asks
        self.stop = asyncio.Event()

    # -- the shared caps (sessions, REST requests) ---------------------------------------------------------------------
    def has_room(self) -> bool:
        return self.board.admit(self.board.sessions, self.index, self.open_sessions(), self.options.max_sessions)

    def sessions_changed(self) -> None:
        self.board.set_count(self.board.sessions, self.index, self.open_sessions())

    def rest_room(self, active: int) -> bool:
        return self.board.admit(self.board.rest, self.index, active, self.options.max_rest_requests)

    def rest_changed(self, active: int) -> None:
        self.board.set_count(self.board.rest, self.index, active)

    # -- the whole server's health and figures ----------------------------------------------------------
    def rows(self) -> list[dict]:
        return [figures.snapshot(self, self.index), *self.board.published(skip=self.index)]

    def health(self, full: bool) -> tuple[int, dict]:
        status, body = super().health(full)
        ready = sum(self.board.ready) or 1  # (this one answers: it is up)
        if not self.shutting_down and ready < self.board.workers:
            body["status"] = "degraded"  # a worker is being replaced; the others serve
        if full:
            rows = self.rows()
            body.pop("replica", None)
            body.update(
                sessions=sum(r["sessions"] for r in rows),
                workers=[
                    {"worker": r["worker"], "pid": r["pid"], "sessions": r["sessions"], "draining": r["draining"]}
                    for r in sorted(rows, key=lambda r: r["worker"])
                ],
                workers_configured=self.board.workers,
            )
        return status, body

    def metrics_text(self) -> str:
        return figures.page(self.rows(), self.board.restarts[0])

    # -- connections from the front ---------------------------------------------------------------------
    def tracked(self, app):
        """The ASGI app, counting for the front's placement: a handed connection reaching it (taken), and
        WebSocket calls in progress (calls)."""
        board, i = self.board, self.index

        async def asgi(scope, receive, send):
            if scope["type"] not in ("http", "websocket"):
                return await app(scope, receive, send)
            if self.coming.pop(tuple(scope.get("client") or ()), None) is not None:
                board.taken[i] += 1
            if scope["type"] == "http":
                return await app(scope, receive, send)
            board.calls[i] += 1
            try:
                return await app(scope, receive, send)
            finally:
                board.calls[i] -= 1

        return asgi

    def take(self, channel: socket.socket, uv) -> None:
        """Read the connections the front handed in (one descriptor per message) and serve each with uvicorn's
        protocol, as its own listener would; the channel's end means the front is gone: stop."""
        loop = asyncio.get_running_loop()
        while True:
            try:
                msg, fds, _, _ = socket.recv_fds(channel, 1, 1)
            except BlockingIOError:
                return
            except OSError:
                msg, fds = b"", []
            if not msg and not fds:
                loop.remove_reader(channel.fileno())
                self.stop.set()
                return
            for fd in fds:
                conn = socket.socket(fileno=fd)
                try:
                    self.coming[tuple(conn.getpeername()[:2])] = time.monotonic()
                except OSError:  # the client left already
                    conn.close()
                    self.board.taken[self.index] += 1
                    continue
                protocol = _protocol_factory(uv)
                asyncio.ensure_future(loop.connect_accepted_socket(protocol, conn))

    async def publish(self) -> None:
        while True:
            now = time.monotonic()
            for peer in [p for p, t in self.coming.items() if now - t > UNSEEN_S]:
                del self.coming[peer]
                self.board.taken[self.index] += 1
            self.sessions_changed()  # (a session whose client closed no longer counts against the cap)
            self.board.publish(self.index, figures.snapshot(self, self.index))
            await asyncio.sleep(PUBLISH_S)

    async def run(self, channel: socket.socket) -> None:
        """Serve until SIGTERM/SIGINT (or the front's end), then drain as one server does."""
        await self.start(listen=False)
        uv = await self.serve_http([], self.tracked(build_app(self)))
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self.stop.set)
        publishing = asyncio.create_task(self.publish())
        await asyncio.sleep(0)  # (published once before the front counts it in)
        channel.setblocking(False)
        loop.add_reader(channel.fileno(), self.take, channel, uv)
        channel.send(b"R")  # ready
        await self.stop.wait()
        await self.shutdown(graceful=True)
        publishing.cancel()
        with contextlib.suppress(OSError, ValueError):
            loop.remove_reader(channel.fileno())


def _protocol_factory(uv):
    """uvicorn's HTTP protocol for a connection of `uv` (what uvicorn.Server.startup builds for its listeners)."""
    config = uv.config

    def protocol():
        return config.http_protocol_class(config=config, server_state=uv.server_state, app_state=uv.lifespan.state)

    return protocol


def main(index: int, config, board, channel: socket.socket, threads: int) -> None:
    """A worker process's entry (multiprocessing, spawned): load the models, serve, exit 0 once drained; exit
    1 with one line on stderr if the models cannot load."""
    import torch

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # (the front tells the workers when to stop; until serving)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    torch.set_num_threads(threads)
    try:
        asr, lm, tts = config.models.load()
    except UserError as e:
        print(f"speechrt: worker {index}: {e}", file=sys.stderr, flush=True)
        sys.exit(1)
    server = WorkerServer(config.options, asr, lm, tts, index=index, board=board)
    asyncio.run(server.run(channel))
