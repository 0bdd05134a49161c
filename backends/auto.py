"""`--backend auto`: per family and kind of machine, the backend and precision our benchmarks measured
fastest among those that pass the conformance suite there and answer the held-in factual prompts as
float32 does (speech recognition: the same transcripts / WER as float32).

The table is keyed on the CPU's features (AMX with native bf16, AVX-512, AVX2) or on the GPU's vendor. A
kind of machine we have not measured (a ROCm GPU) keeps the choice made before this table existed (torch,
its own default precision), and says so in the log; so does a measured choice whose backend is not
installed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import lru_cache

import torch

from .base import Backend
from .registry import get, runs

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Choice:
    backend: str
    dtype: str | None  # None: the backend's own default precision
    why: str
    # a condition the choice needs on the machine (a name in NEEDS), and what runs where it does not hold
    needs: str = ""
    instead: Choice | None = None


def _cpu_int4_kernel() -> str | None:
    from speechrt.kernels.cpu_decode import unavailable

    return unavailable()


# condition name -> None where it holds, else why not
NEEDS = {"cpu int4 kernel": _cpu_int4_kernel}


# (machine kind, family) -> Choice; see docs/benchmarks.md for the runs behind each measured entry
TABLE: dict[tuple[str, str], Choice] = {
    ("avx2", "lm"): Choice(
        "torch",
        "int4",
        "bench lm, AMD EPYC Zen 3 (AVX2, 2 cores): torch int4 on the AVX2 kernel "
        "(kernels/cpu_decode) 149 tok/s at batch 1 and 366 at batch 8, TTFT 131 ms, vs onnxruntime "
        "int4 84 / 254 (95 ms), onnxruntime-genai 88 / 187 (145 ms), llama.cpp 77 / 149 (235 ms) in "
        "the same run; the factual prompts answered as float32 does",
        needs="cpu int4 kernel",
        instead=Choice(
            "onnxruntime",
            "int4",
            "bench lm, AMD EPYC (AVX2, 2 cores): onnxruntime int4 "
            "decodes faster than torch int4 on ATen's kernels at batch 1 and 8 and "
            "answers 5 of 6 prompts as float32 (ATen int4: 2 of 6)",
        ),
    ),
    ("avx2", "asr"): Choice(
        "onnxruntime",
        "int8",
        "bench asr, AMD EPYC (AVX2, 2 cores), 58 s passage: onnxruntime "
        "int8 4.45 s (WER 2.1%) vs onnxruntime fp32 5.47 s and torch float32 ~8 s (WER 2.7%); "
        "faster-whisper int8 4.4-5.6 s in the same runs, WER 2.1%",
    ),
    ("avx2", "tts"): Choice(
        "onnxruntime",
        None,
        "bench tts, AMD EPYC (AVX2, 2 cores), 30 words: onnxruntime on our "
        "VITS exported in pieces (made on first use) RTF 0.96x Piper's, first audio 107 ms, vs "
        "torch 1.57x / 154 ms; short sentences 0.079 vs 0.116 RTF; the same audio as torch "
        "within 1e-4 at noise 0",
    ),
    # measured on an AMD EPYC Zen 4 VM (AVX-512 with BF16 and VNNI, no AMX; 2 cores), 2026-11-24, and again on
    # 2026-11-26/27 (family 25 model 17) with the CPU int4 kernel (docs/onnx-runtime.md)
    ("avx512", "lm"): Choice(
        "torch",
        "int4",
        "bench lm, AMD EPYC Zen 4 (AVX-512 with VNNI, 2 cores), 2026-11-26: "
        "torch int4 on the CPU kernel (its VNNI build) 284 tok/s at batch 1 and 622 at batch 8, "
        "TTFT 94 ms, vs onnxruntime-genai 198 / 498 (54 ms), onnxruntime int4 122 / 393 (61 ms), "
        "llama.cpp 117 / 201 (150 ms) in the same run: a 64-token reply ends sooner (0.32 s vs "
        "genai's 0.37); the kernel's sums are the AVX2 build's, whose answers to the factual "
        "prompts are float32's",
        needs="cpu int4 kernel",
        instead=Choice(
            "onnxruntime",
            "int4",
            "bench lm, AMD EPYC Zen 4 (AVX-512, 2 cores), "
            "2026-11-24: onnxruntime int4 134.8 tok/s at batch 1 (llama.cpp 136.7, "
            "torch int4 on ATen 72.9) and 427.7 at batch 8 (llama.cpp 216.2)",
        ),
    ),
    ("avx512", "asr"): Choice(
        "onnxruntime",
        "int8",
        "bench asr, AMD EPYC Zen 4 (AVX-512, 2 cores), 58 s passage: "
        "onnxruntime int8 1.62 s (WER 3.2%) vs onnxruntime fp32 3.08 s, torch bf16 3.14 s, "
        "torch float32 4.83 s (WER 2.7%); faster-whisper int8 2.24 s (WER 1.6%) in the same "
        "run; again 2026-11-27 (family 25 model 17): int8 1.65 s, fp32 2.67 s, torch bf16 "
        "3.15 s, faster-whisper int8 2.83 s",
    ),
    ("avx512", "tts"): Choice(
        "onnxruntime",
        None,
        "bench tts, AMD EPYC Zen 4 (AVX-512, 2 cores), 30 words: "
        "onnxruntime RTF 1.00x Piper's, first audio 116 ms (0.26x Piper's) vs torch 1.61x / "
        "145 ms; 5 words 1.34x Piper's RTF (torch 1.89x); again 2026-11-27: 1.04x / 114 ms "
        "(0.27x) vs torch 1.57x / 148 ms",
    ),
    # measured on 2 cores (pinned, --threads 2) of an Intel Xeon family 6 model 207 with AMX (the host of a lent
    # GPU machine), 2026-11-26; torch 2.11, onnxruntime 1.30 (docs/gpu.md)
    ("amx", "lm"): Choice(
        "onnxruntime",
        "int4",
        "bench lm, Intel Xeon with AMX (2 cores): onnxruntime int4 "
        "199 tok/s at batch 1 and 504 at batch 8, TTFT 28 / 232 ms, vs torch int4 245 / 356 "
        "(127 / 935 ms) and onnxruntime-genai 115 / 342 (122 / 798 ms) in the same run: torch "
        "decodes one sequence faster, but a 64-token reply ends sooner on onnxruntime (TTFT)",
    ),
    ("amx", "asr"): Choice(
        "onnxruntime",
        "int8",
        "bench asr, Intel Xeon with AMX (2 cores), 58 s passage: "
        "onnxruntime int8 1.04 s (WER 2.1%) vs onnxruntime fp32 1.23 s, torch float32 2.03 s, "
        "torch bf16 2.40 s (WER 3.2%); faster-whisper int8 1.71 s (WER 1.6%) in the same run",
    ),
    ("amx", "tts"): Choice(
        "onnxruntime",
        None,
        "bench tts, Intel Xeon with AMX (2 cores), 30 words: onnxruntime "
        "RTF 0.84x Piper's, first audio 85 ms (0.20x Piper's) vs torch 1.32x / 131 ms; 5 words "
        "1.20x Piper's RTF (torch 1.65x)",
    ),
    # measured on an NVIDIA H200 (CUDA 13.0, torch 2.11, Triton 3.6), 2026-11-26 (docs/gpu.md); the triton LM
    # keeps the GPU's default precision (bf16, as torch ran it before this entry), the ASR's float16 the
    # WER of float32 on the passage
    # and on an NVIDIA H100 with onnxruntime-gpu 1.31 (its CUDA provider), 2026-11-26: the same choices
    ("nvidia", "asr"): Choice(
        "triton",
        "float16",
        "bench asr, NVIDIA H200, 58 s passage: triton float16 0.28 s "
        "(RTF 0.005, WER 3.2%) vs torch float32 0.45 s, torch float16 0.55 s, triton float32 "
        "0.52 s (all WER 3.2%); decoder steps from CUDA graphs. H100: triton float16 0.22 s, "
        "onnxruntime (CUDA) fp16 0.42 s, torch float16 0.62 s (all WER 3.2%)",
    ),
    ("nvidia", "lm"): Choice(
        "triton",
        "bfloat16",
        "bench lm, NVIDIA H200: triton bf16 (decode steps from CUDA "
        "graphs) 467 tok/s at batch 1 and 3049 at batch 8 vs torch bf16 65 / 453 and "
        "transformers bf16 54 / 409; greedy ids equal torch's at float32 (bench gpu). H100: "
        "triton 445 / 2624 vs onnxruntime (CUDA) fp16 307 / 2497, int4 225 / 1688; with its "
        "prompts prefilled from CUDA graphs too, triton 819 / 5731 tok/s, TTFT 2.3 / 3.3 ms, vs "
        "transformers 46 / 309 tok/s, 24.9 / 30.6 ms in that run (onnxruntime fp16's TTFT "
        "4.4 / 46.5 ms in the earlier one)",
    ),
    ("nvidia", "tts"): Choice(
        "torch",
        None,
        "bench tts, NVIDIA H100, 30 words: torch RTF 0.012, first audio 32 ms "
        "vs onnxruntime (CUDA provider) 0.023 / 83 ms (its convolutions' lengths change per "
        "sentence; ORT adds 18 copies between the CPU and the GPU to one of its graphs)",
    ),
}


@lru_cache(maxsize=1)
def cpu_features() -> frozenset[str]:
    """The CPU flags that matter here (from /proc/cpuinfo; elsewhere from torch's CPU capability)."""
    from speechrt.machine import cpu_flags

    flags = cpu_flags()
    if flags is None:
        cap = torch.backends.cpu.get_cpu_capability().lower()  # e.g. avx2, avx512
        flags = {cap, "avx2"} if cap.startswith("avx512") else {cap}
    return frozenset(flags & {"avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16"})


def machine_kind(device: str | None) -> str:
    """A GPU's kind ('nvidia'; 'rocm' for torch's ROCm build), or the CPU's: 'amx' (native bf16 matmuls),
    'avx512', 'avx2', 'generic'."""
    if device not in (None, "cpu") and (
        str(device).startswith(("cuda", "rocm")) or (device == "auto" and torch.cuda.is_available())
    ):
        return "rocm" if torch.version.hip else "nvidia"
    f = cpu_features()
    if {"amx_tile", "amx_bf16"} <= f:
        return "amx"
    if "avx512f" in f:
        return "avx512"
    return "avx2" if "avx2" in f else "generic"


def choose(family: str, device: str | None) -> Choice:
    kind = machine_kind(device)
    c = TABLE.get((kind, family))
    if c is None:
        c = Choice("torch", None, f"not measured on a {kind} machine: torch, its default precision")
    else:
        why = NEEDS[c.needs]() if c.needs else None
        if why and c.instead is not None:  # e.g. no C compiler for the CPU kernel: the runner-up
            c = Choice(c.instead.backend, c.instead.dtype, f"{c.backend} {c.dtype}: {why}; {c.instead.why}")
        if not runs(c.backend, family):  # e.g. triton not installed: the measured choice cannot run
            c = Choice(
                "torch",
                None,
                f"{c.backend} is not installed here (measured fastest on a {kind} "
                "machine): torch, its default precision",
            )
    log.info("backend auto for %s on %s: %s %s (%s)", family, kind, c.backend, c.dtype or "default", c.why)
    return c


def resolve(family: str, backend: str, device: str | None, dtype: str | None = None) -> tuple[str, str | None]:
    """The backend and precision a runner asked for as (backend, dtype) runs on: 'auto' -> the table's choice
    (`choose`), whose precision replaces an 'auto' or unset dtype; an explicit dtype is passed through. The one
    place that says what `--backend auto` runs (the server's models, the Python API, `bench all --quick`)."""
    if backend != "auto":
        return backend, dtype
    c = choose(family, device)
    if dtype in (None, "auto"):  # 'auto' precision under the auto backend: the table's
        dtype = c.dtype or dtype
    return c.backend, dtype


def _delegate(family: str):
    def build(self, model, device="cpu", dtype=None, step_threads=None):
        backend, dtype = resolve(family, "auto", device, dtype)
        return getattr(get(backend), family)(model, device=device, dtype=dtype, step_threads=step_threads)

    build.__name__ = family
    return build


class AutoBackend(Backend):
    """Builds each family's runner on the backend `choose` picks; an explicit dtype is passed through."""

    name = "auto"
    families = ("asr", "lm", "tts")
    asr, lm, tts = _delegate("asr"), _delegate("lm"), _delegate("tts")
