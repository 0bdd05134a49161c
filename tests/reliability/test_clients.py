"""Clients that misbehave: they vanish mid-utterance or mid-transcript, stop reading, leave a half-open
connection, or reconnect hundreds of times. Each harms only itself; its slot and its work are freed at
once, and the server's memory, descriptors, threads and tasks come back to where they were."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import socket
import time

import pytest
from rel_helpers import (
    SENTENCES,
    ServerProcess,
    append_event,
    next_event,
    open_session,
    pcm24,
    run,
    stream_pcm,
    update,
)

from speechrt.models.wer import wer


def resources(server) -> dict:
    m = server.metrics()
    return {
        k: m[k]
        for k in (
            "process_resident_memory_bytes",
            "process_open_fds",
            "process_threads",
            "asyncio_tasks",
            "sessions_active",
        )
    }


def settled(server, baseline: dict, timeout: float = 30.0) -> dict:
    """Wait until the server is back within 10 % of the baseline's memory and 5 descriptors of its open
    files, with the baseline's threads and tasks and no session open -> the last reading."""
    deadline = time.monotonic() + timeout
    while True:
        r = resources(server)
        ok = (
            r["sessions_active"] == 0
            and r["process_open_fds"] <= baseline["process_open_fds"] + 5
            and r["process_resident_memory_bytes"] <= 1.10 * baseline["process_resident_memory_bytes"]
            and r["process_threads"] <= baseline["process_threads"]
            and r["asyncio_tasks"] <= baseline["asyncio_tasks"]
        )
        if ok or time.monotonic() > deadline:
            return r
        time.sleep(0.25)


def check_settled(server, baseline: dict, phase: str):
    r = settled(server, baseline)
    print(f"resources {phase}: {r} (baseline {baseline})")
    assert r["sessions_active"] == 0, (phase, r)
    assert r["process_open_fds"] <= baseline["process_open_fds"] + 5, (phase, r, baseline)
    assert r["process_resident_memory_bytes"] <= 1.10 * baseline["process_resident_memory_bytes"], (phase, r, baseline)
    assert r["process_threads"] <= baseline["process_threads"], (phase, r, baseline)
    assert r["asyncio_tasks"] <= baseline["asyncio_tasks"], (phase, r, baseline)


@pytest.fixture(scope="module")
def baseline(tserver, synth):
    """The transcription server's resources after one full turn (thread pools started, models warm)."""
    pcm = pcm24(synth(SENTENCES[6]), tail_s=1.0)

    async def warm():
        ws, _ = await open_session(tserver)
        await stream_pcm(ws, pcm, realtime=False)
        await next_event(ws, "conversation.item.input_audio_transcription.completed")
        await ws.close()

    run(warm(), 120)
    time.sleep(1.0)
    return settled(tserver, resources(tserver))


def test_disconnect_mid_utterance_frees_the_session_at_once(tserver, synth, baseline):
    pcm = pcm24(synth(SENTENCES[0]), tail_s=0.0)
    base = baseline

    async def main():
        ws, _ = await open_session(tserver)
        await stream_pcm(ws, pcm[: len(pcm) // 2 & ~1])  # speech started, turn open, live transcripts running
        await next_event(ws, "input_audio_buffer.speech_started")
        await ws.close()

    run(main(), 60)
    t0 = time.monotonic()
    tserver.wait_for("sessions_active", lambda v: v == 0, timeout=5)
    assert time.monotonic() - t0 < 2.0  # freed at once, not after a drain
    check_settled(tserver, base, "after a disconnect mid-utterance")


def test_disconnect_mid_final_transcript(tserver, synth):
    """Commit, then vanish before the transcript comes: the server keeps serving the next session."""
    pcm = pcm24(synth(SENTENCES[1]), tail_s=0.2)

    async def main():
        ws, _ = await open_session(tserver)
        await update(ws, {"audio": {"input": {"turn_detection": None}}})
        await ws.send(append_event(pcm))
        await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
        await next_event(ws, "input_audio_buffer.committed")
        await ws.close()
        nxt, _ = await open_session(tserver)
        await update(nxt, {"audio": {"input": {"turn_detection": None}}})
        await nxt.send(append_event(pcm))
        await nxt.send(json.dumps({"type": "input_audio_buffer.commit"}))
        done = await next_event(nxt, "conversation.item.input_audio_transcription.completed")
        await nxt.close()
        return done["transcript"]

    assert wer(SENTENCES[1], run(main(), 120)) <= 0.15
    tserver.wait_for("sessions_active", lambda v: v == 0, timeout=10)


def test_half_open_connection_is_dropped_by_ping(tserver):
    """A client that completed the handshake and then went silent (no pong, no FIN) is closed by the
    server's ping timeout and its slot freed (this server pings every 2 s, timeout 5 s)."""
    before = tserver.metrics()["sessions_active"]
    s = socket.create_connection(("127.0.0.1", tserver.port))
    key = base64.b64encode(os.urandom(16)).decode()
    s.sendall(
        f"GET /v1/realtime?intent=transcription HTTP/1.1\r\nHost: 127.0.0.1:{tserver.port}\r\n"
        f"Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
        "Sec-WebSocket-Version: 13\r\n\r\n".encode()
    )
    assert s.recv(4096).startswith(b"HTTP/1.1 101")
    tserver.wait_for("sessions_active", lambda v: v == before + 1, timeout=10)
    tserver.wait_for("sessions_active", lambda v: v == before, timeout=20)  # never answers the pings
    s.close()


def test_a_server_stopped_after_rest_and_realtime_use_prints_no_leak_warnings(synth):
    """An ended session is not kept alive: a server that transcribed an upload over REST and a Realtime session's
    24 kHz audio (both resampled by soxr, a nanobind extension) and is then stopped with Ctrl-C prints nothing
    of nanobind's "leaked instances" at exit. The idle watchdog used to keep the last session it looked at in
    its frame, and with it the session's resampler, to the interpreter's end (18 lines of warnings); it looks
    every second here (--idle-timeout 4), so it sees the session."""
    import io

    import openai
    import soundfile as sf

    from speechrt.models.audio import resample

    srv = ServerProcess("--transcription-only", "--idle-timeout", "4")
    try:
        upload = io.BytesIO()
        sf.write(upload, resample(synth(SENTENCES[0]), 16000, 44100), 44100, format="WAV")
        rest = openai.OpenAI(base_url=f"http://127.0.0.1:{srv.port}/v1", api_key="unused", max_retries=0)
        text = rest.audio.transcriptions.create(model="whisper-1", file=("a.wav", upload.getvalue())).text
        assert wer(SENTENCES[0], text) <= 0.2, text

        async def main():
            ws, _ = await open_session(srv)
            await stream_pcm(ws, pcm24(synth(SENTENCES[1])))  # in real time: the watchdog looks at the session
            ev = await next_event(ws, "conversation.item.input_audio_transcription.completed")
            await ws.close()
            return ev["transcript"]

        heard = run(main())
        assert wer(SENTENCES[1], heard) <= 0.2, heard
        srv.wait_for("sessions_active", lambda v: v == 0, timeout=10)
    finally:
        code = srv.stop(signal.SIGINT)
    err = "".join(srv.err)
    assert code == 0 and "leaked" not in err and "nanobind" not in err, err[-3000:]


def test_a_client_that_never_reads_is_closed_with_a_reason(cserver):
    """A conversation client asks for speech and never reads: the server's queue for it stays under its
    cap (256 KiB here), the session is closed with 1008 and a reason, and the server goes on."""
    text = " ".join(["The quick brown fox jumps over the lazy dog near the quiet river bank."] * 12)

    async def warm():  # the voice's first sentence loads and allocates what it keeps; measure after it
        ws, _ = await open_session(cserver, None)
        await ws.send(json.dumps({"type": "response.create", "response": {"speechrt_say": "Hello there."}}))
        done = await next_event(ws, "response.done", timeout=90)
        assert done["type"] == "response.done", done
        await ws.close()

    run(warm(), 120)
    cserver.wait_for("sessions_active", lambda v: v == 0, timeout=30)
    before = cserver.metrics()

    async def main():
        from websockets.asyncio.client import connect

        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a small window: the server's sends back up
        sock.connect(("127.0.0.1", cserver.port))
        ws = await connect(cserver.url, sock=sock, max_size=None, max_queue=1)  # reads one message ahead at most
        await ws.send(json.dumps({"type": "response.create", "response": {"speechrt_say": text}}))
        await asyncio.to_thread(
            cserver.wait_for, "slow_readers_closed_total", lambda v: v >= before["slow_readers_closed_total"] + 1, 90
        )
        code = None
        try:
            while True:  # drain what was delivered, then see the close
                await asyncio.wait_for(ws.recv(), 10)
        except Exception:  # noqa: BLE001 - ConnectionClosed carries the code
            code = ws.close_code
        return code, ws.close_reason

    code, reason = run(main(), 150)
    assert code in (1008, 1006), (code, reason)
    cserver.wait_for("sessions_active", lambda v: v == before["sessions_active"], timeout=30)
    after = cserver.metrics()
    grown = after["process_resident_memory_bytes"] - before["process_resident_memory_bytes"]
    assert grown < 200e6, f"resident memory grew {grown / 1e6:.0f} MB for one slow reader"


def test_200_reconnects_with_speech_are_all_served_and_leak_nothing(tserver, synth, baseline):
    """200 quick connect/disconnect cycles, each sending 0.5 s of speech: none is refused (the cap is 40),
    and memory, descriptors, threads and tasks return to the baseline."""
    pcm = pcm24(synth(SENTENCES[2]), tail_s=0.0)[: 24000 * 2 // 2 & ~1]
    base = baseline
    rejected = tserver.metrics()["sessions_rejected_total"]

    async def main():
        created = 0
        for _ in range(200):
            ws, first = await open_session(tserver)
            created += first["type"] == "session.created"
            await ws.send(append_event(pcm))
            await ws.close()
        return created

    assert run(main(), 300) == 200
    assert tserver.metrics()["sessions_rejected_total"] == rejected
    check_settled(tserver, base, "after 200 reconnects")
