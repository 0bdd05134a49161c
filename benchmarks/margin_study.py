"""`python -m benchmarks.margin_study`: the server's final transcripts of short turns with the encoder over
the turn plus a margin of padding (streaming.asr_options.FINAL_MARGIN_S) against whole 30-s windows — WER and time
a clip on the benchmark's sentences and questions in the embedded voice (`bench server`'s utterances), each
at 3 seeds and 3 lead/tail silences, transcribed one at a time with `transcribe_batch`, as the server does.

    python -m benchmarks.margin_study [--margins 10,8,6,4,3] [--config onnxruntime:int8] [--threads 2]

Whisper was trained on 30-s windows; a short turn encoded over its audio and a few seconds after it reads
another context than the padded window, and the greedy decoder may hear other words. This prints each
margin's WER beside the whole windows', the time a clip, and the clips whose text differs from the whole
windows'."""

from __future__ import annotations

import argparse
import time

import numpy as np

RATE = 16000
SILENCES = ((0.1, 0.25), (0.3, 0.4), (0.6, 0.8))  # seconds of the voice's own silence kept before / after speech


def clips(seeds: int = 3) -> list[tuple[str, np.ndarray]]:
    """(text, float32 audio at 16 kHz) for each utterance of `bench server`, seed and lead/tail silence."""
    import speechrt
    from speechrt.bench.server_streams import QUESTIONS, SENTENCES

    tts = speechrt.load_tts()
    out = []
    for seed in range(seeds):
        for text in SENTENCES + QUESTIONS:
            a = np.concatenate(list(tts.synthesize(text, sample_rate=RATE, seed=seed))).astype(np.float32)
            nz = np.flatnonzero(np.abs(a) > 0.01)
            for lead, tail in SILENCES:
                out.append((text, a[max(0, nz[0] - int(lead * RATE)) : nz[-1] + int(tail * RATE)]))
    return out


def study(asr, data, margins: list[float | None]) -> list[dict]:
    """Per margin (None: whole windows): WER over `data`, ms a clip, and the transcripts."""
    from speechrt.models.wer import wer
    from speechrt.pipelines.transcribe_options import TranscribeOptions

    rows = []
    for m in margins:
        opts = TranscribeOptions(
            without_timestamps=True, trim_context=m is not None, trim_margin=m or 5.0, stop_repeats=3
        )
        t0 = time.perf_counter()
        hyps = [asr.transcribe_batch([a], opts)[0].text for _, a in data]
        ms = (time.perf_counter() - t0) / len(data) * 1e3
        rows.append({"margin": m, "wer": wer([t for t, _ in data], hyps), "ms": ms, "hyps": hyps})
    return rows


def add_asr_args(ap: argparse.ArgumentParser) -> None:
    """The options of a study on the benchmark's clips: the speech recognizer, its threads, the voice seeds."""
    ap.add_argument("--config", default="onnxruntime:int8", help="backend:dtype of the speech recognizer")
    ap.add_argument("--model", default=None, help="ASR model name or path (default: the embedded one)")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None, help="CPU threads (default: all cores)")


def load_asr(args) -> tuple[object, str]:
    """(the speech recognizer of `args` (add_asr_args), "backend dtype" to print), on args.threads threads."""
    import torch

    import speechrt

    if args.threads:
        torch.set_num_threads(args.threads)
    backend, _, dtype = args.config.partition(":")
    return speechrt.load_asr(args.model, backend=backend, dtype=dtype or None), f"{backend} {dtype or 'default'}"


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m benchmarks.margin_study", description=__doc__.split("\n\n")[0])
    ap.add_argument("--margins", default="10,8,6,4,3", help="final margins to try, seconds (comma-separated)")
    add_asr_args(ap)
    args = ap.parse_args(argv)

    from speechrt.bench.fingerprint import fingerprint
    from speechrt.models.wer import wer

    data = clips(args.seeds)
    asr, config = load_asr(args)
    rows = study(asr, data, [None] + [float(m) for m in args.margins.split(",")])
    print(f"{len(data)} clips, {config}, {fingerprint()['label']}")
    whole = rows[0]["hyps"]
    for r in rows:  # clips whose word errors differ from the whole windows' (not case or punctuation)
        changed = [(t, w, h) for (t, _), h, w in zip(data, r["hyps"], whole) if wer([t], [h]) != wer([t], [w])]
        name = "whole windows" if r["margin"] is None else f"margin {r['margin']:g} s"
        print(
            f"{name:14s} WER {100 * r['wer']:5.2f}%  {r['ms']:6.0f} ms a clip  {len(changed)} clips with other "
            "word errors than whole windows'" + "".join(f"\n    {t!r}: {w!r} -> {h!r}" for t, w, h in changed[:6])
        )


if __name__ == "__main__":
    main()
