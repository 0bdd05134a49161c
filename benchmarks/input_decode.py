"""`python -m benchmarks.input_decode`: the event loop's host work per 100 ms input chunk of a Realtime stream (pcm16 at
24 kHz, the API's default) — JSON parse, base64 decode, int16 -> float, soxr resampling to 16 kHz — per stream as
the server does it (InputDecoder, one soxr stream per session) against the same work vectorized over N streams in
one call (one multi-channel soxr stream, one base64 decode of the joined payloads, one conversion).

    python -m benchmarks.input_decode [--streams 1,8,32,64] [--ticks 200] [--rounds 3]

Figures: the calling thread's CPU microseconds per stream per chunk (median of rounds; every round printed)."""

from __future__ import annotations

import argparse
import base64
import json
import time

import numpy as np

CHUNK = 2400  # samples: 100 ms at 24 kHz


def _events(streams: int, ticks: int) -> list[list[str]]:
    rng = np.random.default_rng(0)
    pcm = (rng.standard_normal((ticks, streams, CHUNK)) * 3000).astype("<i2")
    return [
        [json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(c.tobytes()).decode()}) for c in t]
        for t in pcm
    ]


def _per_stream(events, streams):
    from speechrt.streaming.realtime.audio_codec import AudioFormat, InputDecoder, b64decode

    decoders = [InputDecoder(AudioFormat()) for _ in range(streams)]
    parse = decode = 0.0
    for tick in events:
        for d, e in zip(decoders, tick):
            t0 = time.thread_time()
            raw = b64decode(json.loads(e)["audio"])
            t1 = time.thread_time()
            d.decode(raw)
            parse, decode = parse + t1 - t0, decode + time.thread_time() - t1
    return parse, decode


def _vectorized(events, streams):
    import soxr

    rs = soxr.ResampleStream(24000, 16000, streams, dtype="float32", quality="HQ")
    parse = decode = 0.0
    for tick in events:
        t0 = time.thread_time()
        payloads = [json.loads(e)["audio"] for e in tick]
        raw = base64.b64decode("".join(payloads))  # (each payload a whole number of 4-character groups here)
        t1 = time.thread_time()
        x = np.frombuffer(raw, "<i2").reshape(streams, CHUNK).T.astype(np.float32) / 32768.0
        rs.resample_chunk(np.ascontiguousarray(x))
        parse, decode = parse + t1 - t0, decode + time.thread_time() - t1
    return parse, decode


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--streams", default="1,8,32,64")
    p.add_argument("--ticks", type=int, default=200)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args(argv)
    print(f"{'streams':>7}  {'mode':<12} {'json+base64 us':>16}  {'pcm+soxr us':>14}   (rounds)")
    for n in (int(x) for x in a.streams.split(",")):
        events = _events(n, a.ticks)
        got = {"per stream": [], "vectorized": []}
        for r in range(a.rounds):
            for m in list(got)[:: 1 if r % 2 == 0 else -1]:
                f = _per_stream if m == "per stream" else _vectorized
                got[m].append([x / a.ticks / n * 1e6 for x in f(events, n)])
        for m, v in got.items():
            v = np.array(v)
            med = np.median(v, 0)
            rounds = " / ".join(f"{x:.1f}+{y:.1f}" for x, y in v)
            print(f"{n:>7}  {m:<12} {med[0]:16.1f}  {med[1]:14.1f}   ({rounds})")


if __name__ == "__main__":
    main()
