"""Helpers of the reliability suite: a real `speechrt serve` process (its output, /metrics, stop), and a
client's steps (open a session, wait for an event, stream audio)."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request

import numpy as np

from speechrt.models.audio import resample

SENTENCES = [
    "The museum opens at nine and closes at five.",
    "Please remember to close the windows.",
    "She bought three apples and a loaf of bread.",
    "The meeting has been moved to Thursday afternoon.",
    "Our train was delayed because of a signal problem.",
    "He plays the piano every evening.",
    "Can you tell me the way to the post office?",
    "The children played football in the park.",
    "Turn left at the traffic lights.",
    "My sister is studying chemistry at the university.",
    "The library has thousands of books.",
    "We watched a documentary about whales last night.",
    "The restaurant on the corner serves pasta.",
    "Dogs need regular exercise and a healthy diet.",
    "The river flows quietly through the valley.",
    "I would like a cup of coffee with sugar.",
]


class ServerProcess:
    """`python -m speechrt serve --port 0 ARGS` with its output collected; `url`, `metrics()`, `stop()`."""

    def __init__(self, *args: str):
        cmd = [sys.executable, "-m", "speechrt", "serve", "--port", "0", "--debug-endpoints", *args]
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        self.out: list[str] = []
        self.err: list[str] = []
        self.port = None
        ready = threading.Event()

        def pump(stream, sink, watch):
            for line in stream:
                sink.append(line)
                m = watch and re.search(r"serving on http://[^:]+:(\d+)", line)
                if m:
                    self.port = int(m.group(1))
                    ready.set()
            ready.set()

        self._pumps = [
            threading.Thread(target=pump, args=(self.proc.stdout, self.out, True), daemon=True),
            threading.Thread(target=pump, args=(self.proc.stderr, self.err, False), daemon=True),
        ]
        for t in self._pumps:
            t.start()
        ready.wait(300)
        if self.port is None:
            self.proc.kill()
            raise RuntimeError(f"server did not start: {''.join(self.out + self.err)[-3000:]}")

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1/realtime"

    def get(self, path: str) -> str:
        return urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=30).read().decode()

    def post(self, path: str, body: dict) -> dict:
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.port}{path}", json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        return json.loads(urllib.request.urlopen(req, timeout=30).read())

    def metrics(self) -> dict[str, float]:
        out = {}
        for line in self.get("/metrics").splitlines():
            if line.startswith("speechrt_") and "{" not in line:
                name, value = line.split()
                out[name.removeprefix("speechrt_")] = float(value)
        return out

    def wait_for(self, name: str, cond, timeout: float = 30.0) -> float:
        """Poll metric `name` until cond(value); -> the value (AssertionError on timeout)."""
        deadline = time.monotonic() + timeout
        while True:
            v = self.metrics()[name]
            if cond(v):
                return v
            if time.monotonic() > deadline:
                raise AssertionError(f"metric {name} is {v} after {timeout} s")
            time.sleep(0.1)

    def stop(self, sig=signal.SIGTERM, timeout: float = 60.0) -> int:
        """Signal the server and wait for it to exit -> its exit code; `out` and `err` then hold all it printed
        (what it prints as the interpreter ends, too)."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        for t in self._pumps:
            t.join(10)
        return code


def pcm24(audio16k: np.ndarray, tail_s: float = 1.0) -> bytes:
    a = resample(np.concatenate([audio16k, np.zeros(int(16000 * tail_s), np.float32)]), 16000, 24000)
    return (np.clip(a, -1, 1) * 32767).astype("<i2").tobytes()


def append_event(pcm: bytes) -> str:
    return json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm).decode()})


async def open_session(server, intent: str | None = "transcription", **kw):
    """A connected client -> (ws, its session.created event)."""
    from websockets.asyncio.client import connect

    ws = await connect(server.url + (f"?intent={intent}" if intent else ""), max_size=None, **kw)
    return ws, json.loads(await asyncio.wait_for(ws.recv(), 30))


async def next_event(ws, *types, timeout: float = 60.0) -> dict:
    """The next event of one of `types`, or the next error event."""
    while True:
        ev = json.loads(await asyncio.wait_for(ws.recv(), timeout))
        if ev["type"] in types or ev["type"] == "error":
            return ev


async def update(ws, session: dict) -> dict:
    await ws.send(json.dumps({"type": "session.update", "session": session}))
    return await next_event(ws, "session.updated")


async def stream_pcm(ws, pcm: bytes, chunk_ms: int = 100, realtime: bool = True, speed: float = 1.0):
    """Send 24 kHz pcm16 in chunks, at real-time pace (`speed` times it) or as fast as the server takes it."""
    step = 24000 * 2 * chunk_ms // 1000
    for i in range(0, len(pcm), step):
        await ws.send(append_event(pcm[i : i + step]))
        if realtime:
            await asyncio.sleep(chunk_ms / 1000 / speed)


def run(coro, timeout: float = 120.0):
    return asyncio.run(asyncio.wait_for(coro, timeout))
