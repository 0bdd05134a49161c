"""streaming.realtime.connection.serve_events / read_ahead: a session's events are handled in order, a client's close is
seen while an event is still being handled (the rest are dropped), and a broken connection ends the session
with its error instead of hanging it. A small in-memory connection stands in for the WebSocket here; the
server-level behaviour runs against a real server in test_transcription_server.py."""

from __future__ import annotations

import asyncio

import pytest

from speechrt.streaming.realtime.connection import READ_AHEAD, serve_events


class Conn:
    """Delivers `events` (an Exception among them is raised there), then reports the close."""

    def __init__(self, events):
        self.events, self.closed, self.close_code = list(events), False, None

    async def receive(self):
        await asyncio.sleep(0)
        if not self.events:
            self.closed = True
            return None
        e = self.events.pop(0)
        if isinstance(e, Exception):
            raise e
        return e

    async def close(self, code, reason=""):
        self.closed, self.close_code = True, code


class Session:
    def __init__(self, events, slow: set = frozenset()):
        self.conn, self.handled, self.slow, self.last_activity = Conn(events), [], slow, 0.0

    async def handle(self, message):
        if message in self.slow:
            await asyncio.sleep(0.2)  # this event's work (VAD under load) outlasts the client
        self.handled.append((message, self.conn.closed))


def test_events_are_handled_in_order():
    s = Session([f"e{i}" for i in range(10)])
    asyncio.run(serve_events(s))
    assert [m for m, _ in s.handled] == [f"e{i}" for i in range(10)] and s.last_activity > 0


def test_a_close_is_seen_while_an_event_is_handled_and_the_rest_are_dropped():
    s = Session(["a", "b", "c"], slow={"a"})
    asyncio.run(serve_events(s))
    assert s.handled == [("a", True)]  # the close came in while "a" was handled; "b" and "c" were dropped
    assert READ_AHEAD >= 2


@pytest.mark.parametrize("before", [0, 1, 5])
def test_a_broken_connection_ends_the_session_with_its_error(before):
    s = Session([f"e{i}" for i in range(before)] + [OSError("connection reset")], slow={"e0"})
    with pytest.raises(OSError, match="connection reset"):
        asyncio.run(asyncio.wait_for(serve_events(s), 5))  # never a hang, whatever was queued
    assert s.conn.closed and s.conn.close_code == 1011
