"""`speechrt serve --workers 2` as a user runs it (a subprocess, two worker processes on two cores), with real
WebSocket clients and real speech: sessions spread over the workers with their own correct transcripts, one cap
across them, one /metrics that sums them, a killed worker ends only its own sessions and is replaced, and SIGTERM
drains every worker. The cases share one server, in order (the last one stops it)."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
from test_transcription_server import SENTENCES, pcm24  # tests/streaming (pytest puts it on sys.path)

from speechrt.models.wer import wer

CAP = 4


class Served:
    """The server process, its port and what it printed."""

    def __init__(self, tmp):
        self.log = open(tmp / "serve.log", "w+")  # noqa: SIM115 - closed by stop()
        args = [sys.executable, "-m", "speechrt", "serve", "--workers", "2", "--transcription-only"]
        args += ["--backend", "torch", "--port", "0", "--max-sessions", str(CAP), "--drain-seconds", "20"]
        args += ["--max-rest-requests", "1"]
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        self.port = None
        deadline = time.monotonic() + 240
        while self.port is None and time.monotonic() < deadline and self.proc.poll() is None:
            time.sleep(0.5)
            m = re.search(r"serving on http://127.0.0.1:(\d+)", self.text())
            self.port = int(m.group(1)) if m else None
        assert self.port is not None, f"the server did not start:\n{self.text()}"

    def text(self) -> str:
        self.log.seek(0)
        return self.log.read()

    def get(self, path: str):
        body = urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=30).read().decode()
        return json.loads(body) if path == "/healthz" else body

    def stop(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)
        self.log.close()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    s = Served(tmp_path_factory.mktemp("workers"))
    yield s
    s.stop()


async def session(served, sentence: int | None = None):
    """A transcription session: (websocket, the worker it is on); with `sentence`, that sentence's audio sent
    and committed (turn detection off), the commit acknowledged."""
    from websockets.asyncio.client import connect

    ws = await connect(f"ws://127.0.0.1:{served.port}/v1/realtime?intent=transcription", max_size=None)
    created = json.loads(await ws.recv())
    assert created["type"] == "session.created", created
    if sentence is not None:
        await say(ws, sentence)
    return ws, created["speechrt"]["replica"]


async def say(ws, sentence: int):
    await ws.send(json.dumps({"type": "session.update", "session": {"audio": {"input": {"turn_detection": None}}}}))
    await next_event(ws, "session.updated")
    audio = base64.b64encode(pcm24(SPEECH[sentence], tail_s=0.2)).decode()
    await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": audio}))
    await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
    await next_event(ws, "input_audio_buffer.committed")


async def next_event(ws, type_: str, timeout: float = 120) -> dict:
    while True:
        ev = json.loads(await asyncio.wait_for(ws.recv(), timeout))
        if ev["type"] in (type_, "error"):
            assert ev["type"] == type_, ev
            return ev


async def transcript(ws) -> str:
    return (await next_event(ws, "conversation.item.input_audio_transcription.completed"))["transcript"]


SPEECH: dict[int, object] = {}


@pytest.fixture(scope="module", autouse=True)
def speech(synth):
    SPEECH.update({i: synth(SENTENCES[i]) for i in range(6)})


def worker_pids(served) -> dict[str, int]:
    return {f"worker-{w['worker']}": w["pid"] for w in served.get("/healthz")["workers"]}


def metric(text: str, name: str) -> dict[str, float]:
    """The samples of speechrt_<name>: {labels: value} ('' for none)."""
    return {
        m.group(1) or "": float(m.group(2)) for m in re.finditer(rf"^speechrt_{name}(\{{[^}}]*\}})? (\S+)$", text, re.M)
    }


def test_sessions_spread_over_the_workers_under_one_cap(served):
    async def main():
        opened = await asyncio.gather(*(session(served, i) for i in range(CAP)))
        assert sorted(w for _, w in opened) == ["worker-0", "worker-0", "worker-1", "worker-1"]
        # one more than the cap of all the workers together: told, and closed with 1013
        from websockets.asyncio.client import connect

        extra = await connect(f"ws://127.0.0.1:{served.port}/v1/realtime?intent=transcription")
        refused = json.loads(await extra.recv())
        assert refused["type"] == "error" and refused["error"]["code"] == "session_limit_reached", refused
        assert f"{CAP} sessions" in refused["error"]["message"]
        await asyncio.wait_for(extra.wait_closed(), 10)
        assert extra.close_code == 1013
        said = await asyncio.gather(*(transcript(ws) for ws, _ in opened))
        for i, text in enumerate(said):
            assert wer(SENTENCES[i], text) <= 0.15, (SENTENCES[i], text)
        for ws, _ in opened:
            await ws.close()

    asyncio.run(asyncio.wait_for(main(), 300))


def test_metrics_sum_the_workers(served):
    async def main():
        opened = await asyncio.gather(*(session(served) for _ in range(2)))
        assert {w for _, w in opened} == {"worker-0", "worker-1"}
        deadline = time.monotonic() + 30  # each worker publishes its figures twice a second
        while True:
            page = served.get("/metrics")
            per = metric(page, "worker_sessions_active")
            if sorted(per.values()) == [1, 1] or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
        for ws, _ in opened:
            await ws.close()
        return page

    page = asyncio.run(asyncio.wait_for(main(), 120))
    assert metric(page, "workers") == {"": 2}
    for name in ("sessions_active", "sessions_total", "sessions_rejected_total", "asr_utterances_total"):
        per = metric(page, f"worker_{name}")
        assert len(per) == 2 and metric(page, name)[""] == sum(per.values()), (name, per, metric(page, name))
    assert sorted(metric(page, "worker_sessions_active").values()) == [1, 1]
    assert metric(page, "sessions_rejected_total")[""] >= 1  # the one over the cap, refused by either worker
    # the host's cost per stream, summed over the workers' event loops (both served a session for a while)
    assert metric(page, "event_loop_cpu_seconds_total")[""] > 0 and metric(page, "session_seconds_total")[""] > 0
    assert 0 < metric(page, "host_cpu_per_session")[""] < 2 and metric(page, "vad_ticks_total")[""] >= 0


def test_the_rest_limit_holds_across_workers(served):
    """Two uploads begun at once go to the two workers (placement); with --max-rest-requests 1 for the whole
    server, one of them is answered 429 while the other's slot is held by its unfinished body."""
    head = (
        b"POST /v1/audio/transcriptions HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; boundary=b\r\n"
        b"Content-Length: 100000\r\n\r\n--b\r\n"
    )
    uploads = [socket.create_connection(("127.0.0.1", served.port)) for _ in range(2)]
    try:
        for u in uploads:
            u.sendall(head)
        readable, _, _ = select.select(uploads, [], [], 60)
        assert readable, "neither upload was refused: the REST limit did not hold across the workers"
        refused, answer = readable[0], b""
        refused.settimeout(30)
        while b"rate_limit_exceeded" not in answer and (more := refused.recv(65536)):  # head, then body
            answer += more
        assert answer.startswith(b"HTTP/1.1 429") and b"rate_limit_exceeded" in answer, answer
    finally:
        for u in uploads:
            u.close()


def test_a_killed_worker_ends_only_its_sessions_and_is_replaced(served):
    from websockets.exceptions import ConnectionClosed

    async def main():
        (a, wa), (b, wb) = await asyncio.gather(session(served), session(served))
        assert wa != wb
        before = worker_pids(served)
        os.kill(before[wa], signal.SIGKILL)
        with pytest.raises(ConnectionClosed):  # its client is told by the connection's end
            await next_event(a, "never", timeout=30)
        await say(b, 4)  # the other worker's session goes on
        assert wer(SENTENCES[4], await transcript(b)) <= 0.15
        await b.close()
        deadline = time.monotonic() + 240  # a new worker loads its models
        while time.monotonic() < deadline:
            health = served.get("/healthz")
            if health["status"] == "ok" and len(health["workers"]) == 2:
                break
            assert health["status"] == "degraded", health
            await asyncio.sleep(1)
        after = worker_pids(served)
        assert health["status"] == "ok" and after[wb] == before[wb] and after[wa] != before[wa], (before, after)
        opened = await asyncio.gather(*(session(served, 5) for _ in range(2)))
        assert {w for _, w in opened} == {"worker-0", "worker-1"}
        for ws, _ in opened:
            assert wer(SENTENCES[5], await transcript(ws)) <= 0.15
            await ws.close()

    asyncio.run(asyncio.wait_for(main(), 400))
    assert metric(served.get("/metrics"), "worker_restarts_total") == {"": 1}


def test_sigterm_drains_every_worker(served):
    async def main():
        opened = await asyncio.gather(*(session(served, i) for i in (1, 3)))
        assert {w for _, w in opened} == {"worker-0", "worker-1"}
        pids = worker_pids(served)
        served.proc.send_signal(signal.SIGTERM)
        for (ws, _), i in zip(opened, (1, 3), strict=True):  # the turns in flight finish on both workers
            assert wer(SENTENCES[i], await transcript(ws)) <= 0.15
            await asyncio.wait_for(ws.wait_closed(), 60)
            assert ws.close_code == 1001
        return pids

    pids = asyncio.run(asyncio.wait_for(main(), 300))
    assert served.proc.wait(60) == 0, served.text()
    for pid in pids.values():
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_workers_is_a_server_option():
    """`serve --workers`: 1 on a CPU, 2 on a GPU by default (streaming.config.device_default); under 1, or with
    --ray (whose replicas are the processes), it is refused, saying so."""
    import argparse

    from speechrt import cli_serve
    from speechrt.errors import UserError

    p = argparse.ArgumentParser()
    cli_serve.add_arguments(p)
    assert cli_serve.workers(p.parse_args([])) == 1
    assert cli_serve.workers(p.parse_args(["--device", "cuda"])) == 2
    assert cli_serve.workers(p.parse_args(["--workers", "3"])) == 3
    with pytest.raises(UserError, match="--workers must be >= 1, got 0"):
        cli_serve.workers(p.parse_args(["--workers", "0"]))
    with pytest.raises(UserError, match="use --replicas"):
        cli_serve.workers(p.parse_args(["--ray", "--workers", "2"]))
