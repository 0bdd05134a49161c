"""The server's voice activity detection thread (VadWorker): many streams' chunks, queued while it runs, each get
what their stream gets alone, in order; an error reaches its caller without stopping the thread; a closed worker
runs what was queued and refuses more."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from speechrt.models import silero
from speechrt.models.silero import FRAME, SileroVAD, VadStream
from speechrt.streaming.realtime.vad import VadWorker


class _Gate:
    """Silero whose first chunk waits inside until the test opens the gate; `fail` names a call that raises."""

    def __init__(self, fail: int | None = None):
        self.vad, self.calls, self.fail = SileroVAD(), 0, fail
        self.inside, self.open = threading.Event(), threading.Event()

    def stream(self):
        return VadStream(self)  # (its chunks come through run_batch below)

    def run_batch(self, windows, states):
        self.calls += 1
        self.inside.set()
        self.open.wait(10)
        if self.calls == self.fail:
            raise RuntimeError("model broke")
        return self.vad.run_batch(windows, states)


def _speechlike(rng, n):
    t = np.arange(n) / 16000
    return (np.sin(2 * np.pi * 180 * t) * (rng.random(n) > 0.3) * 0.3 + rng.standard_normal(n) * 0.01).astype(
        np.float32
    )


@pytest.mark.parametrize("batch_min", [1, 8])  # (the tick's six streams batched, or a call each)
def test_queued_chunks_of_many_streams_each_get_their_streams_result_in_order(monkeypatch, batch_min):
    monkeypatch.setattr(silero, "BATCH_MIN", batch_min)
    rng = np.random.default_rng(3)
    gate = _Gate()
    worker = VadWorker(gate)
    reference = SileroVAD(sequence=False)
    streams, alone = [worker.stream() for _ in range(6)], [reference.stream() for _ in range(6)]
    chunks = [[_speechlike(rng, int(rng.integers(0, 6000))) for _ in range(3)] for _ in range(6)]

    async def main():
        first = asyncio.ensure_future(worker.process(streams[0], chunks[0][0]))
        assert await asyncio.get_running_loop().run_in_executor(None, gate.inside.wait, 10)
        # while stream 0's first chunk runs, every stream's chunks queue (each stream's in its order)
        rest = [
            asyncio.ensure_future(worker.process(streams[i], chunks[i][k]))
            for k in range(3)
            for i in range(6)
            if (i, k) != (0, 0)
        ]
        await asyncio.sleep(0.05)
        gate.open.set()
        return [await first] + list(await asyncio.gather(*rest))

    try:
        got = asyncio.run(asyncio.wait_for(main(), 30))
    finally:
        worker.close(wait=5)
    order = [(0, 0)] + [(i, k) for k in range(3) for i in range(6) if (i, k) != (0, 0)]
    want = {}
    for i in range(6):
        for k in range(3):
            want[i, k] = alone[i].process(chunks[i][k])
    for key, g in zip(order, got):
        assert len(g) == len(want[key]), key
        np.testing.assert_allclose(g, want[key], rtol=1e-5, atol=1e-6)
    assert worker.frames == sum(map(len, want.values())) > 0 and worker.seconds > 0


def test_an_error_reaches_its_caller_and_the_thread_goes_on():
    gate = _Gate(fail=2)
    gate.open.set()
    worker = VadWorker(gate)
    s = worker.stream()
    audio = np.zeros(2 * FRAME, np.float32)

    async def main():
        ok = await worker.process(s, audio)
        with pytest.raises(RuntimeError, match="model broke"):
            await worker.process(s, audio)
        return ok, await worker.process(s, audio)

    try:
        first, third = asyncio.run(asyncio.wait_for(main(), 30))
    finally:
        worker.close(wait=5)
    assert len(first) == len(third) == 2 and worker.frames == 4


def test_a_closed_worker_runs_what_was_queued_and_refuses_more():
    gate = _Gate()
    worker = VadWorker(gate)
    s, t = worker.stream(), worker.stream()

    async def main():
        running = asyncio.ensure_future(worker.process(s, np.zeros(FRAME, np.float32)))
        assert await asyncio.get_running_loop().run_in_executor(None, gate.inside.wait, 10)
        queued = asyncio.ensure_future(worker.process(t, np.zeros(FRAME, np.float32)))
        await asyncio.sleep(0.05)
        worker.close()
        gate.open.set()
        assert len(await running) == len(await queued) == 1  # what was queued before the close runs
        with pytest.raises(RuntimeError, match="server is closing"):
            await worker.process(s, np.zeros(FRAME, np.float32))

    asyncio.run(asyncio.wait_for(main(), 30))
    worker.close(wait=5)
    assert not worker.running


def test_chunks_that_come_within_a_tick_run_in_one_batch():
    """With tick_s, the chunks of many streams that come while the worker waits for the next tick run in one batched
    call, each stream still getting what it gets alone."""
    rng = np.random.default_rng(5)
    worker = VadWorker(SileroVAD(), tick_s=1.0)  # (a wide margin: a loaded CI machine may pause for a while)
    alone = SileroVAD()
    streams = [worker.stream() for _ in range(6)]
    chunks = [_speechlike(rng, 1600 + 333 * i) for i in range(6)]

    async def main():
        first = await worker.process(streams[0], chunks[0])  # the first tick: at once
        rest = []
        for s, c in zip(streams[1:], chunks[1:]):  # well within the next tick's second
            rest.append(asyncio.ensure_future(worker.process(s, c)))
            await asyncio.sleep(0.01)
        return [first] + list(await asyncio.gather(*rest))

    try:
        got = asyncio.run(asyncio.wait_for(main(), 30))
    finally:
        worker.close(wait=5)
    assert worker.ticks == 2, worker.ticks
    for g, c in zip(got, chunks):
        np.testing.assert_allclose(g, alone.stream().process(c), rtol=1e-5, atol=1e-6)
