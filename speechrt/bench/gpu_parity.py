"""`bench gpu`'s backend parity checks: the triton and onnxruntime backends' Whisper token ids and transcripts,
and their language models' greedy ids and logits, against the torch backend's on the same GPU."""

from __future__ import annotations

import math
from pathlib import Path

from speechrt.bench.record import Results

CHATS = ["What is the capital of France?", "Write a haiku about the sea."]
DATA = Path(__file__).resolve().parent.parent / "data"


def no_ort_gpu() -> str | None:
    """Why ONNX Runtime has no GPU here (None: it has a GPU execution provider)."""
    import onnxruntime as ort

    if any(p not in ("CPUExecutionProvider", "AzureExecutionProvider") for p in ort.get_available_providers()):
        return None
    return (
        f"no GPU execution provider in this onnxruntime build (onnxruntime {ort.__version__}: "
        f"{', '.join(ort.get_available_providers())}); pip install onnxruntime-gpu (NVIDIA) or "
        "onnxruntime-rocm / onnxruntime-migraphx (AMD)"
    )


def asr_parity(dev, backend: str):
    """`backend`'s Whisper token ids against the torch backend's on the GPU (float32, 2 recordings), and its
    float16 transcript's WER."""
    from speechrt.models.audio import load_audio
    from speechrt.models.wer import wer
    from speechrt.pipelines.asr import load_asr
    from speechrt.pipelines.transcribe_options import TranscribeOptions

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
    why = no_ort_gpu()
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
    why = no_ort_gpu()
    return ("skip", why) if why else lm_gpu_parity(dev, "onnxruntime", {"float16": 2e-2, "int4": 2e-2})
