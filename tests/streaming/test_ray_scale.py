"""speechrt on Ray Serve (streaming/scale.py): a local Ray cluster, two transcription-only replicas, real
WebSocket clients with real speech. Skipped when ray is not installed (pip install 'speechrt[ray]')."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import socket
import urllib.request

import numpy as np
import pytest

pytest.importorskip("ray", reason="ray[serve] is not installed: pip install 'speechrt[ray]'")

from speechrt.models.audio import resample  # noqa: E402
from speechrt.models.wer import wer  # noqa: E402

pytestmark = pytest.mark.ray

SENTENCES = [
    "The weather will be sunny tomorrow with a light breeze.",
    "Please remember to close the windows.",
    "She bought three apples and a loaf of bread.",
    "The meeting has been moved to Thursday afternoon.",
    "Our train was delayed because of a signal problem.",
    "He plays the piano every evening.",
    "The museum opens at nine and closes at five.",
    "Turn left at the traffic lights.",
]
CHUNK = 9600  # 200 ms of pcm16 at 24 kHz


def pcm24(audio16k: np.ndarray, tail_s: float = 1.0) -> bytes:
    a = resample(np.concatenate([audio16k, np.zeros(int(16000 * tail_s), np.float32)]), 16000, 24000)
    return (np.clip(a, -1, 1) * 32767).astype("<i2").tobytes()


@pytest.fixture(scope="module")
def cluster():
    import logging

    import ray
    from ray import serve

    from speechrt.scale import config_from
    from speechrt.streaming.scale import application

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.WARNING, log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    config, scale = config_from(
        {
            "transcription-only": True,
            "replicas": 2,
            "replica-cpus": 1,
            "threads": 1,
            "silence-duration-ms": 300,
            "max-sessions": 8,
            "drain-seconds": 10,
            "graceful-shutdown-s": 30,
        }
    )
    serve.run(application(config, scale), name="speechrt", route_prefix="/")
    try:
        yield {"port": port, "config": config, "scale": scale}
    finally:
        serve.shutdown()
        ray.shutdown()


class Session:
    """A transcription session over a real WebSocket: session.created's replica, each turn's events."""

    def __init__(self, port: int):
        self.url = f"ws://127.0.0.1:{port}/v1/realtime?intent=transcription"
        self.committed: set[str] = set()
        self.completed: dict[str, str] = {}
        self.replicas: list[str] = []
        self.notices: list[str] = []
        self.events: list[str] = []  # what this client saw, for a failure's message

    async def open(self):
        """Connect; a replica that is full or stopping says so (session_limit_reached, 1013): try again."""
        from websockets.asyncio.client import connect

        for _ in range(60):
            self.ws = await connect(self.url, max_size=None)
            created = json.loads(await self.ws.recv())
            if created["type"] == "session.created":
                break
            assert created["error"]["code"] == "session_limit_reached", created
            await self.ws.close()
            await asyncio.sleep(0.5)
        assert created["type"] == "session.created", created
        self.replicas.append(created["speechrt"]["replica"])
        await self.ws.send(
            json.dumps(
                {
                    "type": "session.update",
                    "session": {
                        "type": "transcription",
                        "audio": {"input": {"turn_detection": {"type": "server_vad", "silence_duration_ms": 300}}},
                    },
                }
            )
        )
        while json.loads(await self.ws.recv())["type"] != "session.updated":
            pass

    async def turn(self, pcm: bytes, pace: float = 0.1) -> str | None:
        """Send one utterance (200 ms chunks every `pace` s) and wait for the transcripts of every turn
        committed meanwhile (a pause inside it may split it in two) -> their text; None when the replica
        closed the session first (its notice is kept)."""
        from websockets.exceptions import ConnectionClosed

        async def send():
            for i in range(0, len(pcm), CHUNK):
                await self.ws.send(
                    json.dumps(
                        {"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm[i : i + CHUNK]).decode()}
                    )
                )
                await asyncio.sleep(pace)

        sender = asyncio.create_task(send())
        mine: list[str] = []
        try:
            async for message in self.ws:
                ev = json.loads(message)
                self.events.append(f"{ev['type']} {ev.get('item_id', '')} {ev.get('error', '')}")
                if ev["type"] == "input_audio_buffer.committed":
                    self.committed.add(ev["item_id"])
                    mine.append(ev["item_id"])
                elif ev["type"] == "conversation.item.input_audio_transcription.completed":
                    self.completed[ev["item_id"]] = ev["transcript"]
                    if mine and set(mine) <= set(self.completed):
                        await sender  # (the transcript may come while the trailing silence is sent)
                        if set(mine) <= set(self.completed):
                            return " ".join(self.completed[i] for i in mine)
                elif ev["type"] == "error":
                    assert ev["error"]["code"] == "server_shutting_down", ev
                    self.notices.append(ev["error"]["message"])
        except ConnectionClosed as e:
            self.events.append(f"closed {e}")
        finally:
            sender.cancel()
        return None


def run(coro, timeout=150):
    return asyncio.run(asyncio.wait_for(coro, timeout))


def test_sessions_spread_over_both_replicas_each_with_its_transcript(cluster, synth):
    texts = SENTENCES[:6]

    async def one(text):
        s = Session(cluster["port"])
        await s.open()
        got = await s.turn(pcm24(synth(text)))
        await s.ws.close()
        return s.replicas[0], got

    async def main():
        return await asyncio.gather(*(one(t) for t in texts))

    results = run(main())
    for text, (_, got) in zip(texts, results):
        assert got is not None and wer(text, got) <= 0.15, (text, got)
    placed = [r for r, _ in results]
    assert len(set(placed)) == 2 and max(placed.count(r) for r in set(placed)) <= 4, placed


def test_health_metrics_and_cluster_metrics(cluster):
    base = f"http://127.0.0.1:{cluster['port']}"
    with urllib.request.urlopen(base + "/healthz", timeout=10) as r:
        health = json.load(r)
    assert health["status"] == "ok" and health["replica"] and health["models"]["lm"] == []
    with urllib.request.urlopen(base + "/metrics", timeout=10) as r:
        assert 'speechrt_replica_info{replica="' in r.read().decode()
    with urllib.request.urlopen(base + "/metrics/cluster", timeout=10) as r:
        text = r.read().decode()
    lines = dict(line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))
    assert lines["speechrt_cluster_replicas"] == "2", text
    assert int(lines["speechrt_cluster_sessions_total"]) >= 6, text  # the previous test's sessions
    assert sum(k.startswith("speechrt_replica_sessions_total{") for k in lines) == 2
    # the load `bench server` reads behind Ray: the replicas' counters summed (any replica's /metrics is one's)
    assert sum(k.startswith("speechrt_replica_engine_busy_seconds_total{") for k in lines) == 2
    from speechrt.bench.server_load import counters

    got = counters(base)
    assert got["replicas"] == 2 and got["process_cpu_seconds_total"] > 0, got
    assert got["engine_busy_seconds_total"] > 0, got  # the previous test's sessions were transcribed
    assert got["vad_seconds_total"] > 0, got  # ... and their audio went through voice activity detection
    assert len(got["workers"]) == 2, got  # each replica's engine busy seconds, for its busy share per level


def test_a_full_cluster_answers_session_limit_reached(cluster):
    """Two replicas of 8 sessions each take 16 sessions, eight on each; the 17th is told as a single
    server tells it (session_limit_reached, close 1013) so that the client can try again."""
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed

    url = f"ws://127.0.0.1:{cluster['port']}/v1/realtime?intent=transcription"

    async def main():
        await asyncio.sleep(2.0)  # the replicas' reports (every second) no longer count the earlier tests' sessions
        held, placed = [], []
        try:
            for _ in range(16):
                ws = await connect(url)
                held.append(ws)
                placed.append(json.loads(await ws.recv())["speechrt"]["replica"])
            ws = await connect(url)
            held.append(ws)
            refused = json.loads(await ws.recv())
            with pytest.raises(ConnectionClosed) as closed:
                await ws.recv()
            return placed, refused, closed.value.rcvd.code
        finally:
            for ws in held:
                await ws.close()

    placed, refused, code = run(main(), 60)
    assert sorted(placed.count(r) for r in set(placed)) == [8, 8], placed
    assert refused["type"] == "error" and refused["error"]["code"] == "session_limit_reached", refused
    assert code == 1013


def test_scale_down_loses_no_committed_turn(cluster, synth):
    """Four sessions speak utterance after utterance (three at least) until the deployment, going from 2
    replicas to 1 meanwhile, has only the one left. The stopping replica finishes its turns in flight and tells
    its sessions, which reconnect (to the other replica) and go on. Every committed turn gets its transcript;
    every utterance is transcribed."""
    from ray import serve

    from speechrt.streaming.scale import application

    texts = SENTENCES
    pcms = [pcm24(synth(t)) for t in texts]
    gone = asyncio.Event()  # the stopping replica is gone: a session still on it would have been told

    async def speaker(k):
        s, out, u = Session(cluster["port"]), [], 0
        await s.open()
        while u < 3 or not gone.is_set():
            i = (3 * k + u) % len(texts)
            while (got := await s.turn(pcms[i])) is None:  # told to go: reconnect, say it again
                await s.open()
            out.append((texts[i], got))
            u += 1
        await s.ws.close()
        return s, out

    def one_replica_left() -> bool:
        states = serve.status().applications["speechrt"].deployments["speechrt"].replica_states
        return sum(states.values()) == 1

    async def main():
        speakers = [asyncio.create_task(speaker(k)) for k in range(4)]
        await asyncio.sleep(3.0)  # every session is speaking its first utterance
        one = dataclasses.replace(cluster["scale"], replicas=1)
        await asyncio.to_thread(serve.run, application(cluster["config"], one), name="speechrt", route_prefix="/")
        while not await asyncio.to_thread(one_replica_left):
            await asyncio.sleep(0.5)
        gone.set()
        return await asyncio.gather(*speakers)

    results = run(main(), 240)
    moved = [s for s, _ in results if s.notices]
    assert moved, ("no session was on the replica that stopped", [s.replicas for s, _ in results])
    for s, out in results:
        assert s.committed <= set(s.completed), (
            f"committed turns without a transcript: {s.committed - set(s.completed)}",
            s.events,
        )
        for text, got in out:
            assert wer(text, got) <= 0.15, (text, got)
    for s in moved:
        assert "reconnect" in s.notices[0] and len(set(s.replicas)) >= 2, (s.notices, s.replicas)
    health = json.load(urllib.request.urlopen(f"http://127.0.0.1:{cluster['port']}/healthz", timeout=10))
    assert health["status"] == "ok"
