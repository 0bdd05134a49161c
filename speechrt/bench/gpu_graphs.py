"""`bench gpu`'s graph checks: the triton backends' decode steps replayed from CUDA/HIP graphs against the same
steps run eagerly — Whisper's step and a loaded server's batches, the language model's steps and prompts —
with their times per step."""

from __future__ import annotations

import statistics
import time

from speechrt.bench.gpu_parity import CHATS, DATA
from speechrt.bench.record import Repeats, Results, gpu_record


def step_records(
    out: Results,
    times: dict[bool, list[float]],
    dev,
    model: str,
    precision: str,
    workload: str,
    step: str = "decode_step",
):
    """Records of a step's times (seconds) replayed from a graph (True) and eager (False), the first four
    of each left out as warm-up -> how many times faster the replay is (medians)."""
    for g, ts in times.items():
        out.records.append(
            gpu_record(
                model=model,
                precision=precision,
                device=str(dev),
                workload=workload,
                metric=f"{step}_us_graphs" if g else f"{step}_us_eager",
                unit="us",
                value=statistics.median(ts[4:]) * 1e6,
                better="lower",
                repeats=Repeats.of(t * 1e6 for t in ts[4:]),
            )
        )
    return statistics.median(times[False][4:]) / statistics.median(times[True][4:])


def check_cuda_graphs(dev, out: Results):
    import torch

    from speechrt.backends.triton.asr import TritonASRRunner
    from speechrt.models.audio import load_audio, utterance_mel
    from speechrt.models.registry import resolve
    from speechrt.models.whisper_loaders import load_weights
    from speechrt.pipelines.asr import ASRPipeline

    model = resolve(None, "asr")
    weights = load_weights(model)
    runners = {
        g: TritonASRRunner(weights, dev, torch.float16, model.name, model.format, graphs=g) for g in (True, False)
    }
    tok = ASRPipeline(runners[False]).tokenizer
    prompt = tok.sot_sequence("en", "transcribe") + [tok.no_timestamps]
    audio = load_audio(DATA / "sample.wav")
    steps, logits, times = 32, {}, {}
    with torch.inference_mode():
        for g, r in runners.items():
            mel = utterance_mel(audio, r.config.n_mels, dev)[None]
            state = r.start(r.encode(mel), 1, steps + 8)
            r.decode_step(state, torch.tensor([prompt], device=dev))
            nxt = torch.tensor([[440]], device=dev)
            ts, outs = [], []
            for _ in range(steps):
                torch.cuda.synchronize(dev)
                t = time.perf_counter()
                outs.append(r.decode_step(state, nxt))
                torch.cuda.synchronize(dev)
                ts.append(time.perf_counter() - t)
            logits[g], times[g] = torch.stack(outs).float(), ts
    err = (logits[True] - logits[False]).abs().max().item()
    speed = step_records(out, times, dev, model.name, "float16", "whisper decode step, batch 1")
    if not runners[True].graphs_enabled:
        return "fail", "the triton ASR runner did not enable CUDA graphs on this device"
    if err > 5e-2:
        return "fail", f"graph replay logits differ from eager steps by {err:.3g}"
    return "pass", f"{steps} decode steps: graph replay = eager (max logit diff {err:.2g}), {speed:.2f}x faster"


def check_asr_batches(dev, out: Results, batches: int = 24):
    import dataclasses
    import random

    import torch

    from speechrt.backends.cuda_graphs import CapturedStep
    from speechrt.backends.triton.asr import TritonASRRunner
    from speechrt.models.audio import load_audio
    from speechrt.models.registry import resolve
    from speechrt.models.whisper_loaders import load_weights
    from speechrt.pipelines.asr import ASRPipeline
    from speechrt.streaming.asr_options import asr_options
    from speechrt.streaming.realtime.config import SessionConfig

    model, audio = resolve(None, "asr"), load_audio(DATA / "passage.flac")  # 58 s of read speech
    weights, rng = load_weights(model), random.Random()
    cfg = SessionConfig(type="transcription")
    opts, opening = asr_options(cfg), dataclasses.replace(asr_options(cfg, live=True), sample_len=4)
    # fresh every run: (utterances, options) per batch
    work = [(random_cuts(audio, rng.randint(1, 8), rng, 8), opening if i % 3 == 0 else opts) for i in range(batches)]
    texts, times, captured, failed = {}, {}, CapturedStep.captured, CapturedStep.failed
    for dtype in (torch.float32, torch.float16):
        for g in (True, False):
            asr = ASRPipeline(TritonASRRunner(weights, dev, dtype, model.name, model.format, graphs=g))
            asr.transcribe_batch(work[0][0], work[0][1])  # warm-up: Triton compiles
            ts, got = [], []
            for cuts, o in work:
                torch.cuda.synchronize(dev)
                t = time.perf_counter()
                got += [r.text for r in asr.transcribe_batch(cuts, o)]
                ts.append(time.perf_counter() - t)
            texts[dtype, g], times[dtype, g] = got, ts
            del asr
    captured, failed = CapturedStep.captured - captured, CapturedStep.failed - failed
    rows = sum(len(c) for c, _ in work)
    for g in (True, False):
        out.records.append(
            gpu_record(
                model=model.name,
                precision="float16",
                device=str(dev),
                workload=f"{batches} server-like batches, {rows} utterances of 1-8 s",
                metric=f"batch_ms_{'graphs' if g else 'eager'}",
                unit="ms",
                value=statistics.median(times[torch.float16, g]) * 1e3,
                better="lower",
                repeats=Repeats.of(t * 1e3 for t in times[torch.float16, g]),
            )
        )
    same32 = sum(a == b for a, b in zip(texts[torch.float32, True], texts[torch.float32, False]))
    same16 = sum(a == b for a, b in zip(texts[torch.float16, True], texts[torch.float16, False]))
    speed = statistics.median(times[torch.float16, False]) / statistics.median(times[torch.float16, True])
    what = (
        f"{batches} batches, {rows} utterances: float32 text equal in {same32}/{rows}, float16 {same16}/{rows}; "
        f"{captured} graphs captured, {failed} captures failed; float16 batch median "
        f"{statistics.median(times[torch.float16, True]) * 1e3:.1f} ms on graphs vs "
        f"{statistics.median(times[torch.float16, False]) * 1e3:.1f} ms eager ({speed:.2f}x)"
    )
    return ("pass" if same32 == rows and failed == 0 else "fail"), what


def random_cuts(audio, k: int, rng, longest_s: int) -> list:
    """k stretches of `audio` (16 kHz) of 1 to `longest_s` seconds at random places: utterances as a server's
    batches hold them."""
    from speechrt.models.audio import SAMPLE_RATE

    out = []
    for _ in range(k):
        n = rng.randint(SAMPLE_RATE, longest_s * SAMPLE_RATE)
        a = rng.randrange(0, len(audio) - n)
        out.append(audio[a : a + n])
    return out


def check_lm_graphs(dev, out: Results):
    import torch

    from speechrt.pipelines.lm import load_lm

    lm = load_lm(None, "triton", str(dev), "bfloat16")
    r = lm.runner
    prompts = [lm.encode_chat(c) for c in CHATS]
    steps, logits, firsts, times, fed = 32, {}, {}, {}, None
    for g in (False, True):  # eager first: its greedy tokens are fed to the graph run too
        r.graphs_enabled = g
        cache = r.new_cache(len(prompts), max(map(len, prompts)) + steps + 8)
        firsts[g] = torch.stack([r.prefill(cache, i, torch.tensor(p)) for i, p in enumerate(prompts)]).float()
        tok = firsts[g].argmax(-1)
        outs, ts, toks = [], [], []
        for i in range(steps):
            torch.cuda.synchronize(dev)
            t = time.perf_counter()
            o = r.decode_step(cache, list(range(len(prompts))), tok if fed is None else fed[i])
            torch.cuda.synchronize(dev)
            ts.append(time.perf_counter() - t)
            toks.append(tok if fed is None else fed[i])
            outs.append(o)
            tok = o.argmax(-1)
        fed = fed or toks
        logits[g], times[g] = torch.stack(outs).float(), ts
    err = (logits[True] - logits[False]).abs().max().item() / logits[False].abs().max().item()
    perr = (firsts[True] - firsts[False]).abs().max().item() / firsts[False].abs().max().item()
    speed = step_records(out, times, dev, lm.info.model, "bfloat16", f"LM decode step, batch {len(prompts)}")
    pspeed = prefill_times(out, lm, dev, prompts[0])
    serr = scattered_error(r, prompts)
    if len(r.graphs) == 0 or len(r.prefill_graphs) == 0:
        return "fail", (
            f"the triton LM runner captured {len(r.graphs)} decode and {len(r.prefill_graphs)} prefill graphs"
        )
    if not err <= 2e-2:
        return "fail", f"graph replay logits differ from eager steps by {err:.3g} of the largest logit"
    if not perr <= 2e-2:
        return "fail", f"prefill graph logits differ from eager prefill by {perr:.3g} of the largest logit"
    if not serr <= 2e-2:
        return (
            "fail",
            f"steps over scattered slots from graphs differ from eager ones by {serr:.3g} of the largest logit",
        )
    return "pass", (
        f"{steps} decode steps of {len(prompts)} sequences: graph replay = eager (max logit diff "
        f"{err:.2g} of the largest, bf16), {speed:.2f}x faster per step; prompts prefilled from a graph "
        f"= eager ({perr:.2g}), {pspeed:.2f}x faster ({len(prompts[0])} tokens); steps over scattered "
        f"slots = eager ({serr:.2g})"
    )


def scattered_error(r, prompts) -> float:
    """Decode steps over scattered slots of a cache of 8 (a conversation keeps its slot between turns) from
    the graphs over the rows that cover them and eager, on caches filled alike -> the largest logit
    difference over the largest logit."""
    import torch

    slots, out = [1, 4, 6][: len(prompts)], {}
    for g in (False, True):
        r.graphs_enabled = g
        cache = r.new_cache(8, max(map(len, prompts)) + 16)
        for s, p in zip(slots, prompts):
            r.prefill(cache, s, torch.tensor(p))
        out[g] = [
            r.decode_step(cache, sub, torch.arange(len(sub), device=r.device) + 100).float()
            for sub in (slots[::-1], slots[1:2], slots)
        ]
    r.graphs_enabled = True
    return max(((a - b).abs().max() / b.abs().max()).item() for a, b in zip(out[True], out[False]))


def prefill_times(out: Results, lm, dev, prompt: list[int], n: int = 24) -> float:
    """One prompt's prefill, eager and replayed from a graph, n times each -> how many times faster."""
    import torch

    r, times = lm.runner, {}
    for g in (False, True):
        r.graphs_enabled = g
        cache, ts = r.new_cache(1, len(prompt) + 8), []
        for _ in range(n):
            torch.cuda.synchronize(dev)
            t = time.perf_counter()
            r.prefill(cache, 0, torch.tensor(prompt))
            torch.cuda.synchronize(dev)
            ts.append(time.perf_counter() - t)
        times[g] = ts
    r.graphs_enabled = True
    return step_records(
        out, times, dev, lm.info.model, "bfloat16", f"LM prefill, one prompt of {len(prompt)} tokens", step="prefill"
    )
