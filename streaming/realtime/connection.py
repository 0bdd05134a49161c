"""A session's connection: the events going out (Outbox, bounded in bytes) and the client's events coming in,
read ahead of the one being handled (serve_events, read_ahead)."""

from __future__ import annotations

import asyncio
import time


class Outbox:
    """Events on their way to one client: a queue drained by one writer task, bounded in bytes. A client
    that stops reading fills it up, and `put` says so (the session is then closed: its memory stays
    bounded whatever the client does)."""

    def __init__(self, conn, max_bytes: int):
        self.conn, self.max_bytes = conn, max_bytes
        self.queue: asyncio.Queue = asyncio.Queue()
        self.size = 0
        self.writer: asyncio.Task | None = None

    def start(self):
        self.writer = asyncio.create_task(self._write())

    def put(self, text: str) -> bool:
        if self.size + len(text) > self.max_bytes:
            return False
        self.size += len(text)
        self.queue.put_nowait(text)
        return True

    async def _write(self):
        while True:
            item = await self.queue.get()
            if isinstance(item, tuple):  # (code, reason): close after what was queued before it
                return await self.conn.close(*item)
            try:
                await self.conn.send(item)
            except Exception:  # noqa: BLE001 - the connection is gone: the receive loop ends the session
                return await self.conn.close(1011, "send failed")
            finally:
                self.size -= len(item)

    async def close(self, code: int, reason: str, flush: bool, timeout: float = 5.0):
        """Close the connection; with `flush`, after the events queued so far (for at most `timeout`)."""
        if flush and self.writer is not None and not self.writer.done():
            self.queue.put_nowait((code, reason))
            try:
                await asyncio.wait_for(asyncio.shield(self.writer), timeout)
            except asyncio.TimeoutError:
                pass
            except asyncio.CancelledError:
                # the writer was cancelled meanwhile (the client left and its session closed): nothing more
                # to flush, and the caller (a server shutting down) goes on; a cancellation of the caller
                # itself still propagates
                me = asyncio.current_task()
                if not self.writer.cancelled() or (me is not None and getattr(me, "cancelling", lambda: 0)()):
                    raise
        if self.writer is not None:
            self.writer.cancel()
        await self.conn.close(code, reason)


READ_AHEAD = 2  # client events read while one is handled (at most 2 x --max-message-bytes held a session)


async def serve_events(session):
    """Handle a session's client events in order until its connection closes, read by read_ahead."""
    inbox: asyncio.Queue = asyncio.Queue(READ_AHEAD)
    reader = asyncio.create_task(read_ahead(session, inbox))
    try:
        while (message := await inbox.get()) is not None and not session.conn.closed:
            await session.handle(message)
    finally:
        reader.cancel()
    if reader.done() and not reader.cancelled() and reader.exception() is not None:
        raise reader.exception()


async def read_ahead(session, inbox: asyncio.Queue):
    """A session's reader: its client's events into `inbox`, READ_AHEAD ahead of the one being handled, so that
    a client's close is seen at once, not after its last events' work (their VAD under load): the connection
    counts as closed (SpeechServer.open_sessions) and the events it left unhandled are dropped with its work."""
    try:
        while (message := await session.conn.receive()) is not None:
            session.last_activity = time.monotonic()
            await inbox.put(message)  # waits while READ_AHEAD are queued: a flooding client is held back
    except Exception:  # a broken connection, not a close: the handler stops after the queued events too
        await session.conn.close(1011, "internal error")
        raise  # (serve_events raises it once the handler is done)
    finally:
        if not inbox.full():  # (full: the handler sees the closed connection before it needs the end mark)
            inbox.put_nowait(None)
