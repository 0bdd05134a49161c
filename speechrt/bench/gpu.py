"""`speechrt bench gpu --json gpu.json`: everything that can only be checked on a GPU, in one command.

Checks, in order (each one pass / fail / skip with what it compared or why it could not run):
- gpu: the device PyTorch sees (name, compute capability or gfx arch, runtime);
- kernels: every Triton kernel against the torch reference on the GPU, at the models' shapes;
- asr-triton: the triton backend's Whisper token ids against the torch backend's on the GPU (float32), and
  its float16 transcript;
- lm-triton: the triton backend's greedy ids (32 tokens, float32) against the torch backend's;
- asr-onnxruntime: the same comparison for the onnxruntime backend on the GPU's execution provider;
- lm-onnxruntime: its float16 and int4 language-model graphs (float16 activations on a GPU provider)
  against the torch backend's float32, fed the same tokens: logits within tolerance, greedy ids reported;
- cuda-graphs: the triton ASR decode step replayed from a CUDA/HIP graph against the same step run
  eagerly (logits, and time per step);
- asr-batches: what a loaded server asks of the triton ASR runner: batches of 1-8 utterances of random
  lengths (server options, a third capped at 4 tokens like live openings) with the decode steps on the
  graph slots against the same batches eager (float32: the same text; float16: time per batch, graphs
  captured, captures failed);
- lm-graphs: the same for the triton language model's decode step (bf16, two sequences of different
  lengths, the eager run's tokens fed to both) and its prompts' prefill (logits, and time per prompt);
- onnxruntime: each GPU execution provider installed (CUDA, TensorRT, ROCm, MIGraphX) runs the Piper
  voice graph like the CPU provider does;
- tensorrt: the TensorRT package, if installed;
- roofline: `speechrt bench kernels` (Triton vs torch eager and torch.compile against the measured
  copy/GEMM roofline), its records in the same file.

Without a GPU every check that needs one is a skip that says so; the exit status is 1 only when a check
failed.
"""

from __future__ import annotations

import argparse
import math
import statistics
import tempfile
import time
from pathlib import Path

from speechrt.bench.record import Check, Record, Repeats, Results

TOL = {"float32": (1e-4, 1e-4), "float16": (1e-2, 1e-2), "bfloat16": (2e-2, 2e-2)}  # (rtol, atol) of kernels
CHATS = ["What is the capital of France?", "Write a haiku about the sea."]
DATA = Path(__file__).resolve().parent.parent / "data"


def add_arguments(p):
    p.add_argument("--json", default="speechrt-gpu.json", help="result file (default: %(default)s)")
    p.add_argument("--device", default="cuda", help="the GPU (default cuda; cuda:N for another)")
    p.add_argument(
        "--checks",
        default=None,
        help="comma list of checks to run (default: all): "
        + ", ".join(
            [
                "gpu",
                "kernels",
                "asr-triton",
                "lm-triton",
                "asr-onnxruntime",
                "lm-onnxruntime",
                "cuda-graphs",
                "asr-batches",
                "lm-graphs",
                "onnxruntime",
                "tensorrt",
                "roofline",
            ]
        ),
    )
    p.add_argument("--quick", action="store_true", help="roofline without torch.compile (minutes less)")


def _no_gpu() -> str | None:
    import torch

    if torch.cuda.is_available():
        return None
    return (
        f"no CUDA or ROCm GPU is visible to PyTorch here (torch {torch.__version__}, CUDA runtime "
        f"{torch.version.cuda or 'none'}, HIP {torch.version.hip or 'none'}); run `speechrt bench gpu` on a "
        "GPU machine with a CUDA or ROCm build of torch"
    )


def check_gpu(dev, out: Results):
    import torch

    p = torch.cuda.get_device_properties(dev)
    arch = getattr(p, "gcnArchName", None) if torch.version.hip else f"sm_{p.major}{p.minor}"
    runtime = f"ROCm {torch.version.hip}" if torch.version.hip else f"CUDA {torch.version.cuda}"
    return "pass", f"{p.name}, {arch}, {p.total_memory / 2**30:.0f} GiB, {runtime}"


def check_kernels(dev, out: Results):
    import torch

    from speechrt import kernels
    from speechrt.bench.kernels import cases

    bad, n = [], 0
    for dtype in (torch.float16, torch.bfloat16):
        name = str(dtype).removeprefix("torch.")
        rtol, atol = TOL[name]
        tri, ref = kernels.select("triton", dev), kernels.select("torch", dev)
        for label, op, args, kw, _, _ in cases(dtype, dev):
            got, exp = getattr(tri, op)(*args, **kw), getattr(ref, op)(*args, **kw)
            got, exp = (got[0], exp[0]) if isinstance(got, tuple) else (got, exp)
            err = (got.float() - exp.float()).abs().max().item()
            limit = atol + rtol * exp.float().abs().max().item()
            n += 1
            out.records.append(
                Record(
                    family="gpu",
                    model=op,
                    engine="speechrt",
                    backend="triton",
                    precision=name,
                    device=str(dev),
                    workload=label,
                    metric="max_abs_err",
                    unit="",
                    value=err if math.isfinite(err) else 1e30,
                    better="",
                    params={"limit": limit},
                )
            )
            if not err <= limit:
                bad.append(f"{label} {name}: max error {err:.3g} > {limit:.3g}")
    return ("fail", "; ".join(bad)) if bad else ("pass", f"{n} cases (float16, bfloat16) within tolerance")


def asr_parity(dev, backend: str):
    """`backend`'s Whisper token ids against the torch backend's on the GPU (float32, 2 recordings), and its
    float16 transcript's WER."""
    from speechrt.models.audio import load_audio
    from speechrt.models.wer import wer
    from speechrt.pipelines.asr import load_asr
    from speechrt.pipelines.whisper_decoding import TranscribeOptions

    audio = [load_audio(DATA / "sample.wav"), load_audio(DATA / "passage.flac")[: 16000 * 20]]
    opts = TranscribeOptions(without_timestamps=True)
    torch32, ours32 = load_asr(None, "torch", str(dev), "float32"), load_asr(None, backend, str(dev), "float32")
    ref = [r.tokens for r in torch32.transcribe_batch(audio, opts)]
    got = [r.tokens for r in ours32.transcribe_batch(audio, opts)]
    del torch32, ours32
    t16 = load_asr(None, backend, str(dev), "float16").transcribe_batch(audio, opts)
    ref_text = (DATA / "sample.txt").read_text().strip()
    w = wer(ref_text, t16[0].text)
    if got != ref:
        return (
            "fail",
            "float32 token ids differ from the torch backend's "
            f"({sum(a != b for a, b in zip(got, ref))} of 2 recordings)",
        )
    return "pass", f"float32 token ids equal torch's on 2 recordings; float16 WER on sample.wav {100 * w:.1f}%"


def check_asr_triton(dev, out: Results):
    return asr_parity(dev, "triton")


def check_asr_onnxruntime(dev, out: Results):
    why = _no_ort_gpu()
    return ("skip", why) if why else asr_parity(dev, "onnxruntime")


def greedy_ids(lm, prompt: list[int], n: int = 32) -> list[int]:
    """`lm`'s first `n` greedy token ids after the token ids `prompt` (no stop tokens)."""
    from speechrt.pipelines.generation import GenerationOptions
    from speechrt.pipelines.lm_batching import stream

    o = GenerationOptions(max_tokens=n, stop_token_ids=())
    return [ev.token for ev in stream(lm.runner, lm.tokenizer, [prompt], o)]


def lm_parity(dev, backend: str):
    """`backend`'s greedy ids (32 tokens, float32) against the torch backend's on the GPU."""
    from speechrt.pipelines.lm import load_lm

    ref_lm = load_lm(None, "torch", str(dev), "float32")
    ref = [greedy_ids(ref_lm, ref_lm.encode_chat(c)) for c in CHATS]
    del ref_lm
    ours = load_lm(None, backend, str(dev), "float32")
    got = [greedy_ids(ours, ours.encode_chat(c)) for c in CHATS]
    if got != ref:
        return "fail", "greedy ids differ from the torch backend's: " + "; ".join(
            f"{c!r} first differs at token {next(i for i, (a, b) in enumerate(zip(g, r)) if a != b)}"
            for c, g, r in zip(CHATS, got, ref)
            if g != r
        )
    return "pass", f"greedy ids (32 tokens, float32) equal torch's for {len(CHATS)} chats"


def check_lm_triton(dev, out: Results):
    return lm_parity(dev, "triton")


def teacher_forced(lm, prompt: list[int], follow: list[int]):
    """Logits [1 + len(follow), V] (float32, on the CPU) of `lm` after `prompt`, then after each of `follow`."""
    import torch

    r = lm.runner
    cache = r.new_cache(1, len(prompt) + len(follow) + 1)
    out = [r.prefill(cache, 0, torch.tensor(prompt))]
    for t in follow:
        out.append(r.decode_step(cache, [0], torch.tensor([t]))[0])
    return torch.stack([o.float().reshape(-1).cpu() for o in out])


def lm_gpu_parity(dev, backend: str, tolerances: dict[str, float]):
    """`backend`'s language model at each dtype against the torch backend's float32 on the GPU, fed the same
    tokens (the prompt, then float32's 32 greedy ones): largest logit difference over the largest logit, which
    must be within the dtype's tolerance (NaN fails), and where its own greedy ids first part from float32's."""
    import math

    from speechrt.pipelines.lm import load_lm

    ref_lm = load_lm(None, "torch", str(dev), "float32")
    prompts = [ref_lm.encode_chat(c) for c in CHATS]
    ref_ids = [greedy_ids(ref_lm, p) for p in prompts]
    ref = [teacher_forced(ref_lm, p, f) for p, f in zip(prompts, ref_ids)]
    del ref_lm
    notes, bad = [], []
    for dtype, tol in tolerances.items():
        lm = load_lm(None, backend, str(dev), dtype)
        errs = [
            float((teacher_forced(lm, p, f) - r).abs().max() / r.abs().max()) for p, f, r in zip(prompts, ref_ids, ref)
        ]
        same = [
            next((i for i, (a, b) in enumerate(zip(greedy_ids(lm, p), f)) if a != b), len(f))
            for p, f in zip(prompts, ref_ids)
        ]
        del lm
        err = max(errs)
        line = (
            f"{dtype}: logits within {err:.2g} of float32's (limit {tol:g}), greedy ids equal for the first "
            f"{', '.join(map(str, same))} of 32"
        )
        (notes if math.isfinite(err) and err <= tol else bad).append(line)
    return ("fail" if bad else "pass"), "; ".join(bad + notes)


def check_lm_onnxruntime(dev, out: Results):
    # on a GPU provider the graphs run float16 activations (float16, and int4 with the file's 4-bit blocks, whose
    # dequantized values are the float32 model's weights): float16's tolerance for both (H100: 0.0037, 0.0040)
    why = _no_ort_gpu()
    return ("skip", why) if why else lm_gpu_parity(dev, "onnxruntime", {"float16": 2e-2, "int4": 2e-2})


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
            Record(
                family="gpu",
                model=model,
                engine="speechrt",
                backend="triton",
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
    from speechrt.streaming.protocol import SessionConfig
    from speechrt.streaming.session import asr_options

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
            Record(
                family="gpu",
                model=model.name,
                engine="speechrt",
                backend="triton",
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


def compare_providers(providers: list[str]) -> tuple[list[str], list[str]]:
    """The Piper voice graph (noise scales 0: deterministic) on each execution provider, with the options
    speechrt runs it with, against the CPU provider: -> (agreements, failures), one line each. float32 audio
    must agree within 1e-4; a session that silently fell back to the CPU provider fails."""
    import numpy as np

    from speechrt.backends.onnxruntime.providers import provider_options
    from speechrt.backends.onnxruntime.shipped import OrtTTSRunner
    from speechrt.models.piper_loader import SynthesisOptions
    from speechrt.models.registry import resolve
    from speechrt.models.tts_text import TextFrontEnd

    voice = resolve(None, "tts")
    opts = SynthesisOptions(noise_scale=0.0, noise_w=0.0)
    cpu = OrtTTSRunner(voice.path, ["CPUExecutionProvider"])
    ids = next(iter(TextFrontEnd(cpu.voice).sentences("The weather is nice today.")))
    want = cpu.run_graph(ids, opts)
    ok, bad = [], []
    for ep in providers:
        chosen = [ep] if ep == "CPUExecutionProvider" else [(ep, provider_options(ep)), "CPUExecutionProvider"]
        try:
            r = OrtTTSRunner(voice.path, chosen)
            got = r.run_graph(ids, opts)
            used = r.dec.get_providers()[0]
        except Exception as e:  # one provider failing must not hide the others
            bad.append(f"{ep}: {type(e).__name__}: {e}")
            continue
        diff = float(np.abs(got - want).max()) if len(got) == len(want) else float("inf")
        (ok if diff <= 1e-4 and used == ep else bad).append(
            f"{ep} (session runs on {used}): max diff {diff:.2g} over {len(want)} samples"
        )
    return ok, bad


def _no_ort_gpu() -> str | None:
    import onnxruntime as ort

    if any(p not in ("CPUExecutionProvider", "AzureExecutionProvider") for p in ort.get_available_providers()):
        return None
    return (
        f"no GPU execution provider in this onnxruntime build (onnxruntime {ort.__version__}: "
        f"{', '.join(ort.get_available_providers())}); pip install onnxruntime-gpu (NVIDIA) or "
        "onnxruntime-rocm / onnxruntime-migraphx (AMD)"
    )


def check_onnxruntime(dev, out: Results):
    import onnxruntime as ort

    why = _no_ort_gpu()
    if why:
        return "skip", why
    from speechrt.backends.onnxruntime.providers import provider_loadable

    listed = [p for p in ort.get_available_providers() if p not in ("CPUExecutionProvider", "AzureExecutionProvider")]
    ok, bad = compare_providers([p for p in listed if provider_loadable(p)])
    ok += [
        f"{p} listed but its library does not load here (not installed): not run"
        for p in listed
        if not provider_loadable(p)
    ]
    ok.append("Whisper and the language model on the GPU: checks asr-onnxruntime, lm-onnxruntime")
    return ("fail" if bad else "pass"), "; ".join(bad + ok)


def check_tensorrt(dev, out: Results):
    try:
        import tensorrt
    except ImportError:
        return (
            "skip",
            "the tensorrt package is not installed (pip install tensorrt); the TensorRT execution "
            "provider of onnxruntime, if present, is checked under onnxruntime",
        )
    return "skip", (
        f"tensorrt {tensorrt.__version__} is installed: time the tensorrt backend's engines with "
        "`speechrt bench lm --device cuda --backends tensorrt` (this check only looks for the package)"
    )


def check_roofline(dev, out: Results, quick: bool = False):
    from speechrt.bench import kernels
    from speechrt.bench.record import load

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "kernels.json"
        kernels.run(
            argparse.Namespace(ops=None, device=str(dev), dtype=None, no_compile=quick, threads=None, json=str(path))
        )
        res = load(path)
    out.records += res.records
    probe = {r.metric: r.value for r in res.records if r.engine == "probe"}
    return "pass", (
        f"measured {probe.get('copy_GBps', 0):.0f} GB/s copy, {probe.get('matmul_TFLOPs', 0):.0f} "
        f"TFLOP/s matmul; {sum(r.metric == 'time_us' for r in res.records)} kernel timings"
    )


CHECKS = {
    "gpu": check_gpu,
    "kernels": check_kernels,
    "asr-triton": check_asr_triton,
    "lm-triton": check_lm_triton,
    "asr-onnxruntime": check_asr_onnxruntime,
    "lm-onnxruntime": check_lm_onnxruntime,
    "cuda-graphs": check_cuda_graphs,
    "asr-batches": check_asr_batches,
    "lm-graphs": check_lm_graphs,
    "onnxruntime": check_onnxruntime,
    "tensorrt": check_tensorrt,
    "roofline": check_roofline,
}
NEEDS_TORCH_GPU = {
    "gpu",
    "kernels",
    "asr-triton",
    "lm-triton",
    "asr-onnxruntime",
    "lm-onnxruntime",
    "cuda-graphs",
    "asr-batches",
    "lm-graphs",
    "roofline",
}
NEEDS_TRITON = NEEDS_TORCH_GPU - {"gpu", "asr-onnxruntime", "lm-onnxruntime"}


def run(args):
    import torch

    from speechrt.errors import UserError

    names = [c.strip() for c in args.checks.split(",")] if args.checks else list(CHECKS)
    bad = [c for c in names if c not in CHECKS]
    if bad:
        raise UserError(f"unknown check(s) {', '.join(bad)}; valid: {', '.join(CHECKS)}")
    out = Results()
    no_gpu, no_triton = _no_gpu(), None
    if no_gpu is None:
        try:
            import triton  # noqa: F401
        except ImportError:
            no_triton = "Triton is not installed (pip install 'speechrt[triton]')"
    dev = torch.device(args.device) if no_gpu is None else None
    for name in names:
        t0 = time.monotonic()
        if name in NEEDS_TORCH_GPU and no_gpu:
            status, detail = "skip", no_gpu
        elif name in NEEDS_TRITON and no_triton:
            status, detail = "skip", no_triton
        else:
            try:
                fn = CHECKS[name]
                status, detail = fn(dev, out, args.quick) if name == "roofline" else fn(dev, out)
            except Exception as e:  # a crashing check is a failed check, and the others still run
                status, detail = "fail", f"{type(e).__name__}: {e}"
        out.checks.append(Check(name, status, detail))
        print(f"{status.upper():4} {name:12} {detail} ({time.monotonic() - t0:.0f} s)", flush=True)
    out.write(args.json)
    failed = [c.name for c in out.checks if c.status == "fail"]
    print(
        f"{len(out.checks)} checks: {len(failed)} failed, {sum(c.status == 'skip' for c in out.checks)} skipped -> "
        f"{args.json}"
    )
    return 1 if failed else 0
