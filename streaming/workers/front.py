"""The front process of `speechrt serve --workers N`: it holds the port, starts the N worker processes (each with its
own models and engine) and replaces one that dies, hands each accepted connection to the least-loaded worker
(socket.send_fds over a Unix socket pair; the worker serves it from then on, so a WebSocket stays on its worker for
life), and on SIGTERM/SIGINT has every worker drain as one server does."""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import shutil
import signal
import socket
import sys
import tempfile

from ..config import ServerConfig
from ..listen import listen_socket
from .board import Board

DRAIN_GRACE_S = 30  # a worker still running this long after its drain time is killed


def worker_main(*args) -> None:
    """A worker process's entry: streaming/workers/worker.py, imported there only (the front stays light: no
    models, no torch)."""
    from .worker import main

    main(*args)


def worker_threads(config: ServerConfig, workers: int) -> int:
    """PyTorch threads per worker: --threads, else this process's cores shared out (at least one each)."""
    return config.models.threads or max(1, len(os.sched_getaffinity(0)) // workers)


class Front:
    """Starts and watches the workers, and places the accepted connections on them."""

    def __init__(self, config: ServerConfig, workers: int):
        self.config, self.n = config, workers
        self.folder = tempfile.mkdtemp(prefix="speechrt-workers-")
        self.board = Board(workers, self.folder)
        self.procs: list = [None] * workers
        self.channels: list[socket.socket | None] = [None] * workers
        self.watchers: list[asyncio.Task | None] = [None] * workers
        self.stopping = False
        self.failed: str | None = None
        self.turn = 0  # the worker first in line among equally loaded ones (round robin)
        self.changed = asyncio.Event()  # a worker became ready, or one failed

    # -- workers ----------------------------------------------------------------------------------------
    def spawn(self, i: int) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.board.forget(i)
        args = (i, self.config, self.board, theirs, worker_threads(self.config, self.n))
        p = multiprocessing.get_context("spawn").Process(target=worker_main, args=args, name=f"speechrt-worker-{i}")
        p.start()
        theirs.close()
        ours.setblocking(False)
        self.board.pids[i] = p.pid
        self.procs[i], self.channels[i] = p, ours
        self.watchers[i] = asyncio.create_task(self.watch(i, p, ours))

    async def watch(self, i: int, p, channel: socket.socket) -> None:
        """Mark worker i ready when it says so; when it is gone (its end of the channel closes), zero its counts
        and start another (unless the server is stopping, or it died before it was ever ready)."""
        loop, ready = asyncio.get_running_loop(), False
        while True:
            try:
                msg = await loop.sock_recv(channel, 16)
            except OSError:
                msg = b""
            if not msg:
                break
            ready = True
            self.board.ready[i] = 1
            self.changed.set()
        self.board.ready[i] = 0
        channel.close()
        await asyncio.to_thread(p.join)
        self.board.forget(i)
        if self.stopping:
            return
        if not ready:
            self.failed = f"worker {i} exited with code {p.exitcode} before it served"
            self.changed.set()
            return
        print(
            f"speechrt: worker {i} (pid {p.pid}) exited with code {p.exitcode}; its sessions ended; starting another",
            flush=True,
        )
        self.board.restarts[0] += 1
        self.spawn(i)

    def ready(self) -> list[int]:
        return [i for i in range(self.n) if self.board.ready[i]]

    # -- connections ------------------------------------------------------------------------------------
    async def accept(self, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            conn, _ = await loop.sock_accept(listener)
            with conn:
                await self.hand(conn)

    async def hand(self, conn: socket.socket) -> None:
        """Hand `conn` to the ready worker with the fewest WebSocket calls and connections on their way (then
        the next in turn); while none is ready (all being replaced), wait."""
        while True:
            ready = self.ready()
            if not ready:
                self.changed.clear()
                await self.changed.wait()
                continue
            i = min(ready, key=lambda j: (self.board.load(j), (j - self.turn) % self.n))
            self.turn = (i + 1) % self.n
            self.board.handed[i] += 1
            try:
                socket.send_fds(self.channels[i], [b"C"], [conn.fileno()])
                return
            except BlockingIOError:  # its channel is full for now (a worker not reading): try again, maybe another
                self.board.handed[i] -= 1
                await asyncio.sleep(0.01)
            except OSError:  # the worker is gone: its watcher will see it and start another
                self.board.handed[i] -= 1
                self.board.ready[i] = 0

    # -- the whole server -------------------------------------------------------------------------------
    async def serve(self) -> int:
        o = self.config.options
        listener = listen_socket(o.host, o.port)
        # accepted connections inherit it (as one server's do): what a client that stops reading holds is bounded
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, o.socket_send_buffer)
        listener.setblocking(False)
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        for i in range(self.n):
            self.spawn(i)
        stopped = asyncio.create_task(stop.wait())
        while len(self.ready()) < self.n and not self.failed and not stop.is_set():
            self.changed.clear()
            await asyncio.wait([stopped, asyncio.create_task(self.changed.wait())], return_when="FIRST_COMPLETED")
        accepting = asyncio.create_task(self.accept(listener))
        if not self.failed and not stop.is_set():
            port = listener.getsockname()[1]
            print(
                f"speechrt: serving on http://{o.host}:{port}  (Realtime API at ws://{o.host}:{port}/v1/realtime; "
                f"{self.n} workers, pids {' '.join(str(p.pid) for p in self.procs)})",
                flush=True,
            )
            while not self.failed and not stop.is_set():
                self.changed.clear()
                await asyncio.wait([stopped, asyncio.create_task(self.changed.wait())], return_when="FIRST_COMPLETED")
        await self.stop_workers()
        accepting.cancel()
        listener.close()
        shutil.rmtree(self.folder, ignore_errors=True)
        if self.failed:
            print(f"speechrt: {self.failed}; stopping", file=sys.stderr, flush=True)
            return 1
        return 0

    async def stop_workers(self) -> None:
        """Every worker drains as one server does (SIGTERM); new connections still reach those draining (they are
        told the server is shutting down); one still running after the drain time and a grace is killed."""
        self.stopping = True
        print("speechrt: shutting down, finishing turns in flight", flush=True)
        for p in self.procs:
            if p is not None and p.is_alive():
                p.terminate()
        watching = [w for w in self.watchers if w is not None]
        _, late = await asyncio.wait(watching, timeout=self.config.options.drain_seconds + DRAIN_GRACE_S)
        if late:
            for p in self.procs:
                if p is not None and p.is_alive():
                    p.kill()
            await asyncio.wait(late)


def run(config: ServerConfig, workers: int) -> int:
    """`speechrt serve --workers N` (N > 1): serve until SIGTERM/SIGINT; the exit status."""
    with contextlib.suppress(KeyboardInterrupt):
        return asyncio.run(Front(config, workers).serve())
    return 0
