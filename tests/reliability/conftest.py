"""The reliability suite drives real `speechrt serve` processes over loopback, the way production traffic
does. Servers run with --debug-endpoints (fault injection) and short ping intervals; resources are read
from /metrics (RSS, open descriptors, threads, event-loop tasks)."""

from __future__ import annotations

import pytest
from rel_helpers import ServerProcess


@pytest.fixture(scope="session")
def tserver():
    """A transcription-only server (short pings: a silent client is dropped within about 7 s)."""
    srv = ServerProcess(
        "--transcription-only",
        "--max-sessions",
        "40",
        "--silence-duration-ms",
        "300",
        "--ping-interval",
        "2",
        "--ping-timeout",
        "5",
    )
    yield srv
    assert srv.stop() == 0


@pytest.fixture(scope="session")
def cserver():
    """A conversation server (speech recognition, language model, voice), with a small send queue."""
    srv = ServerProcess(
        "--max-sessions",
        "16",
        "--max-send-queue-bytes",
        "262144",
        "--stall-timeout",
        "10",
        "--silence-duration-ms",
        "300",
    )
    yield srv
    assert srv.stop() == 0
