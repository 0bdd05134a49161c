"""`bench gpu`'s lm-quant check: the Llama-3.2-1B-shape decode step (batch 1, random weights written here) with its
linear layers in bf16, int4 (W4A16, groups of 32 with float16 scales, as a GGUF's Q4 blocks) and fp8 (E4M3,
per-channel scales), each unfused and in the fused layer kernels (kernels/triton_fused.py, and on quantized weights
kernels/triton_fused_quant.py), each replayed from a CUDA/HIP graph: time per step, its speed-up over the unfused
bf16 step (the same kernels around the matmuls) and, fused, over its own unfused step, and the fraction of the
measured copy bandwidth its bytes (every weight buffer the step reads, scales included, and the cache) take.
Accuracy: each quantized step's logits (unfused and fused) against a bf16 model built from its dequantized weights
(the kernels' error; tolerance 5e-2 of the largest logit) and, reported, against the bf16 model of the original
weights (the quantization's error, argmax agreement). Each fused step also runs with the K splits of its
ops off ("-fused-nosplit": kernels/triton_fused_split.SPLITS = 1 while it is captured and run; the split one is as
dispatched: at one row the 1B shape's Q/K/V in 3, its o and down projections in 4 and 5), so that a GPU run tells
whether the rule pays.

`run_cases()` runs anywhere the kernels run (tests run it on the CPU on a tiny config in the Triton interpreter,
uncaptured); only `check_lm_quant()` wants a GPU."""

from __future__ import annotations

import statistics

from speechrt.bench.gpu_fused import SHAPES, random_weights, without_splits
from speechrt.bench.record import Repeats, Results, gpu_record
from speechrt.models.llama import LlamaConfig

VARIANTS = ("bf16-fused", "bf16", "int4", "int4-fused", "fp8", "fp8-fused")
VARIANTS += ("bf16-fused-nosplit", "int4-fused-nosplit", "fp8-fused-nosplit")
CONTEXT = 512
KERNEL_TOL = 5e-2  # quantized step vs bf16 on the dequantized weights: relative to the largest logit
LINEAR = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")


def int4_blocks(w: dict, cfg: LlamaConfig) -> dict:
    """Each layer's linear weights as 4-bit groups of 32 with float16 scales and zeros (what a GGUF's Q4_1 holds)."""
    from speechrt.models.llama_layers import quantize_int4

    out = {}
    for i in range(cfg.n_layers):
        for n in LINEAR:
            q, s, z = quantize_int4(w[f"layers.{i}.{n}"])
            out[f"layers.{i}.{n}"] = (q, s.half().float(), z.half().float())
    return out


def dequantized(w: dict, cfg: LlamaConfig, fmt: str, q4: dict | None = None) -> dict:
    """The float32 weights a model of `fmt` computes with: the int4 groups or the fp8 values times their scales, and
    the int8 head both formats keep."""
    import torch

    from speechrt.kernels import reference as ref

    if cfg.tie_embeddings:  # the gather reads the original table; only an untied head can be swapped
        raise ValueError("dequantized() wants an untied head (cfg.tie_embeddings False)")
    out, head = dict(w), "output"
    for name in [f"layers.{i}.{n}" for i in range(cfg.n_layers) for n in LINEAR] + [head]:
        if name == head:  # the head stays int8 (per row) under both formats
            x = w[name].float()
            scale = x.abs().amax(1, keepdim=True).clamp_min(1e-12) / 127
            out[name] = torch.round(x / scale).clamp_(-127, 127) * scale
        elif fmt == "fp8":
            q, s = ref.quantize_fp8(w[name])
            out[name] = q.float() * s[:, None]
        else:
            q, s, z = q4[name]
            out[name] = ref.dequantize_int4(q, torch.stack([s.t(), z.t()], -1))
    return out


def step_bytes(model, batch: int, context: int) -> int:
    """Bytes a decode step reads at least: every buffer and parameter of the layers and the head (weights,
    scales, norms), one embedding row per sequence, each row's keys and values."""
    cfg = model.cfg
    n = sum(t.numel() * t.element_size() for m in (model.layers, model.output, model.norm) for t in _tensors(m))
    emb = model.tok_embeddings
    kv = 2 * batch * cfg.n_layers * cfg.n_kv_heads * (context + 1) * cfg.head_dim * 2
    return n + batch * emb.shape[1] * emb.element_size() + kv


def _tensors(m):
    import torch

    if isinstance(m, torch.Tensor):
        return [m]
    return [t for t in (*m.parameters(), *m.buffers()) if t is not None]


def _models(cfg: LlamaConfig, device):
    """variant -> Llama on `device`, and name -> the bf16 reference model of each quantized variant."""
    import torch

    from speechrt import kernels
    from speechrt.models.llama import Llama

    tri = kernels.select("triton", device)
    w = random_weights(cfg, device, torch.float32)
    w["output"] = w["tok_embeddings"].clone()  # untied, so that the references can swap the head alone
    q4 = int4_blocks(w, cfg)
    models = {"bf16": Llama(cfg, w, tri, device, "bfloat16")}
    models["int4"] = Llama(cfg, w, tri, device, "int4", q4=q4)
    models["fp8"] = Llama(cfg, w, tri, device, "fp8")
    refs = {f: Llama(cfg, dequantized(w, cfg, f, q4), tri, device, "bfloat16") for f in ("int4", "fp8")}
    return models, refs


def run_cases(device, cfg: LlamaConfig, out: Results, timer, bandwidth_gbps: float, context=CONTEXT, capture=True):
    """Time every variant at batch 1 over `context` cached positions (records in `out`) -> problems: a quantized
    step's logits further than KERNEL_TOL from its dequantized bf16 model's."""
    import torch

    from speechrt.backends.cuda_graphs import CapturedStep
    from speechrt.kernels.triton_fused import OPS as FUSED
    from speechrt.kernels.triton_fused_quant import OPS as FUSED_QUANT
    from speechrt.models.llama_fused import decode_range_fused

    cfg = cfg.replace(tie_embeddings=False)
    models, refs = _models(cfg, device)
    caches = {}
    for name, m in [*models.items(), *((f"ref-{k}", v) for k, v in refs.items())]:
        c = caches[name] = m.new_cache(1, context + 1)
        c.k.normal_(generator=torch.Generator(device=device).manual_seed(1))
        c.v.normal_(generator=torch.Generator(device=device).manual_seed(2))
    tokens = torch.tensor([7], device=device)
    pos = torch.full((1,), context, device=device)
    tk = context + 1

    def step(m, cache, fops=None, split=True):  # fops: the fused ops (split: K as dispatched); None: unfused
        if fops is None:
            return CapturedStep(lambda: m.decode_range(cache, 0, tokens, pos, tk), capture)

        def fused():
            return decode_range_fused(m, fops, cache, 0, tokens, pos, tk)

        return CapturedStep(fused if split else without_splits(fused), capture)

    steps = {}
    for f in ("bf16", "int4", "fp8"):  # a fused step shares its model's cache: both write the position they read
        steps[f] = step(models[f], caches[f])
        steps[f"{f}-fused"] = step(models[f], caches[f], FUSED if f == "bf16" else FUSED_QUANT)
        steps[f"{f}-fused-nosplit"] = step(models[f], caches[f], FUSED if f == "bf16" else FUSED_QUANT, False)
    steps = {v: steps[v] for v in VARIANTS}
    base = steps["bf16"]().float()
    bad, acc = [], {}
    for f in ("int4", "fp8"):
        want = step(refs[f], caches[f"ref-{f}"])().float()
        for v in (f, f"{f}-fused", f"{f}-fused-nosplit"):
            got = steps[v]().float()
            err = ((got - want).abs().amax() / want.abs().amax().clamp_min(1e-30)).item()
            q_err = ((got - base).abs().amax() / base.abs().amax().clamp_min(1e-30)).item()
            acc[v] = {
                "kernel_rel_err": err,
                "quantization_rel_err": q_err,
                "argmax_vs_bf16": float((got.argmax(-1) == base.argmax(-1)).float().mean()),
            }
            if not (err <= KERNEL_TOL):
                bad.append(f"{v}: logits {err:.3g} (relative) from the bf16 model of its dequantized weights")
    refs.clear()
    times = {}
    for v, fn in steps.items():
        ts = timer(fn)
        times[v] = statistics.median(ts)
        nbytes = step_bytes(models[v.split("-")[0]], 1, context)
        out.records.append(
            gpu_record(
                model="llama-1b-shape" if cfg.dim == 2048 else f"llama d{cfg.dim}",
                precision=v,
                device=str(device),
                workload=f"decode step, batch 1, {context} cached positions, random weights",
                metric="decode_step_us",
                unit="us",
                value=times[v] * 1e6,
                better="lower",
                repeats=Repeats.of(x * 1e6 for x in ts),
                peer="" if v == "bf16" else "bf16",
                params={
                    "batch": 1,
                    "bytes": nbytes,
                    "fraction_of_bandwidth": nbytes / times[v] / (bandwidth_gbps * 1e9) if bandwidth_gbps else 0.0,
                    "speedup_vs_bf16_unfused": 0.0,
                    "speedup_vs_unfused": 0.0,
                    **acc.get(v, {}),
                },
            )
        )
    for r in out.records[-len(steps) :]:
        r.params["speedup_vs_bf16_unfused"] = times["bf16"] / times[r.precision]
        r.params["speedup_vs_unfused"] = times[r.precision.split("-")[0]] / times[r.precision]
    return bad


def check_lm_quant(dev, out: Results):
    import torch

    from speechrt.bench.roofline import probe, timer

    bw = probe(dev, torch.bfloat16).bandwidth_gbps
    n0 = len(out.records)
    bad = run_cases(dev, SHAPES["llama-3.2-1b"], out, timer(dev), bw)
    parts = [f"copy {bw:.0f} GB/s"]
    for r in out.records[n0:]:
        p = r.params
        s = f"{r.precision} {r.value:.0f} us ({p['fraction_of_bandwidth']:.0%} of bw"
        s += f", {p['speedup_vs_bf16_unfused']:.2f}x bf16"
        s += f", {p['speedup_vs_unfused']:.2f}x unfused)" if "-fused" in r.precision else ")"
        if "kernel_rel_err" in p:
            s += f" err {p['kernel_rel_err']:.2g}, quantization {p['quantization_rel_err']:.2g}"
            s += f", argmax {p['argmax_vs_bf16']:.0%} as bf16's"
        parts.append(s)
    return ("fail" if bad else "pass"), "; ".join(bad + parts)
