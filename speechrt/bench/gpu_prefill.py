"""`bench gpu`'s lm-prefill check: the profile that tells whether fusing the prompt pass pays.

A prompt of P tokens runs the language model's layers as matrix products of P rows, which a GPU's matrix units
make compute-bound from a few dozen rows on; the norms, rotary, activations and copies between them are what a
fused prefill would save. At the SmolLM2-135M and Llama-3.2-1B shapes (random bf16 weights), prompts of 128 and 512
tokens at batch 1: the triton backend's prefill (from its captured prefill graph) against the same pass in plain
torch (SDPA + cuBLAS, static_llama.py), each with its fraction of the measured matrix throughput, and ours with its
matrix products on torch's matmul (triton_matmul.VENDOR_GEMM_MIN_ROWS, captured so: "speechrt-vendor-gemm"); and, from
torch.profiler on a GPU, our pass's kernel time by kind (matrix products, attention, norms, rotary, activations, the
rest; profiled eagerly, the kernels its graph replays) with its launch count. The time outside the matrix products
and attention bounds what fusing the rest could save.

`run_prefill()` runs anywhere the kernels run (the tests: a tiny config on the CPU in the Triton interpreter,
uncaptured, no profile); only `check_lm_prefill()` wants a GPU."""

from __future__ import annotations

import re
import statistics
from types import SimpleNamespace

from speechrt.bench.gpu_fused import SHAPES, random_weights
from speechrt.bench.record import Record, Repeats, Results
from speechrt.models.llama import LlamaConfig

PROMPTS = (128, 512)
KINDS = (  # kernel name pattern -> kind, first match wins (Triton kernels, cuBLAS / CUTLASS, torch's own)
    ("attention", r"attention|attn|flash|fmha|sdpa"),
    ("matmul", r"linear|matmul|gemm|gemv|cutlass|xmma|cublas|mm_"),
    ("norm", r"norm"),
    ("rotary", r"rotary|rope"),
    ("activation", r"silu|gelu|gated|swiglu"),
)


def prefill_flops(cfg: LlamaConfig, tokens: int) -> float:
    """FLOPs of one prompt's pass: the layers' projections for every token, causal attention (QK^T and PV over
    half the square on average), and the output head for the last token only."""
    D = cfg.head_dim
    proj = cfg.dim * (cfg.n_heads + 2 * cfg.n_kv_heads) * D + cfg.n_heads * D * cfg.dim + 3 * cfg.hidden_dim * cfg.dim
    attn = 2 * cfg.n_heads * D * tokens * (tokens + 1)  # 2 products x 2 FLOPs x half of tokens^2 x heads x D
    return cfg.n_layers * (2 * tokens * proj + attn) + 2 * cfg.vocab_size * cfg.dim


def kind(name: str) -> str:
    low = name.lower()
    return next((k for k, pat in KINDS if re.search(pat, low)), "other")


def profile(fn, device) -> dict | None:
    """Kernel time (us) by kind and the launch count of one call of `fn` on a GPU (None elsewhere)."""
    if device.type != "cuda":
        return None
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    fn()
    torch.cuda.synchronize(device)
    with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize(device)
    by, launches = {k: 0.0 for k, _ in KINDS} | {"other": 0.0}, 0
    for e in prof.key_averages():
        t = getattr(e, "self_device_time_total", None)
        t = getattr(e, "self_cuda_time_total", 0.0) if t is None else t
        if t > 0:
            by[kind(e.key)] += t
            launches += e.count
    return {"kernel_us": by, "launches": launches}


def run_prefill(
    device, cfg: LlamaConfig, out: Results, timer, matmul_tflops: float, prompts=PROMPTS, capture=True, dtype=None
):
    """Time ours and torch's prefill of each prompt length (records in `out`) -> problems: our last token's logits
    beyond bf16 rounding of torch's."""
    import torch

    from speechrt.backends.triton.lm import TritonLMRunner
    from speechrt.bench.gpu_large import on_vendor_gemm
    from speechrt.bench.static_llama import StaticLlama

    dtype, bad = dtype or torch.bfloat16, []
    w = random_weights(cfg, device, dtype)
    lm_file = SimpleNamespace(config=cfg, weights=w, tokenizer=None, chat_template=None, q4=None)
    runner = TritonLMRunner(lm_file, device, str(dtype).removeprefix("torch."), "triton", capture=capture)
    vendor = TritonLMRunner(lm_file, device, str(dtype).removeprefix("torch."), "triton", capture=capture)
    static = StaticLlama(cfg, w, device, dtype)
    del w, lm_file
    name = next((n for n, c in SHAPES.items() if c == cfg), "llama-shape")
    cache, vcache = runner.new_cache(1, max(prompts)), vendor.new_cache(1, max(prompts))
    static.setup_caches(1, max(prompts))
    g = torch.Generator().manual_seed(3)
    with torch.inference_mode():
        for p in prompts:
            tokens = torch.randint(0, cfg.vocab_size, (p,), generator=g)
            variants = {
                "speechrt": lambda t=tokens: runner.prefill(cache, 0, t),
                "torch": lambda t=tokens: static.prefill(0, t),
                # its products on torch's matmul, captured so in its own graphs
                "speechrt-vendor-gemm": on_vendor_gemm(lambda t=tokens: vendor.prefill(vcache, 0, t)),
            }
            got = {v: fn().float() for v, fn in variants.items()}
            errs = {
                v: ((got[v] - got["torch"]).abs().amax() / got["torch"].abs().amax().clamp_min(1e-30)).item()
                for v in ("speechrt", "speechrt-vendor-gemm")
            }
            for v, err in errs.items():
                if not err <= 5e-2:
                    bad.append(f"{name} {p}-token prefill: {v} logits {err:.3g} (relative) from torch's")
            flops = prefill_flops(cfg, p)
            for v, fn in variants.items():
                ts = timer(fn)
                params = {"variant": v, "tokens": p, "flops": flops, "vs_torch_rel_err": errs.get(v, 0.0)}
                params["fraction_of_matmul"] = (
                    flops / statistics.median(ts) / (matmul_tflops * 1e12) if matmul_tflops else 0.0
                )
                if v == "speechrt":  # its kernels profiled eagerly (the same kernels the graph replays)
                    runner.prefill_graphs_enabled = False
                    if (prof := profile(fn, device)) is not None:
                        params.update(prof)
                    runner.prefill_graphs_enabled = True
                out.records.append(
                    Record(
                        family="gpu",
                        model=name,
                        engine="torch" if v == "torch" else "speechrt",
                        backend="torch" if v == "torch" else "triton graphs" if capture else "triton",
                        precision=str(dtype).removeprefix("torch."),
                        device=str(device),
                        workload=f"prefill, one prompt of {p} tokens, random weights",
                        metric="prefill_us",
                        unit="us",
                        value=statistics.median(ts) * 1e6,
                        better="lower",
                        repeats=Repeats.of(t * 1e6 for t in ts),
                        peer="" if v == "speechrt" else "speechrt",
                        params=params,
                    )
                )
    return bad


def summary(records) -> list[str]:
    """One part per prompt: ours and torch's time, the ratio, our matrix-throughput fraction, and (profiled) the
    share of our kernel time outside matrix products and attention: what fusing the rest could save at most."""
    by = {(r.model, r.params["tokens"], r.params["variant"]): r for r in records}
    parts = []
    for (model, p, v), r in by.items():
        t = by.get((model, p, "torch"))
        if v != "speechrt" or t is None:
            continue
        line = (
            f"{model} {p} tokens: ours {r.value:.0f} us ({r.params['fraction_of_matmul']:.0%} of matmul peak), "
            f"torch {t.value:.0f} us: {t.value / r.value:.2f}x"
        )
        vg = by.get((model, p, "speechrt-vendor-gemm"))
        if vg is not None:
            line += f"; ours with the vendor's GEMMs {vg.value:.0f} us: {t.value / vg.value:.2f}x"
        if r.params.get("launches"):
            k = r.params["kernel_us"]
            rest = sum(x for n, x in k.items() if n not in ("matmul", "attention"))
            share = rest / max(sum(k.values()), 1e-9)
            line += f"; {r.params['launches']} launches, {share:.0%} of kernel time outside matmul and attention"
        parts.append(line)
    return parts


def check_lm_prefill(dev, out: Results, shapes=None, peak=None, clock=None, **plan):
    """`shapes` (default SmolLM2-135M and Llama-3.2-1B), `peak` (default measured here), `clock` (default
    roofline.timer) and run_prefill's `plan` (prompts, capture): what the tests change to run it on the CPU."""
    import torch

    from speechrt.bench.roofline import probe, timer

    peak = peak or probe(dev, torch.bfloat16)
    n0, bad = len(out.records), []
    for cfg in shapes or SHAPES.values():
        bad += run_prefill(dev, cfg, out, clock or timer(dev), peak.matmul_tflops, **plan)
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    parts = [f"matmul {peak.matmul_tflops:.0f} TFLOP/s"] + summary(out.records[n0:])
    return ("fail" if bad else "pass"), "; ".join(bad + parts)
