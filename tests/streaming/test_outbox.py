"""The outbox's flushing close against a client that leaves meanwhile (seen once in CI: a server shutting
down while a test's client disconnected had its shutdown aborted by the writer's cancellation)."""

from __future__ import annotations

import asyncio

from speechrt.streaming.realtime.connection import Outbox


class SlowConnection:
    """A connection whose sends take a while (a slow reader), recording how it was closed."""

    def __init__(self):
        self.sent, self.closed = [], []

    async def send(self, text):
        await asyncio.sleep(0.2)
        self.sent.append(text)

    async def close(self, code, reason=""):
        self.closed.append(code)


def test_flushing_close_survives_the_writer_being_cancelled():
    async def main():
        conn = SlowConnection()
        box = Outbox(conn, 1 << 20)
        box.start()
        assert box.put("a") and box.put("b")
        closing = asyncio.create_task(box.close(1001, "shutting down", flush=True))
        await asyncio.sleep(0.05)
        box.writer.cancel()  # the client left: its session's close cancels the writer
        await closing  # the shutdown goes on instead of being cancelled with the writer
        return conn

    conn = asyncio.run(main())
    assert conn.closed == [1001]
    assert conn.sent == []  # the first send was cut off by the cancellation: nothing was flushed after it


def test_flushing_close_still_propagates_its_own_cancellation():
    async def main():
        box = Outbox(SlowConnection(), 1 << 20)
        box.start()
        box.put("a")
        closing = asyncio.create_task(box.close(1001, "", flush=True))
        await asyncio.sleep(0.05)
        closing.cancel()
        try:
            await closing
        except asyncio.CancelledError:
            return "cancelled"
        return "finished"

    assert asyncio.run(main()) == "cancelled"
