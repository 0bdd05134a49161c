"""What the streaming-server benchmarks share: audio sent at real-time pace, and server events received
with their arrival times while it is being sent."""

from __future__ import annotations

import asyncio
import json
import math
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


async def send_paced(send, n_samples: int, rate: int, chunk_s: float, speech: tuple[float, float], tick_s: float = 0.0):
    """Send n_samples of audio at real-time pace, `send(start, end)` one chunk of samples at a time ->
    (send time of the first speech sample, of the last one): `speech` is (start, end) in seconds. tick_s > 0 puts
    every send on a grid of the event loop's clock `tick_s` apart (at most tick_s late): the streams of one
    process that are due in the same tick wake together, one timer pass for all of them instead of one each."""
    step = int(rate * chunk_s)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    if tick_s:
        t0 = math.ceil(t0 / tick_s) * tick_s
    t_speech_start = t_speech_end = None
    for k, i in enumerate(range(0, n_samples, step)):
        when = t0 + k * chunk_s
        if tick_s:
            when = round(when / tick_s) * tick_s
        if when > loop.time():
            await sleep_until(loop, when)
        await send(i, i + step)
        sent = (i + step) / rate
        if t_speech_start is None and sent >= speech[0]:
            t_speech_start = time.perf_counter()
        if t_speech_end is None and sent >= speech[1]:
            t_speech_end = time.perf_counter()
    return t_speech_start, t_speech_end


async def sleep_until(loop, when: float) -> None:
    """Sleep until the event loop's clock reads `when` (timers at the same `when` fire in one pass)."""
    fut = loop.create_future()
    handle = loop.call_at(when, _wake, fut)
    try:
        await fut
    finally:
        handle.cancel()


def _wake(fut) -> None:
    if not fut.done():
        fut.set_result(None)
