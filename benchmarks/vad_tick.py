"""`python -m benchmarks.vad_tick`: the host time of one voice activity tick (every stream's 100 ms chunk) at N
streams, the streams' frames in one batched call (SileroVAD.run_batch: ONNX Runtime, the server's CPU runner;
BatchedSilero: torch, its GPU runner, here on the CPU on one thread) against a call per stream of the sequence graph
(the server before batching).

    python -m benchmarks.vad_tick [--streams 1,8,32,64] [--ticks 40] [--rounds 3]

A chunk is 1600 samples at 16 kHz (3 or 4 frames, alternating as the streams' remainders carry over). Each figure is
the median over a round's ticks of the thread's CPU time per tick; the modes alternate, their order flipped each
round, and every round is printed (a shared machine disturbs single rounds)."""

from __future__ import annotations

import argparse
import time

import numpy as np

CHUNK = 1600


def _tick_times(runner, streams: int, ticks: int, batched: bool) -> float:
    rng = np.random.default_rng(0)
    audio = (rng.standard_normal((streams, CHUNK * ticks)) * 0.1).astype(np.float32)
    vs = [runner.stream() for _ in range(streams)]
    times = []
    for t in range(ticks):
        t0 = time.thread_time()
        windows = [s.take_frames(audio[i, t * CHUNK : (t + 1) * CHUNK]) for i, s in enumerate(vs)]
        if batched:
            _, states = runner.run_batch(windows, [s.state for s in vs])
            for s, st in zip(vs, states):
                s.state = st
        else:
            for s, w in zip(vs, windows):
                _, s.state = runner.run(w, s.state)
        times.append(time.thread_time() - t0)
    return float(np.median(times[2:]))  # (the first ticks warm the runner up)


def main(argv=None):
    import torch

    from speechrt.models.silero import SileroVAD
    from speechrt.models.silero_batch import BatchedSilero

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--streams", default="1,8,32,64")
    p.add_argument("--ticks", type=int, default=40)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    onnx, net = SileroVAD(), BatchedSilero("cpu")
    modes = {
        "per stream (sequence graph)": (onnx, False),
        "batched, onnxruntime": (onnx, True),
        "batched, torch": (net, True),
    }
    print(f"{'streams':>7}  {'mode':<28} tick ms (rounds)")
    for n in (int(x) for x in a.streams.split(",")):
        got = {m: [] for m in modes}
        for r in range(a.rounds):
            for m in list(modes)[:: 1 if r % 2 == 0 else -1]:
                got[m].append(_tick_times(*modes[m][:1], n, a.ticks, modes[m][1]) * 1e3)
        for m, v in got.items():
            print(f"{n:>7}  {m:<28} {np.median(v):7.3f} ({' / '.join(f'{x:.3f}' for x in v)})")


if __name__ == "__main__":
    main()
