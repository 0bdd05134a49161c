"""`bench gpu --checks mel-batch`: the log-mel features of a server's batch of utterances in one pass on the device
(models.audio.utterance_mels) against one utterance at a time (utterance_mel, stacked): the same windows, and
the time of each (64 utterances of 0.01 to 30 s, trimmed to the longest one's window, from host float32 arrays as
transcribe_batch takes them; with `--device cpu` on the CPU's threads)."""

from __future__ import annotations

import statistics
import time

from speechrt.bench.record import Record, Repeats, Results

ROWS = 64
N_MELS = (80, 128)  # Whisper tiny to large-v2; large-v3


def batch_audio(rows: int, seed: int = 0) -> list:
    """`rows` float32 utterances at 16 kHz as a loaded server batches them: 1.5 to 7 s of noise at loudness from
    a whisper to a shout, one 30-s one and one of 0.01 s."""
    import numpy as np

    rng = np.random.default_rng(seed)
    secs = [1.5 + (i * 1.7) % 5.5 for i in range(rows)]
    secs[0], secs[-1] = 30.0, 0.01
    return [rng.standard_normal(int(16000 * s)).astype(np.float32) * rng.choice([1e-3, 0.05, 0.5]) for s in secs]


def _timed(fn, dev, repeats: int) -> tuple[object, list[float]]:
    import torch

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    got = fn()  # (first call: the window, the filterbank and the FFT plans)
    times = []
    for _ in range(repeats):
        sync()
        t = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t)
    return got, times


def check_mel_batch(dev, out: Results, rows: int = ROWS, repeats: int = 20):
    """-> (status, detail): fail where a batched window differs from its utterance's own beyond 1e-5."""
    import torch

    from speechrt.models.audio import HOP_LENGTH, trimmed_frames, utterance_mel, utterance_mels

    audios = batch_audio(rows)
    _, length = trimmed_frames([len(a) // HOP_LENGTH for a in audios], 1.0)
    lines, bad = [], []
    with torch.inference_mode():
        for n_mels in N_MELS:
            one, t_one = _timed(
                lambda m=n_mels: torch.stack([utterance_mel(a, m, dev) for a in audios])[:, :, :length], dev, repeats
            )
            batched, t_batch = _timed(lambda m=n_mels: utterance_mels(audios, m, dev, length), dev, repeats)
            err = (batched - one).abs().max().item()
            limit = 1e-5 + 1e-5 * one.abs().max().item()
            if not err <= limit:
                bad.append(f"{n_mels} bins: max difference {err:.3g} > {limit:.3g}")
            ms = {k: statistics.median(v) * 1e3 for k, v in (("one", t_one), ("batch", t_batch))}
            workload = f"log-mel of {rows} utterances (0.01-30 s, {sum(map(len, audios)) / 16000:.0f} s in all)"
            for what, times, peer in (("one", t_one, ""), ("batch", t_batch, "one utterance at a time")):
                out.records.append(
                    Record(
                        family="gpu",
                        model=f"whisper log-mel {n_mels}",
                        engine="speechrt",
                        backend="torch",
                        precision="float32",
                        device=str(dev),
                        workload=f"{workload}, {'one pass' if what == 'batch' else 'one utterance at a time'}",
                        metric="time_ms",
                        unit="ms",
                        value=ms[what],
                        better="lower",
                        repeats=Repeats.of([t * 1e3 for t in times]),
                        peer=peer,
                        params={"rows": rows, "n_mels": n_mels, "frames": length, "max_abs_diff": err},
                    )
                )
            lines.append(
                f"{n_mels} bins: one pass {ms['batch']:.2f} ms, one at a time {ms['one']:.2f} ms "
                f"({ms['one'] / ms['batch']:.1f}x), max difference {err:.2g}"
            )
    detail = f"{rows} utterances, {length} frames: " + "; ".join(bad + lines)
    return ("fail" if bad else "pass"), detail
