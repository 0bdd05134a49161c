"""`bench gpu`'s lm-fused check: the Llama decode step in the fused layer kernels (models/llama_fused.py) against the
unfused Triton step, both replayed from CUDA/HIP graphs, and torch eager, at the SmolLM2-135M and Llama-3.2-1B
shapes with random bf16 weights (speed does not depend on the values): time per step and the fraction of the
measured copy bandwidth that its bytes (weights, the cache it attends over) take. The fused step runs twice: with
the K splits of its ops as dispatched (kernels/triton_fused_split.py's rule: at one row the 1B shape's Q/K/V in 3,
its o and down projections in 4 and 5; SmolLM2's down projection in 3, its other K too short) and with them off
("fused-nosplit": triton_fused_split.SPLITS = 1 while it is captured and run), so that a GPU run tells whether the
rule pays; and with its kernels launched with programmatic dependent launch ("fused-pdl": kernels/triton_pdl.py, on
NVIDIA sm_90+; elsewhere the plain launches), which decides whether that is turned on; and with the rule splitting K
down to 2 tiles a split ("fused-split2"), which a split merged in its own launch may now pay for.
The splits are added up in their own launch (the last split of each output tile merges them: kernels/
triton_fused_parts.py); that merge's memory ordering, which the interpreter cannot test, is checked too
(merge_ordering: each split op of the 1B shape's one-row step against the second launch, on poisoned buffers).

`plan()` and `step_bytes()` are plain arithmetic; `run_cases()` runs anywhere the kernels run (tests run it on
the CPU on a tiny config in the Triton interpreter, uncaptured); only `check_lm_fused()` wants a GPU."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from speechrt.bench.record import Record, Repeats, Results
from speechrt.models.llama import LlamaConfig

SHAPES = {
    "smollm2-135m": LlamaConfig(
        vocab_size=49152, dim=576, n_layers=30, n_heads=9, n_kv_heads=3, hidden_dim=1536, rope_theta=1e5
    ),
    "llama-3.2-1b": LlamaConfig(
        vocab_size=128256, dim=2048, n_layers=16, n_heads=32, n_kv_heads=8, hidden_dim=8192, rope_theta=5e5
    ),
}
BATCHES = (1, 8)
CONTEXT = 512  # positions every row holds when it steps (what attention reads)
# fused / unfused: Triton kernels replayed from a graph
VARIANTS = ("fused", "unfused", "torch-eager", "fused-nosplit", "fused-pdl", "fused-split2")


@dataclass(frozen=True)
class Case:
    shape: str
    cfg: LlamaConfig
    batch: int
    context: int
    bytes: int  # read per step: every weight once, each row's cache up to its length


def step_bytes(cfg: LlamaConfig, batch: int, context: int, elt: int = 2) -> int:
    """Bytes a decode step must read at least: the layers' weights, the output head, each row's keys and values."""
    qkv = cfg.dim * (cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim
    layer = qkv + cfg.n_heads * cfg.head_dim * cfg.dim + 3 * cfg.hidden_dim * cfg.dim + 2 * cfg.dim
    kv = 2 * batch * cfg.n_kv_heads * (context + 1) * cfg.head_dim
    return elt * (cfg.n_layers * (layer + kv) + cfg.vocab_size * cfg.dim + cfg.dim)


def plan(shapes=SHAPES, batches=BATCHES, context: int = CONTEXT) -> list[Case]:
    return [Case(n, c, b, context, step_bytes(c, b, context)) for n, c in shapes.items() for b in batches]


def random_weights(cfg: LlamaConfig, device, dtype, seed: int = 0) -> dict:
    """Weights named as models.llama takes them, drawn on `device` (a 1B model in about a second on a GPU)."""
    import torch

    from speechrt.models.llama import layer_tensors

    g = torch.Generator(device=device).manual_seed(seed)
    D, dim = cfg.head_dim, cfg.dim
    shapes = {
        "wq": (cfg.n_heads * D, dim),
        "wk": (cfg.n_kv_heads * D, dim),
        "wv": (cfg.n_kv_heads * D, dim),
        "wo": (dim, cfg.n_heads * D),
        "w_gate": (cfg.hidden_dim, dim),
        "w_up": (cfg.hidden_dim, dim),
        "w_down": (dim, cfg.hidden_dim),
        "attn_norm": (dim,),
        "ffn_norm": (dim,),
        "bq": (cfg.n_heads * D,),
        "bk": (cfg.n_kv_heads * D,),
        "bv": (cfg.n_kv_heads * D,),
        "q_norm": (D,),
        "k_norm": (D,),
    }

    def draw(shape, norm=False):
        t = torch.randn(shape, generator=g, device=device, dtype=torch.float32)
        return (1 + 0.1 * t if norm else t * shape[-1] ** -0.5).to(dtype)

    w = {"tok_embeddings": draw((cfg.vocab_size, dim)), "norm": draw((dim,), True)}
    for i in range(cfg.n_layers):
        for n in layer_tensors(cfg):
            w[f"layers.{i}.{n}"] = draw(shapes[n], n.endswith("norm"))
    return w


def _steps(cfg: LlamaConfig, device, batch: int, context: int, capture: bool, dtype):
    """variant -> a step callable (fixed buffers, logits out) over a cache where every row holds `context`."""
    import torch

    from speechrt import kernels
    from speechrt.backends.cuda_graphs import CapturedStep
    from speechrt.kernels.triton_fused import OPS as FUSED
    from speechrt.models.llama import Llama
    from speechrt.models.llama_fused import decode_range_fused

    fmt = str(dtype).removeprefix("torch.")
    w = random_weights(cfg, device, dtype)
    tri = Llama(cfg, w, kernels.select("triton", device), device, fmt)
    eager = Llama(cfg, w, kernels.select("torch", device), device, fmt)
    del w
    cache = tri.new_cache(batch, context + 1)
    g = torch.Generator(device=device).manual_seed(1)
    cache.k.normal_(generator=g), cache.v.normal_(generator=g)
    tokens = torch.arange(batch, device=device) * 7 + 1
    pos = torch.full((batch,), context, device=device)
    tk = cache.max_seq

    def fused():
        return decode_range_fused(tri, FUSED, cache, 0, tokens, pos, tk)

    return {
        "fused": CapturedStep(fused, capture),
        "unfused": CapturedStep(lambda: tri.decode_range(cache, 0, tokens, pos, tk), capture),
        "torch-eager": lambda: eager.decode_range(cache, 0, tokens, pos, tk),
        "fused-nosplit": CapturedStep(without_splits(fused), capture),
        "fused-pdl": CapturedStep(with_pdl(fused), capture),
        "fused-split2": CapturedStep(short_splits(fused), capture),
    }


def with_setting(fn, module, name: str, value):
    """`fn` run with `module`.`name` = `value`, each call (restored after it): a graph captured from it holds the
    launches made so."""

    def run():
        prev = getattr(module, name)
        setattr(module, name, value)
        try:
            return fn()
        finally:
            setattr(module, name, prev)

    return run


def without_splits(fn):
    """`fn` run with the fused ops' K splits off (kernels/triton_fused_split.SPLITS = 1)."""
    from speechrt.kernels import triton_fused_split as fs

    return with_setting(fn, fs, "SPLITS", 1)


def short_splits(fn):
    """`fn` run with the split rule's minimum lowered to 2 K tiles a split (triton_fused_split.MIN_SPLIT_TILES, 8 by
    default): the under-filled grids of a launch-bound step (SmolLM2's Q/K/V, gate/up and o projection, Whisper tiny's
    projections) split too, now that a split costs no second launch."""
    from speechrt.kernels import triton_fused_split as fs

    return with_setting(fn, fs, "MIN_SPLIT_TILES", 2)


def with_pdl(fn):
    """`fn` run with its kernels launched with programmatic dependent launch (kernels/triton_pdl.ENABLED; where the
    device has it: NVIDIA sm_90+, else the launches are the plain ones)."""
    from speechrt.kernels import triton_pdl

    return with_setting(fn, triton_pdl, "ENABLED", True)


def run_cases(device, cases: list[Case], out: Results, timer, bandwidth_gbps: float, capture=True, dtype=None):
    """Time every variant of every case (records in `out`; `dtype` default bf16) -> problems: the fused step's
    logits against the unfused step's (same weights, same cache) beyond bf16 rounding."""
    import torch

    dtype = dtype or torch.bfloat16
    bad = []
    for c in cases:
        steps = _steps(c.cfg, device, c.batch, c.context, capture, dtype)
        workload = f"decode step, batch {c.batch}, {c.context} cached positions, random weights"
        bad += time_steps(steps, out, c, workload, timer, bandwidth_gbps, 5e-2, str(device), dtype)
        del steps
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return bad


def time_steps(steps: dict, out: Results, case, workload: str, timer, bandwidth_gbps, max_err, device, dtype):
    """One case's variants (`steps`: name -> step; the 'fused' ones checked against 'unfused') -> problems; each
    variant timed, a record each (the fused step the others' peer) with the case's bytes and their fraction of the
    bandwidth. `case`: its shape (the model's name), batch and bytes. A graph that could not be captured (its
    variant then runs eagerly, and its time is not a graph's) is a problem too."""
    import torch

    from speechrt.backends.cuda_graphs import CapturedStep
    from speechrt.kernels import triton_pdl

    pdl_launched = triton_pdl.supported(torch.device(device))
    failed = CapturedStep.failed
    want = steps["unfused"]().float()
    bad, errs = [], {}
    for v in (v for v in steps if v.startswith("fused")):
        got = steps[v]().float()
        err = ((got - want).abs().amax() / want.abs().amax().clamp_min(1e-30)).item()
        errs[v] = err, (got.argmax(-1) == want.argmax(-1)).float().mean().item()
        if not err <= max_err:
            bad.append(f"{case.shape} batch {case.batch}: {v} logits {err:.3g} (relative) from the unfused step's")
    if CapturedStep.failed > failed:
        eager = [v for v, fn in steps.items() if isinstance(fn, CapturedStep) and fn.graph is None]
        bad.append(f"{case.shape} batch {case.batch}: no graph for {', '.join(eager)} (they ran eagerly; see the log)")
    for v, fn in steps.items():
        err, same = errs.get(v, errs["fused"])  # the fused step's for the others
        ts = timer(fn)
        t = statistics.median(ts)
        out.records.append(
            Record(
                family="gpu",
                model=case.shape,
                engine="torch" if v == "torch-eager" else "speechrt",
                backend=v,
                precision=str(dtype).removeprefix("torch."),
                device=device,
                workload=workload,
                metric="decode_step_us",
                unit="us",
                value=t * 1e6,
                better="lower",
                repeats=Repeats.of(x * 1e6 for x in ts),
                peer="" if v == "fused" else "fused",
                params={
                    "batch": case.batch,
                    "bytes": case.bytes,
                    "fraction_of_bandwidth": case.bytes / t / (bandwidth_gbps * 1e9) if bandwidth_gbps else 0.0,
                    "fused_vs_unfused_rel_err": err,
                    "argmax_agreement": same,
                    "replayed": isinstance(fn, CapturedStep) and fn.graph is not None,
                    **({"pdl_launched": pdl_launched} if "pdl" in v else {}),
                },
            )
        )
    return bad


def pdl_summary(dev, fused_us: float, pdl_us: float) -> str:
    """The fused-pdl step's time against the fused one's, for a check's line."""
    from speechrt.kernels import triton_pdl

    if not triton_pdl.supported(dev):
        return " (no PDL on this device)"
    return f", with PDL {pdl_us / fused_us:.2f}x"


MERGE_TRIALS = 20  # calls of each split op on freshly poisoned buffers


def merge_ordering(device, cfg: LlamaConfig | None = None, trials: int = MERGE_TRIALS, dtype=None) -> list[str]:
    """The fused ops' one-launch merge against their second launch (triton_fused_split.ONE_LAUNCH False) at a one-row
    step of `cfg` (default the Llama-3.2-1B shape: norm_qkv_rope in 3 splits, the o and down projections in 4 and 5 on
    an H100; norm_gate_up forced to 4), each called `trials` times on poisoned buffers (merge_trials) -> problems; the
    merge counters must be back at 0."""
    import torch

    from speechrt.bench.gpu_merge import counters_left, merge_trials, problems
    from speechrt.kernels import triton_fused as fu
    from speechrt.kernels import triton_fused_split as fs

    cfg, dtype = cfg or SHAPES["llama-3.2-1b"], dtype or torch.bfloat16
    g = torch.Generator(device=device).manual_seed(2)

    def draw(*shape, scale=1.0):
        return (torch.randn(shape, generator=g, device=device) * scale).to(dtype)

    D, H, Hkv, dim, ffn = cfg.head_dim, cfg.n_heads, cfg.n_kv_heads, cfg.dim, cfg.hidden_dim
    x, norm, attn, act = draw(1, dim), 1 + draw(dim, scale=0.1), draw(1, H * D), draw(1, ffn)
    wqkv, wgu = draw((H + 2 * Hkv) * D, dim, scale=dim**-0.5), draw(2 * ffn, dim, scale=dim**-0.5)
    wo, wd = draw(dim, H * D, scale=(H * D) ** -0.5), draw(dim, ffn, scale=ffn**-0.5)
    angles = torch.rand(8, D // 2, generator=g, device=device) * 6.3
    pos = torch.tensor([5], device=device)

    def qkv():
        kc, vc = (torch.zeros(1, Hkv, 8, D, device=device, dtype=dtype) for _ in range(2))
        q = fu.norm_qkv_rope(x, norm, 1e-5, wqkv, H, angles.cos(), angles.sin(), pos, kc, vc)
        return torch.cat([q.flatten(), kc.flatten(), vc.flatten()])

    ops = {
        "norm_qkv_rope": qkv,
        "norm_gate_up (4 splits)": with_setting(lambda: fu.norm_gate_up(x, norm, 1e-5, wgu), fs, "SPLITS", 4),
        "o projection": lambda: fu.linear_residual(attn, wo, x),
        "down projection": lambda: fu.linear_residual(act, wd, x),
    }

    def same(got, want):  # finite, and within 16-bit rounding of the second launch's (relative to its largest)
        got, want = got.float(), want.float()
        err = ((got - want).abs().amax() / want.abs().amax().clamp_min(1e-30)).item()
        return torch.isfinite(got).all().item() and err <= 2e-2

    bad = []
    for name, op in ops.items():
        wrong = merge_trials(op, with_setting(op, fs, "ONE_LAUNCH", False), same, device, trials, (1 << 18,) * 8)
        bad += problems(name, wrong, trials, 0)
    return bad + problems("fused ops", 0, trials, counters_left(device))


def check_lm_fused(dev, out: Results):
    import torch

    from speechrt.bench.roofline import probe, timer

    bw = probe(dev, torch.bfloat16).bandwidth_gbps
    n0 = len(out.records)
    order = merge_ordering(dev)
    bad = run_cases(dev, plan(), out, timer(dev), bw) + order
    out.notes.append(
        "lm-fused: the fused ops' K splits merged in their launch "
        + ("differ from the second launch's sums: " + "; ".join(order) if order else "equal the second launch's sums")
        + f" ({MERGE_TRIALS} calls of each split op on poisoned buffers)"
    )
    by = {(r.model, r.params["batch"], r.backend): r for r in out.records[n0:]}
    parts = [f"copy {bw:.0f} GB/s"]
    for s, b, _ in sorted({k for k in by if k[2] == "fused"}):
        f, u, e, n, p, s2 = (by[(s, b, v)].value for v in VARIANTS)
        frac = by[(s, b, "fused")].params["fraction_of_bandwidth"]
        line = f"{s} b{b}: fused {f:.0f} us ({frac:.0%} of bw), unfused {u / f:.2f}x, torch eager {e / f:.2f}x"
        line += f", without K splits {n / f:.2f}x, splits of 2+ K tiles {s2 / f:.2f}x"
        parts.append(line + pdl_summary(dev, f, p))
    return ("fail" if bad else "pass"), "; ".join(bad + parts)
