"""`speechrt bench gpu --json gpu.json`: everything that can only be checked on a GPU, in one command.

Checks, in the table's order (TABLE: the most valuable first; each one pass / fail / skip with what it compared or
why it could not run):
- gpu: the device PyTorch sees (name, compute capability or gfx arch, runtime);
- kernels: every Triton kernel against the torch reference on the GPU, at the models' shapes;
- lm-fused: the Llama decode step in the fused layer kernels against the unfused one (both from graphs) and
  torch eager, at the SmolLM2-135M and Llama-3.2-1B shapes (random bf16 weights), with the fraction of the
  measured copy bandwidth each step's bytes take, and the fused step with its K splits off, with programmatic
  dependent launch (kernels/triton_pdl.py, NVIDIA sm_90+), and with K split down to 2 tiles; the fused ops' K splits
  merged in their own launch checked against a second launch on poisoned buffers (gpu_fused.py);
- asr-fused: the same for the Whisper decoder step (float16, batch 1 and 8, Whisper tiny and large-v3-turbo decoder
  shapes, random weights): fused against unfused (logits and greedy ids) and torch eager, without its K splits, with
  programmatic dependent launch and with K split down to 2 tiles (gpu_fused_asr.py);
- asr-pick: Whisper's greedy pick alone (random logits over its vocabulary) at batch 1 and 8 from graphs: the split
  launch (merged in the launch), twice its chunks, merged by a second launch, one program a row and the torch ops,
  with their ids, and the merge checked on poisoned buffers (gpu_pick.py);
- lm-loop: the language model's decode loop on the device (several steps and their sampling per graph replay)
  against one step per replay: greedy SmolLM2 bf16 tokens per second at batch 1 and 8 with K = 1, 8 and 16, and
  the same ids (gpu_loop.py; with `--device cpu` it runs uncaptured in float32);
- asr-loop: Whisper's greedy decode loop on the device (K steps with the logit rules and argmax per graph replay)
  against one step per replay: time per token at batch 1 (a 30-s window with timestamps) and 8 (a server's batch,
  and its live rounds drafted: the drafts checked on the device), K = 1 and 8, and the same ids (gpu_asr_loop.py;
  with `--device cpu` uncaptured in float32);
- lm-quant: the Llama-3.2-1B-shape decode step at batch 1 in bf16, int4 (W4A16) and fp8 (E4M3), each unfused and in
  the fused layer kernels (with K splits as dispatched and off), from graphs: time, speed-up over bf16 and (fused)
  over unfused, fraction of the copy bandwidth, and the logits against bf16 models (gpu_quant.py);
- lm-prefill: a prompt's pass (128 and 512 tokens, SmolLM2-135M and Llama-3.2-1B shapes, random bf16 weights), ours
  from its prefill graph against SDPA + cuBLAS eager, with the fraction of the matrix peak, ours with its matrix
  products on cuBLAS, and our kernel time by kind from torch.profiler: what fusing the prefill could save
  (gpu_prefill.py);
- attention: decode attention at batch 1/8/64 over caches of 448 and 4096 (split along the cache and unsplit) and
  encoder attention at Whisper tiny and large-v3-turbo shapes against SDPA, each with its ratio (gpu_attention.py);
- asr-turbo: the Whisper large-v3-turbo shape's 30-s encoder pass and decode step against SDPA + cuBLAS eager, with
  their fractions of the measured roofline, and our encoder pass with its GEMMs on cuBLAS (gpu_large.py);
- gemv-tiles: a sweep of the fused decode-step ops' tiles (K tile, stages, column tile, warps) at one and eight rows
  of the SmolLM2-135M and Llama-3.2-1B shapes, each tile set with the K split the rule gives it and checked against
  the default's output: time per launch, fraction of the copy bandwidth, the best set against the default
  (gpu_tiles.py);
- lm-1b: the Llama-3.2-1B shape's decode step at batch 1, our graphed fused runner against the same step with a
  static cache in plain torch, eager and under torch.compile(mode="max-autotune") (gpt-fast's recipe,
  static_llama.py), with the fraction of the measured bandwidth (gpu_large.py);
- lm-peers: `bench lm` on the embedded SmolLM2, the triton backend in bf16 against gpt-fast's recipe
  (torch-compile-static) and transformers on the same GPU, batch 1 and 8 (tok/s and the ratios; its records in the
  same file);
- cuda-graphs: the triton ASR decode step replayed from a CUDA/HIP graph against the same step run
  eagerly (logits, and time per step);
- lm-graphs: the same for the triton language model's decode step (bf16, two sequences of different
  lengths, the eager run's tokens fed to both) and its prompts' prefill (logits, and time per prompt);
- asr-batches: what a loaded server asks of the triton ASR runner: batches of 1-8 utterances of random
  lengths (server options, a third capped at 4 tokens like live openings) with the decode steps on the
  graph slots against the same batches eager (float32: the same text; float16: time per batch, graphs
  captured, captures failed);
- mel-batch: the log-mel features of 64 utterances (0.01-30 s) in one pass on the device against one utterance at
  a time: the same windows, and the time of each, 80 and 128 bins (gpu_mel.py; with `--device cpu` on the CPU);
- lm-triton: the triton backend's greedy ids (32 tokens, float32) against the torch backend's;
- asr-triton: the triton backend's Whisper token ids against the torch backend's on the GPU (float32), and
  its float16 transcript;
- roofline: `speechrt bench kernels` (Triton vs torch eager and torch.compile against the measured
  copy/GEMM roofline), its records in the same file;
- lm-onnxruntime: the onnxruntime backend's float16 and int4 language-model graphs (float16 activations on a GPU
  provider) against the torch backend's float32, fed the same tokens: logits within tolerance, greedy ids reported;
- asr-onnxruntime: the asr-triton comparison for the onnxruntime backend on the GPU's execution provider;
- onnxruntime: each GPU execution provider installed (CUDA, TensorRT, ROCm, MIGraphX) runs the Piper
  voice graph like the CPU provider does;
- tensorrt: the TensorRT package, if installed;
- server-ramp: the streaming server's load ramp (`bench server` from several client processes: 1, 64, 128, ...,
  2048 streams, to the first level that misses p95 final <= 1 s, within --server-budget), with the GPU's busy share
  (NVML), the engines' and the host's cores per level, its records in the same file (gpu_server.py; with
  `--device cpu` it runs on the CPU, all but CUDA and NVML).

`--budget` (default 550 s: a command's 10 minutes on a lent GPU, less its Python start and an overrun) plans the run
with each check's estimate: a check that no longer fits what is left of the budget is skipped with its estimate, what
was left and how to run it alone (in the output, the result file's checks and its skips); each check's time is noted in
the file beside its estimate. The file is written after every check, so a run cut short keeps what it measured. A check
that leaves the GPU context unusable (a kernel's illegal memory access) does not fail the ones after it: they run in a
fresh process (gpu_resume.py). A check that raised says where, its traceback on stderr. The backend parity checks are
gpu_parity.py, the graph checks gpu_graphs.py. Without a GPU every check that needs one is a skip that says so, and so
is a check whose embedded model is not installed (with the package to install: the other checks load none); the exit
status is 1 only when a check failed."""

from __future__ import annotations

import argparse
import math
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from speechrt.bench import gpu_resume, gpu_server
from speechrt.bench.gpu_asr_loop import check_asr_loop
from speechrt.bench.gpu_attention import check_attention
from speechrt.bench.gpu_fused import check_lm_fused
from speechrt.bench.gpu_fused_asr import check_asr_fused
from speechrt.bench.gpu_graphs import check_asr_batches, check_cuda_graphs, check_lm_graphs
from speechrt.bench.gpu_large import check_asr_turbo, check_lm_1b
from speechrt.bench.gpu_loop import check_lm_loop
from speechrt.bench.gpu_mel import check_mel_batch
from speechrt.bench.gpu_parity import (
    check_asr_onnxruntime,
    check_asr_triton,
    check_lm_onnxruntime,
    check_lm_triton,
    no_ort_gpu,
)
from speechrt.bench.gpu_pick import check_asr_pick
from speechrt.bench.gpu_prefill import check_lm_prefill
from speechrt.bench.gpu_quant import check_lm_quant
from speechrt.bench.gpu_tiles import check_gemv_tiles
from speechrt.bench.record import Check, Results, gpu_record
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
        help="comma list of checks to run, in the order given (default: all, most valuable first): "
        + ", ".join(f"{s.name} (~{s.estimate_s:.0f} s)" for s in TABLE),
    )
    p.add_argument(
        "--budget",
        type=float,
        default=BUDGET_S,
        metavar="SECONDS",
        help="seconds of checks in all: a check whose estimate does not fit what is left is skipped, saying so "
        "(in the output and the result file); 0: no limit (default: %(default)s, for a 10-minute GPU session)",
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
                gpu_record(
                    model=op,
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


LM_PEERS = "torch-compile-static,transformers"


def lm_peer_args(device: str, json_path) -> argparse.Namespace:
    """`bench lm`'s options for the lm-peers check: the embedded SmolLM2 on the triton backend in bf16 on `device`
    against gpt-fast's compiled static-cache step and transformers there, batch 1 and 8, 64 tokens, best of 3."""
    from speechrt.bench import lm

    p = argparse.ArgumentParser()
    lm.add_arguments(p)
    args = ["--device", device, "--backends", "triton", "--dtype", "bfloat16", "--batch", "1,8", "--peers", LM_PEERS]
    return p.parse_args(args + ["--repeats", "3", "--json", str(json_path)])


def check_lm_peers(dev, out: Results):
    from speechrt.bench import lm
    from speechrt.bench.record import load

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "lm.json"
        lm.run(lm_peer_args(str(dev), path))
        res = load(path)
    out.records += res.records
    out.skipped += res.skipped
    tps = {(r.engine, r.params["batch"]): r.value for r in res.records if r.metric == "decode_tok_s"}
    parts = []
    for b in sorted({b for _, b in tps}):
        ours = tps.get(("speechrt", b), 0.0)
        peers = [f"{e} {v:.0f} (ours {ours / v:.2f}x)" for (e, bb), v in tps.items() if bb == b and e != "speechrt"]
        parts.append(f"batch {b}: ours {ours:.0f} tok/s, " + ", ".join(peers))
    return "pass", "; ".join(parts + [f"{s.what} skipped: {s.reason}" for s in res.skipped])


GPU, TRITON, ANY = "gpu", "triton", ""  # what a check needs: a torch GPU, that and Triton, nothing
ASR, LM, SERVER = ("asr",), ("lm",), ("asr", "vad")  # the embedded models a check loads (Spec.loads)


@dataclass(frozen=True)
class Spec:
    """One check of the table: its name, its time on an H100/H200 in seconds (a fresh machine: Triton compiles
    and captures included; what the --budget is planned with), its function and what it needs. `fn(dev, out)`
    -> (status, detail), or `fn(dev, out, args)` (the command's options) with takes_args. `loads`: the families
    of the embedded models it loads (models.registry's defaults)."""

    name: str
    estimate_s: float
    fn: Callable
    needs: str = TRITON
    takes_args: bool = False
    cpu_too: bool = False  # with --device cpu it runs on the CPU (uncaptured, no NVML)
    loads: tuple[str, ...] = ()


def missing_model(spec: Spec) -> str | None:
    """Why `spec` cannot run here for want of an embedded model it loads (what to install), or None."""
    from speechrt.models.registry import ModelError, resolve

    for family in spec.loads:
        try:
            resolve(None, family)
        except ModelError as e:
            return f"needs the default {family} model: {e}"
    return None


def _roofline(dev, out, args):
    return check_roofline(dev, out, args.quick)


def _server_ramp(dev, out, args):  # --device cpu runs it on the CPU
    return gpu_server.check_server_ramp(args, out)


# The checks, most valuable first: with a --budget the ones that no longer fit are skipped, so the order is what a
# short GPU session measures. One row per check (add a row to add a check). Estimates: the run times printed by
# earlier runs where there were any (H100/H200), else the compile and timing work counted (lm-1b: torch.compile
# max-autotune of a 16-layer step, its length unmeasured: last of the new checks, so an overrun costs only what follows)
TABLE = (
    Spec("gpu", 2, check_gpu, GPU),
    Spec("kernels", 30, check_kernels),
    Spec("lm-fused", 90, check_lm_fused),  # 60 before its nosplit, pdl and split2 steps and merge check: counted
    Spec("asr-fused", 68, check_asr_fused),  # 45 before its nosplit, pdl and split2 steps: counted, not measured
    Spec("asr-pick", 10, check_asr_pick, cpu_too=True),  # counted: part of asr-loop's 35 s before it was its own
    Spec("lm-loop", 52, check_lm_loop, cpu_too=True, loads=LM),  # 45 before its K = 16 blocks: counted
    Spec("asr-loop", 28, check_asr_loop, cpu_too=True, loads=ASR),
    Spec("lm-quant", 95, check_lm_quant),  # 80 before its three -fused-nosplit steps: counted
    Spec("lm-prefill", 48, check_lm_prefill),  # 40 before its vendor-GEMM runner (its own graphs): counted
    Spec("attention", 40, check_attention),
    Spec("asr-turbo", 60, check_asr_turbo),
    Spec("gemv-tiles", 35, check_gemv_tiles),  # counted: ~45 compiles of 4 new tile sets (M = 1 / 8, split or not
    # apart) at ~0.5 s, 80 timings of ~35 ms, the bandwidth probe
    Spec("lm-1b", 240, check_lm_1b),
    Spec("lm-peers", 240, check_lm_peers, loads=LM),
    Spec("cuda-graphs", 20, check_cuda_graphs, loads=ASR),
    Spec("lm-graphs", 30, check_lm_graphs, loads=LM),
    Spec("asr-batches", 60, check_asr_batches, loads=ASR),
    Spec("mel-batch", 10, check_mel_batch, GPU, cpu_too=True),
    Spec("lm-triton", 30, check_lm_triton, loads=LM),
    Spec("asr-triton", 30, check_asr_triton, loads=ASR),
    Spec("roofline", 150, _roofline, takes_args=True),
    Spec("lm-onnxruntime", 90, check_lm_onnxruntime, GPU, loads=LM),
    Spec("asr-onnxruntime", 60, check_asr_onnxruntime, GPU, loads=ASR),
    Spec("onnxruntime", 20, check_onnxruntime, ANY, loads=("tts",)),
    Spec("tensorrt", 1, check_tensorrt, ANY),
    Spec("server-ramp", 120 + gpu_server.BUDGET_S, _server_ramp, GPU, takes_args=True, cpu_too=True, loads=SERVER),
)
CHECKS = {s.name: s for s in TABLE}
BUDGET_S = 550.0  # the default --budget: a command's 600 s on a lent GPU, less its Python start and an overrun


def estimate(spec: Spec, args) -> float:
    """Seconds `spec` is planned to take with these options (the ramp: its --server-budget of levels and its start;
    the roofline without torch.compile with --quick)."""
    if spec.name == "server-ramp":
        return 120 + args.server_budget
    if spec.name == "roofline" and args.quick:
        return 60
    return spec.estimate_s


def over_budget(spec: Spec, args, spent: float) -> str | None:
    """Why `spec` is skipped for the --budget after `spent` seconds of checks (None: it fits or there is no budget)."""
    if not args.budget:
        return None
    left, need = args.budget - spent, estimate(spec, args)
    if need <= left:
        return None
    return (
        f"not run: estimated {need:.0f} s, {max(left, 0):.0f} s left of --budget {args.budget:.0f} s "
        f"(run it alone: --checks {spec.name})"
    )


def run(args):
    import torch

    from speechrt.errors import UserError

    names = [c.strip() for c in args.checks.split(",")] if args.checks else list(CHECKS)
    bad = [c for c in names if c not in CHECKS]
    if bad:
        raise UserError(f"unknown check(s) {', '.join(bad)}; valid: {', '.join(CHECKS)}")
    if args.budget < 0:
        raise UserError(f"--budget must be seconds >= 0 (0: no limit), got {args.budget:g}")
    out = Results()
    no_gpu, no_triton = _no_gpu(), None
    if no_gpu is None:
        try:
            import triton  # noqa: F401
        except ImportError:
            no_triton = "Triton is not installed (pip install 'speechrt[triton]')"
    dev = torch.device(args.device) if no_gpu is None else None
    if args.budget:
        planned = sum(estimate(CHECKS[n], args) for n in names)
        print(f"budget {args.budget:.0f} s for {len(names)} checks estimated at {planned:.0f} s in all", flush=True)
    from speechrt.bench.fingerprint import fingerprint

    machine, start = fingerprint(), time.monotonic()
    for i, name in enumerate(names):
        spec, t0 = CHECKS[name], time.monotonic()
        on_cpu = spec.cpu_too and args.device == "cpu"
        if spec.needs and no_gpu and not on_cpu:
            status, detail = "skip", no_gpu
        elif spec.needs == TRITON and no_triton and not on_cpu:
            status, detail = "skip", no_triton
        elif why := over_budget(spec, args, t0 - start) or missing_model(spec):
            status, detail = "skip", why
        else:
            try:
                if spec.takes_args:
                    status, detail = spec.fn(dev, out, args)
                else:
                    status, detail = spec.fn(torch.device("cpu") if on_cpu else dev, out)
            except Exception as e:  # a crashing check is a failed check, and the others still run
                status, detail = "fail", gpu_resume.failure(e)
            out.notes.append(f"check {name}: {time.monotonic() - t0:.0f} s (estimated {estimate(spec, args):.0f} s)")
        out.checks.append(Check(name, status, detail))
        if status == "skip":
            out.skip("gpu", name, detail)
        print(f"{status.upper():4} {name:12} {detail} ({time.monotonic() - t0:.0f} s)", flush=True)
        lost = status == "fail" and i + 1 < len(names) and not gpu_resume.context_alive(dev)
        if lost:
            gpu_resume.resume(args, names[i + 1 :], name, args.budget - (time.monotonic() - start), out)
        out.write(args.json, machine)  # after every check: a run cut short (a session's end) keeps what it measured
        if lost:
            break  # the checks left ran in a fresh process
    failed = [c.name for c in out.checks if c.status == "fail"]
    skipped = [c.name for c in out.checks if c.status == "skip"]
    print(
        f"{len(out.checks)} checks: {len(failed)} failed{' (' + ', '.join(failed) + ')' if failed else ''}, "
        f"{len(skipped)} skipped{' (' + ', '.join(skipped) + ')' if skipped else ''} -> {args.json}"
    )
    return 1 if failed else 0
