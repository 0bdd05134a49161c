"""`python -m benchmarks.vad_study`: the streaming server's voice activity detection at N concurrent streams
— the CPU it takes and how long a chunk waits for its probabilities — run as the server runs it (VadWorker: one
thread, a chunk's frames in one call of Silero's sequence graph) against the ways it ran before: a call per
32 ms frame, on two pool threads or on the worker.

    python -m benchmarks.vad_study [--streams 16,64,128] [--seconds 6] [--rounds 2]

Each stream sends 100 ms chunks at real-time pace, the streams staggered over the 100 ms as independent speakers
would be; the audio is a tone switched on and off over noise (Silero's cost does not depend on what it hears).
CPU is the whole process's (this driver's event loop included, the same in every mode) over the wall time; the
modes alternate, their order flipped each round."""

from __future__ import annotations

import argparse
import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

CHUNK_S = 0.1
MODES = ("per-frame, 2 threads", "per-frame, worker", "sequence, worker")


def _audio(seconds: float = 10.0) -> np.ndarray:
    rng = np.random.default_rng(0)
    t = np.arange(int(seconds * 16000)) / 16000
    return (
        0.3 * np.sin(2 * np.pi * 180 * t) * (np.sin(2 * np.pi * 0.4 * t) > 0) + 0.01 * rng.standard_normal(len(t))
    ).astype(np.float32)


async def _drive(make_stream, detect, streams: int, seconds: float, audio: np.ndarray) -> dict:
    chunk = int(CHUNK_S * 16000)
    waits: list[float] = []

    async def one(i):
        stream = make_stream()
        await asyncio.sleep(i * CHUNK_S / streams)
        t0, k = time.monotonic(), 0
        while time.monotonic() - t0 < seconds:
            x = audio[(k * chunk) % (len(audio) - chunk) :][:chunk]
            t = time.perf_counter()
            await detect(stream, x)
            waits.append(time.perf_counter() - t)
            k += 1
            await asyncio.sleep(max(0.0, t0 + k * CHUNK_S - time.monotonic()))

    c0, w0 = time.process_time(), time.monotonic()
    await asyncio.gather(*[one(i) for i in range(streams)])
    cores = (time.process_time() - c0) / (time.monotonic() - w0)
    return {
        "cores": cores,
        "wait_p50_ms": 1e3 * float(np.percentile(waits, 50)),
        "wait_p95_ms": 1e3 * float(np.percentile(waits, 95)),
        "chunks": len(waits),
    }


def run_mode(mode: str, streams: int, seconds: float, audio: np.ndarray) -> dict:
    from speechrt.models.silero import SileroVAD
    from speechrt.streaming.realtime.vad import VadWorker

    vad = SileroVAD(sequence=mode.startswith("sequence"))
    if mode.endswith("2 threads"):
        pool = ThreadPoolExecutor(2)

        async def detect(stream, x):
            return await asyncio.get_running_loop().run_in_executor(pool, stream.process, x)

        try:
            return asyncio.run(_drive(vad.stream, detect, streams, seconds, audio))
        finally:
            pool.shutdown()
    worker = VadWorker(vad)
    try:
        return asyncio.run(_drive(worker.stream, worker.process, streams, seconds, audio))
    finally:
        worker.close(wait=5)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m benchmarks.vad_study", description=__doc__.split("\n\n")[0])
    ap.add_argument("--streams", default="16,64,128", help="concurrent streams, comma-separated")
    ap.add_argument("--seconds", type=float, default=6.0, help="seconds each mode runs at each level")
    ap.add_argument("--rounds", type=int, default=2, help="runs of every mode at each level")
    args = ap.parse_args(argv)

    from speechrt.bench.fingerprint import describe, fingerprint

    print(describe(fingerprint()))
    audio = _audio()
    print(f"{'streams':>7}  {'mode':<22} {'cores':>6} {'(rounds)':>10} {'chunk wait p50':>15} {'p95':>7}  (ms)")
    for n in [int(s) for s in args.streams.split(",")]:
        rows = {m: [] for m in MODES}
        for r in range(args.rounds):
            for m in MODES if r % 2 == 0 else MODES[::-1]:
                rows[m].append(run_mode(m, n, args.seconds, audio))
        for m in MODES:
            cores = [x["cores"] for x in rows[m]]
            p50 = np.median([x["wait_p50_ms"] for x in rows[m]])
            p95 = np.median([x["wait_p95_ms"] for x in rows[m]])
            print(
                f"{n:>7}  {m:<22} {np.median(cores):>6.3f} {'/'.join(f'{c:.2f}' for c in cores):>10}"
                f" {p50:>15.2f} {p95:>7.2f}"
            )


if __name__ == "__main__":
    main()
