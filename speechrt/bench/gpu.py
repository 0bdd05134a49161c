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
- lm-fused: the Llama decode step in the fused layer kernels against the unfused one (both from graphs) and
  torch eager, at the SmolLM2-135M and Llama-3.2-1B shapes (random bf16 weights), with the fraction of the
  measured copy bandwidth each step's bytes take (gpu_fused.py);
- lm-quant: the Llama-3.2-1B-shape decode step at batch 1 in bf16, int4 (W4A16) and fp8 (E4M3) from graphs: time,
  speed-up over bf16, fraction of the copy bandwidth, and the logits against bf16 models (gpu_quant.py);
- onnxruntime: each GPU execution provider installed (CUDA, TensorRT, ROCm, MIGraphX) runs the Piper
  voice graph like the CPU provider does;
- tensorrt: the TensorRT package, if installed;
- roofline: `speechrt bench kernels` (Triton vs torch eager and torch.compile against the measured
  copy/GEMM roofline), its records in the same file;
- server-ramp: the streaming server's load ramp (`bench server` from several client processes: 1, 64, 128, ...,
  2048 streams, to the first level that misses p95 final <= 1 s, within --server-budget), with the GPU's busy share
  (NVML), the engines' and the host's cores per level, its records in the same file (gpu_server.py; with
  `--device cpu` it runs on the CPU, all but CUDA and NVML).

The backend parity checks are gpu_parity.py, the graph checks gpu_graphs.py. Without a GPU every check that
needs one is a skip that says so; the exit status is 1 only when a check
failed.
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time
from pathlib import Path

from speechrt.bench import gpu_server
from speechrt.bench.gpu_fused import check_lm_fused
from speechrt.bench.gpu_graphs import check_asr_batches, check_cuda_graphs, check_lm_graphs
from speechrt.bench.gpu_parity import (
    check_asr_onnxruntime,
    check_asr_triton,
    check_lm_onnxruntime,
    check_lm_triton,
    no_ort_gpu,
)
from speechrt.bench.gpu_quant import check_lm_quant
from speechrt.bench.record import Check, Record, Results
from speechrt.cli_paths import output_file

TOL = {"float32": (1e-4, 1e-4), "float16": (1e-2, 1e-2), "bfloat16": (2e-2, 2e-2)}  # (rtol, atol) of kernels


def add_arguments(p):
    p.add_argument(
        "--json",
        default="speechrt-gpu.json",
        type=output_file("--json", "speechrt-gpu.json"),
        help="result file (default: %(default)s)",
    )
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
                "lm-fused",
                "lm-quant",
                "onnxruntime",
                "tensorrt",
                "roofline",
                "server-ramp",
            ]
        ),
    )
    p.add_argument("--quick", action="store_true", help="roofline without torch.compile (minutes less)")
    gpu_server.add_arguments(p)


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


def compare_providers(providers: list[str]) -> tuple[list[str], list[str]]:
    """The Piper voice graph (noise scales 0: deterministic) on each execution provider, with the options
    speechrt runs it with, against the CPU provider: -> (agreements, failures), one line each. float32 audio
    must agree within 1e-4; a session that silently fell back to the CPU provider fails."""
    import numpy as np

    from speechrt.backends.onnxruntime.providers import provider_options
    from speechrt.backends.onnxruntime.shipped import OrtTTSRunner
    from speechrt.models.registry import resolve
    from speechrt.models.tts_options import SynthesisOptions
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


def check_onnxruntime(dev, out: Results):
    import onnxruntime as ort

    why = no_ort_gpu()
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
    "lm-fused": check_lm_fused,
    "lm-quant": check_lm_quant,
    "onnxruntime": check_onnxruntime,
    "tensorrt": check_tensorrt,
    "roofline": check_roofline,
    "server-ramp": gpu_server.check_server_ramp,  # called with the command's options: (args, out)
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
    "lm-fused",
    "lm-quant",
    "roofline",
    "server-ramp",  # except with --device cpu
}
NEEDS_TRITON = NEEDS_TORCH_GPU - {"gpu", "asr-onnxruntime", "lm-onnxruntime", "server-ramp"}


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
        if name in NEEDS_TORCH_GPU and no_gpu and not (name == "server-ramp" and args.device == "cpu"):
            status, detail = "skip", no_gpu
        elif name in NEEDS_TRITON and no_triton:
            status, detail = "skip", no_triton
        else:
            try:
                fn = CHECKS[name]
                if name == "server-ramp":
                    status, detail = fn(args, out)
                else:
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
