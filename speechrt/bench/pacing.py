"""What the streaming-server benchmarks share: audio sent at real-time pace, and server events received
with their arrival times while it is being sent."""

from __future__ import annotations

import asyncio
import json
import time

# how long a stream waits for an utterance's final transcript (or its answer) before counting it lost; long
# enough for a loaded 2-core machine, where a peer that re-transcribes its buffer ten times takes a minute
FINAL_WAIT_S = 120.0


def listen(ws) -> tuple[asyncio.Queue, asyncio.Task]:
    """Read `ws`'s JSON messages in the background -> (queue of (arrival time, event), the reader task)."""
    events: asyncio.Queue = asyncio.Queue()

    async def reader():
        async for m in ws:
            events.put_nowait((time.perf_counter(), json.loads(m)))

    return events, asyncio.create_task(reader())


async def send_paced(send, n_samples: int, rate: int, chunk_s: float, speech: tuple[float, float]):
    """Send n_samples of audio at real-time pace, `send(start, end)` one chunk of samples at a time ->
    (send time of the first speech sample, of the last one): `speech` is (start, end) in seconds."""
    step = int(rate * chunk_s)
    t0 = time.perf_counter()
    t_speech_start = t_speech_end = None
    for k, i in enumerate(range(0, n_samples, step)):
        await asyncio.sleep(max(0.0, t0 + k * chunk_s - time.perf_counter()))
        await send(i, i + step)
        sent = (i + step) / rate
        if t_speech_start is None and sent >= speech[0]:
            t_speech_start = time.perf_counter()
        if t_speech_end is None and sent >= speech[1]:
            t_speech_end = time.perf_counter()
    return t_speech_start, t_speech_end
