"""A real speechrt server on loopback, run in a background thread with its own event loop."""

from __future__ import annotations

import asyncio
import contextlib
import threading

import pytest


@contextlib.contextmanager
def running_server(options, asr, lm=None, tts=None):
    from speechrt.streaming.server import SpeechServer

    loop = asyncio.new_event_loop()
    t = threading.Thread(target=loop.run_forever, daemon=True)
    t.start()
    srv = SpeechServer(options, asr, lm, tts)
    asyncio.run_coroutine_threadsafe(srv.start(), loop).result(60)
    try:
        yield srv
    finally:
        asyncio.run_coroutine_threadsafe(srv.shutdown(graceful=False), loop).result(60)
        loop.call_soon_threadsafe(loop.stop)
        t.join(10)


@pytest.fixture(scope="session")
def server_factory():
    """running_server(options, asr, lm=None, tts=None) as a context manager."""
    return running_server


@pytest.fixture(scope="module")
def transcription_server(asr):
    from speechrt.streaming.config import ServerOptions

    with running_server(ServerOptions(port=0, silence_duration_ms=300, max_sessions=40), asr) as srv:
        yield srv
