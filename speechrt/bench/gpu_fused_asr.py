"""`bench gpu`'s asr-fused check: the Whisper decoder step in the fused layer kernels (models/whisper_fused.py) against
the unfused Triton step, both replayed from CUDA/HIP graphs, and torch eager, at the Whisper tiny and large-v3-turbo
decoder shapes with random float16 weights (speed does not depend on the values): time per step, the fused step's
logits and greedy ids against the unfused step's, and the fraction of the measured copy bandwidth its bytes take. The
fused step also runs with its projections' K splits off ("fused-nosplit": kernels/triton_fused_split.SPLITS = 1; as
dispatched, a one-row step splits fc2's K in 3 at Whisper tiny's shape, in 7 at large-v3-turbo's, and turbo's output
projections' in 2), so that a GPU run tells whether the split pays; and with programmatic dependent launch
("fused-pdl": kernels/triton_pdl.py, NVIDIA sm_90+), which decides whether that is turned on; and with the split
rule's minimum lowered to 2 K tiles a split ("fused-split2": Whisper tiny's d 384 splits too).

`plan()` and `step_bytes()` are plain arithmetic; `run_cases()` runs anywhere the kernels run (tests run it on the CPU
on a tiny config in the Triton interpreter, uncaptured); only `check_asr_fused()` wants a GPU."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from speechrt.bench.gpu_fused import pdl_summary, short_splits, time_steps, with_pdl, without_splits
from speechrt.bench.record import Results
from speechrt.models.whisper import WhisperConfig

SHAPES = {
    "whisper-tiny": WhisperConfig(),  # d 384, 6 heads, 4 decoder layers, MLP 1536, vocabulary 51864
    "whisper-large-v3-turbo": WhisperConfig(
        n_mels=128,
        n_audio_state=1280,
        n_audio_head=20,
        n_audio_layer=32,
        n_vocab=51866,
        n_text_state=1280,
        n_text_head=20,
        n_text_layer=4,
    ),
}
BATCHES = (1, 8)
POSITION = 64  # the step's position: tokens already in the cache (a window's transcript so far)
# fused / unfused: Triton kernels replayed from a graph
VARIANTS = ("fused", "unfused", "torch-eager", "fused-nosplit", "fused-pdl", "fused-split2")
MAX_REL_ERR = 5e-2  # float16 logits, fused against unfused, relative to the largest


@dataclass(frozen=True)
class Case:
    shape: str
    cfg: WhisperConfig
    batch: int
    position: int
    bytes: int  # read per step: the decoder's weights once, each row's self cache up to the position, its cross K/V


def step_bytes(cfg: WhisperConfig, batch: int, position: int, elt: int = 2) -> int:
    """Bytes a decode step must read at least: the decoder layers' weights and biases, the tied vocabulary projection,
    each row's self-attention keys and values up to the position and its cross-attention keys and values (a window)."""
    d, ffn = cfg.n_text_state, cfg.n_text_ffn or 4 * cfg.n_text_state
    # qkv, out, cross q, cross out, fc1, fc2 and their biases; 3 norms (not the cross K/V projection: run per window)
    layer = 6 * d * d + 2 * d * ffn + 7 * d + ffn + 6 * d
    kv = 2 * batch * d * (position + 1 + cfg.n_audio_ctx)
    return elt * (cfg.n_text_layer * (layer + kv) + cfg.n_vocab * d + 2 * d)


def plan(shapes=SHAPES, batches=BATCHES, position: int = POSITION) -> list[Case]:
    return [Case(n, c, b, position, step_bytes(c, b, position)) for n, c in shapes.items() for b in batches]


def _models(cfg: WhisperConfig, device, dtype, seed: int = 0):
    """(Triton model, torch-kernel model) sharing random decoder weights drawn on `device` (no encoder layers: the
    step reads the encoder only through its cross keys/values, drawn apart)."""
    import torch

    from speechrt import kernels
    from speechrt.models.whisper import Whisper

    cfg = dataclasses.replace(cfg, n_audio_layer=0)
    with torch.device(device):
        tri = Whisper(cfg, kernels.select("triton", device)).to(dtype).eval()
        eager = Whisper(cfg, kernels.select("torch", device)).eval()
    g = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, p in tri.decoder.named_parameters():
            t = torch.randn(p.shape, generator=g, device=device)
            if p.dim() > 1:
                t = t * (0.02 if "embedding" in name else p.shape[-1] ** -0.5)
            elif "ln" in name and name.endswith("weight"):
                t = 1 + 0.1 * t
            else:
                t = 0.1 * t
            p.copy_(t.to(dtype))
    eager.load_state_dict(tri.state_dict(), assign=True)
    return tri, eager.eval()


def _steps(cfg: WhisperConfig, device, batch: int, position: int, capture: bool, dtype):
    """variant -> a step callable (fixed buffers, logits out) at `position` over a cache and a window's cross K/V."""
    import torch

    from speechrt.backends.cuda_graphs import CapturedStep
    from speechrt.kernels.triton_fused_whisper import OPS as FUSED
    from speechrt.models.whisper_fused import decoder_step_fused

    tri, eager = _models(cfg, device, dtype)
    g = torch.Generator(device=device).manual_seed(1)
    caches = tri.new_cache(batch, cfg.n_text_ctx, dtype, device)
    H, D, S = cfg.n_text_head, cfg.n_text_state // cfg.n_text_head, cfg.n_audio_ctx
    cross = [tuple(torch.randn((batch, H, S, D), generator=g, device=device).to(dtype) for _ in "kv") for _ in caches]
    for k, v in caches:
        k.normal_(generator=g), v.normal_(generator=g)
    tokens = (torch.arange(batch, device=device)[:, None] * 7 + 1) % cfg.n_vocab
    pos = torch.tensor([position], device=device)
    lengths = torch.full((batch,), S, device=device)
    dec, ed = tri.decoder, eager.decoder

    def fused():
        return decoder_step_fused(dec, FUSED, tokens, caches, cross, pos, lengths)

    return {
        "fused": CapturedStep(fused, capture),
        "unfused": CapturedStep(lambda: dec(tokens, caches, 0, cross, position=pos, cross_lengths=lengths), capture),
        "torch-eager": lambda: ed(tokens, caches, 0, cross, position=pos, cross_lengths=lengths),
        "fused-nosplit": CapturedStep(without_splits(fused), capture),
        "fused-pdl": CapturedStep(with_pdl(fused), capture),
        "fused-split2": CapturedStep(short_splits(fused), capture),
    }


def run_cases(device, cases: list[Case], out: Results, timer, bandwidth_gbps: float, capture=True, dtype=None):
    """Time every variant of every case (records in `out`; `dtype` default float16) -> problems: the fused step's
    logits against the unfused step's (same weights, same caches) beyond 16-bit rounding."""
    import torch

    dtype = dtype or torch.float16
    bad = []
    for c in cases:
        steps = _steps(c.cfg, device, c.batch, c.position, capture, dtype)
        workload = f"Whisper decoder step, batch {c.batch}, position {c.position}, a window's cross K/V, random weights"
        bad += time_steps(steps, out, c, workload, timer, bandwidth_gbps, MAX_REL_ERR, str(device), dtype)
        del steps
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return bad


def check_asr_fused(dev, out: Results):
    import torch

    from speechrt.bench.roofline import probe, timer

    bw = probe(dev, torch.float16).bandwidth_gbps
    n0 = len(out.records)
    bad = run_cases(dev, plan(), out, timer(dev), bw, capture=dev.type == "cuda")
    by = {(r.model, r.params["batch"], r.backend): r for r in out.records[n0:]}
    parts = [f"copy {bw:.0f} GB/s"]
    for s, b, _ in sorted({k for k in by if k[2] == "fused"}):
        f, u, e, n, p, s2 = (by[(s, b, v)].value for v in VARIANTS)
        r = by[(s, b, "fused")].params
        parts.append(
            f"{s} b{b}: fused {f:.0f} us ({r['fraction_of_bandwidth']:.0%} of bw, ids {r['argmax_agreement']:.0%} "
            f"as unfused), unfused {u / f:.2f}x, torch eager {e / f:.2f}x, without K splits {n / f:.2f}x, splits of "
            f"2+ K tiles {s2 / f:.2f}x" + pdl_summary(dev, f, p)
        )
    return ("fail" if bad else "pass"), "; ".join(bad + parts)
