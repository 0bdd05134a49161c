"""`bench gpu --checks asr-loop`: Whisper's greedy decode loop on the device (backends/whisper_loop.py: K steps,
their logit rules and argmax per graph replay) against one step per replay, on the triton ASR runner: the time per
decoded token at batch 1 (a 30-s window with timestamps: the timestamp rules in every step) and batch 8 (a server's
batch of utterances, its options; and its live rounds, drafted: the drafts checked on the device), K = 1 and 8, and
the same ids. Whisper tiny.en float16 from graphs on a GPU; with `--device cpu` float32 uncaptured on the reference
kernels, fewer repeats. The pick alone is the asr-pick check (gpu_pick.py), which loads no model."""

from __future__ import annotations

import statistics
import time

from speechrt.bench.gpu_parity import DATA
from speechrt.bench.record import Repeats, Results, gpu_record

STEPS = (1, 8)


def _runs(asr, work, dev, repeats: int) -> tuple[list, list[float], int]:
    """`work()` on `asr` once to warm up, then `repeats` times -> (the first run's token ids, seconds per run, tokens
    decoded per run)."""
    import torch

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    ids = work(asr)
    times = []
    for _ in range(repeats):
        sync()
        t = time.perf_counter()
        work(asr)
        sync()
        times.append(time.perf_counter() - t)
    return ids, times, sum(len(r) for r in ids)


def check_asr_loop(dev, out: Results):
    """-> (status, detail): fail where K = 8 gives other ids than K = 1."""
    import random

    import torch

    from speechrt.backends.threads import cpu_threads
    from speechrt.backends.triton.asr import TritonASRRunner
    from speechrt.bench.gpu_graphs import random_cuts
    from speechrt.models.audio import load_audio, utterance_mel
    from speechrt.models.registry import resolve
    from speechrt.models.whisper_loaders import load_weights
    from speechrt.pipelines.asr import ASRPipeline
    from speechrt.streaming.asr_options import asr_options
    from speechrt.streaming.realtime.config import SessionConfig

    gpu = dev.type == "cuda"
    model, audio = resolve(None, "asr"), load_audio(DATA / "passage.flac")  # 58 s of read speech
    weights, dtype = load_weights(model), torch.float16 if gpu else torch.float32
    kw = {} if gpu else {"capture": False, "kernels": "torch"}
    cuts = random_cuts(audio, 8, random.Random(0), 8)
    server = asr_options(SessionConfig(type="transcription"))
    live = asr_options(SessionConfig(type="transcription"), live=True)
    repeats = 10 if gpu else 2

    encoded = {}

    def window(asr):  # greedy decoding of one 30-s window, timestamps on (its encoder pass run once, not timed)
        if asr not in encoded:
            encoded[asr] = asr.runner.encode(utterance_mel(audio[: 16000 * 30], asr.runner.config.n_mels, dev)[None])
        opts = asr.options(temperatures=(0.0,), beam_size=1)
        return [asr.decoder.decode_window(encoded[asr], [], opts, 0.0, "en", None).tokens]

    def batch(asr):  # a server's batch: its encoder pass, the prompt with no draft, then the decode steps
        return [r.tokens for r in asr.transcribe_batch(cuts, server)]

    drafts = {}

    def drafted(asr):  # a live round: each row drafted with its transcript less its last 3 tokens, checked, then on
        if asr not in drafts:
            drafts[asr] = [r.tokens[:-3] for r in asr.transcribe_batch(cuts, live)]
        return [r.tokens for r in asr.transcribe_batch(cuts, live, drafts[asr])]

    lines, bad = [], []
    with torch.inference_mode(), cpu_threads(1 if not gpu else None):
        for name, work in (
            ("batch 1, a 30-s window with timestamps, decode only", window),
            ("batch 8, server options, encoder and prompt included", batch),
            ("batch 8, live rounds drafted, encoder and prompt included", drafted),
        ):
            per_token, ref = {}, None
            for k in STEPS:
                runner = TritonASRRunner(weights, dev, dtype, model.name, model.format, block_steps=k, **kw)
                ids, times, tokens = _runs(ASRPipeline(runner), work, dev, repeats)
                ref = ref or ids
                if ids != ref:
                    bad.append(f"ids of blocks of 8 steps differ from one step per replay at {name}, K={k}")
                us = [t / tokens * 1e6 for t in times]
                per_token[k] = statistics.median(us)
                out.records.append(
                    gpu_record(
                        model=model.name,
                        precision=str(dtype).removeprefix("torch."),
                        device=str(dev),
                        workload=f"Whisper greedy decode, {name}, {tokens} tokens, {k} steps per replay",
                        metric="us_per_token",
                        unit="us",
                        value=per_token[k],
                        better="lower",
                        repeats=Repeats.of(us),
                        peer="" if k == 1 else "1 step per replay",
                        params={"steps_per_replay": k},
                    )
                )
            lines.append(f"{name}: {per_token[1]:.0f} -> {per_token[8]:.0f} us/token")
    if bad:
        return "fail", "; ".join(bad + lines)
    return "pass", "same ids (K=1 -> K=8): " + "; ".join(lines)
