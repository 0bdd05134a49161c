"""`bench gpu`'s attention check: our attention kernels against torch's SDPA on the same GPU, each case with its ratio.

- decode attention (one query a row over a full cache, Llama-3.2-1B's 32 query / 8 key-value heads, d 64, bf16) at
  batch 1, 8 and 64 over a short (448: Whisper's decoder context) and a long cache (4096): ours with the launcher's
  split along the cache (flash-decoding; kernels/triton_decode_attention.config: split until batch x key-value heads
  x splits reaches PROGRAMS_PER_SM per SM / CU, never below 4 key blocks a split; the split count is in each record;
  the rule at 1 and 4 programs per SM beside it where those split otherwise), the same kernel unsplit, and the
  former two launches (partials, then a merge kernel: `speechrt-two-launch`) beside the default one launch (the
  program that finishes last merges the splits), against SDPA (its grouped-query path, and on keys/values repeated
  per query head: the faster of the two is the peer); which of one and two launches is faster is noted per case;
- the one-launch merge's memory ordering, which only a GPU can test (the interpreter runs programs one at a time):
  each decode case called ORDER_TRIALS times on partial buffers poisoned with NaN beforehand (the caching
  allocator usually hands those blocks back to the launcher's partials), each output against the two-launch one;
- encoder attention (non-causal, 1500 frames, d 64, float16) at Whisper tiny's 6 heads and large-v3-turbo's 20.

Records: time per call, the fraction of the measured copy bandwidth (decode: the cache's bytes) or matrix throughput
(encoder: 4 T^2 d H FLOPs), and `vs_sdpa` (the faster SDPA's time over ours). `run_cases()` runs wherever the
kernels run (the tests: tiny cases on the CPU in the Triton interpreter); only `check_attention()` wants a GPU."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from speechrt.bench.record import Record, Repeats, Results


@dataclass(frozen=True)
class Case:
    kind: str  # "decode" | "encoder"
    batch: int
    heads: int
    kv_heads: int
    length: int  # keys: the cache (decode), the frames (encoder)
    head_dim: int = 64
    dtype: str = "bfloat16"

    @property
    def label(self) -> str:
        return (
            f"{self.kind} attention B={self.batch} {self.heads}/{self.kv_heads} heads x {self.length} d{self.head_dim}"
        )


DECODE = tuple(Case("decode", b, 32, 8, t) for t in (448, 4096) for b in (1, 8, 64))
ORDER_TRIALS = 20
ENCODER = (Case("encoder", 1, 6, 6, 1500, dtype="float16"), Case("encoder", 1, 20, 20, 1500, dtype="float16"))


def _inputs(c: Case, device):
    import torch

    g = torch.Generator(device=device).manual_seed(0)
    dt = getattr(torch, c.dtype)
    tq = 1 if c.kind == "decode" else c.length

    def r(*s):
        return torch.randn(*s, generator=g, device=device, dtype=torch.float32).to(dt)

    return (
        r(c.batch, c.heads, tq, c.head_dim),
        r(c.batch, c.kv_heads, c.length, c.head_dim),
        r(c.batch, c.kv_heads, c.length, c.head_dim),
    )


def per_sm_splits(c: Case, device) -> dict[int, int]:
    """The split counts the rule would choose at 1 and 4 programs per SM / CU (it uses PROGRAMS_PER_SM), where they
    differ from its own -> {programs per SM: splits}."""
    from speechrt.kernels import triton_decode_attention as dec

    def splits(target):
        return dec.config(c.batch * c.kv_heads, c.length, c.head_dim, c.heads // c.kv_heads, target=target)[
            "NUM_SPLITS"
        ]

    sms = dec.target_programs(device) // dec.PROGRAMS_PER_SM
    own = splits(dec.target_programs(device))
    return {m: n for m in (1, 4) if (n := splits(m * sms)) != own}


def variants(c: Case, device):
    """name -> callable for case c: ours (and ours unsplit for decode), and SDPA -> {name: fn}, q, k, v."""
    import torch.nn.functional as F

    from speechrt import kernels
    from speechrt.kernels.triton_decode_attention import decode_attention

    q, k, v = _inputs(c, device)
    fns = {}
    if c.heads != c.kv_heads:  # SDPA's own grouped-query path, and its kernels on keys/values stored per query head
        g = c.heads // c.kv_heads
        ke, ve = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
        fns["sdpa"] = lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        fns["sdpa-expanded"] = lambda: F.scaled_dot_product_attention(q, ke, ve)
    else:
        fns["sdpa"] = lambda: F.scaled_dot_product_attention(q, k, v)
    if c.kind == "decode":
        fns["speechrt"] = lambda: decode_attention(q, k, v)
        fns["speechrt-unsplit"] = lambda: decode_attention(q, k, v, num_splits=1)
        fns["speechrt-two-launch"] = lambda: decode_attention(q, k, v, one_launch=False)
        for m, ns in per_sm_splits(c, device).items():  # the split rule's sweep: other programs per SM
            fns[f"speechrt-{m}-per-sm"] = lambda ns=ns: decode_attention(q, k, v, num_splits=ns)
    else:
        att = kernels.select("triton", device).attention
        fns["speechrt"] = lambda: att(q, k, v, causal=False)
    return fns


def run_cases(device, cases, out: Results, timer, peak) -> list[str]:
    """Every case's variants timed (records in `out`) -> problems: ours beyond its dtype's rounding of SDPA."""
    import torch

    from speechrt.kernels.triton_decode_attention import config, target_programs

    bad = []
    for c in cases:
        fns = variants(c, device)
        want = fns["sdpa"]().float()
        for v in fns:
            if v.startswith("speechrt"):
                err = (fns[v]().float() - want).abs().max().item()
                if not err <= 2e-2:
                    bad.append(f"{c.label} {v}: max error {err:.3g} from SDPA")
        times = {v: timer(fn) for v, fn in fns.items()}
        e = torch.tensor([], dtype=getattr(torch, c.dtype)).element_size()
        if c.kind == "decode":
            work = 2 * c.batch * c.kv_heads * c.length * c.head_dim * e + 2 * c.batch * c.heads * c.head_dim * e
            splits = config(
                c.batch * c.kv_heads, c.length, c.head_dim, c.heads // c.kv_heads, target=target_programs(device)
            )["NUM_SPLITS"]
            sweep = per_sm_splits(c, device)
        else:
            work = 4 * c.batch * c.heads * c.length**2 * c.head_dim
            splits, sweep = 0, {}
        sdpa = min(statistics.median(ts) for v, ts in times.items() if v.startswith("sdpa"))  # the faster SDPA
        for v, ts in times.items():
            t = statistics.median(ts)
            frac = (
                work / t / (peak.bandwidth_gbps * 1e9)
                if c.kind == "decode"
                else work / t / (peak.matmul_tflops * 1e12 or 1e30)
            )
            out.records.append(
                Record(
                    family="gpu",
                    model=f"attention-{c.kind}",
                    engine="torch" if v.startswith("sdpa") else "speechrt",
                    backend=v,
                    precision=c.dtype,
                    device=str(device),
                    workload=c.label,
                    metric="time_us",
                    unit="us",
                    value=t * 1e6,
                    better="lower",
                    repeats=Repeats.of(x * 1e6 for x in ts),
                    peer="" if v.startswith("sdpa") else "sdpa",
                    params={
                        "kind": c.kind,
                        "batch": c.batch,
                        "length": c.length,
                        "num_splits": 1 if v == "speechrt-unsplit" else sweep.get(_per_sm(v), splits),
                        "launches": 2 if v == "speechrt-two-launch" else 1,
                        ("bytes" if c.kind == "decode" else "flops"): work,
                        "fraction_of_roof": frac if peak.bandwidth_gbps else 0.0,
                        "vs_sdpa": sdpa / t,
                    },
                )
            )
        if c.kind == "decode":
            bad += ordering(c, device)
        if getattr(device, "type", "") == "cuda":
            torch.cuda.empty_cache()
    return bad


def ordering(c: Case, device, trials: int | None = None) -> list[str]:
    """The one-launch merge against the two-launch path, `trials` times on partial buffers of the merge's sizes filled
    with NaN before each call (gpu_merge.merge_trials: a merge that reads a split's partials before they are written
    gives NaN or a wrong row) -> problems; the merge counters must be back at 0."""
    import torch

    from speechrt.bench.gpu_merge import counters_left, merge_trials, problems
    from speechrt.kernels import triton_decode_attention as dec

    q, k, v = _inputs(c, device)
    cfg = dec.config(
        c.batch * c.kv_heads, c.length, c.head_dim, c.heads // c.kv_heads, target=dec.target_programs(device)
    )
    rows, ns, bd = c.batch * c.heads, cfg["NUM_SPLITS"], cfg["BLOCK_D"]

    def same(got, want):
        got = got.float()
        return bool(torch.isfinite(got).all()) and (got - want.float()).abs().max().item() <= 2e-2

    trials = ORDER_TRIALS if trials is None else trials
    one, two = (lambda: dec.decode_attention(q, k, v)), (lambda: dec.decode_attention(q, k, v, one_launch=False))
    wrong = merge_trials(one, two, same, device, trials, (rows * ns * bd, rows * ns))
    return problems(c.label, wrong, trials, counters_left(device))


def check_attention(dev, out: Results, cases=DECODE + ENCODER, peak=None, clock=None):
    """`cases`, `peak` (default measured here) and `clock` (default roofline.timer): what the tests change to run the
    check on the CPU."""
    import torch

    from speechrt.bench.roofline import probe, timer
    from speechrt.kernels.triton_decode_attention import PROGRAMS_PER_SM, target_programs

    peak = peak or probe(dev, torch.bfloat16)
    n0 = len(out.records)
    bad = run_cases(dev, cases, out, clock or timer(dev), peak)
    sms = target_programs(dev) // PROGRAMS_PER_SM
    out.notes.append(
        f"attention: decode attention splits along the cache until batch x key-value heads x splits reaches "
        f"{PROGRAMS_PER_SM} programs per SM / CU ({PROGRAMS_PER_SM * sms} on this device's {sms}; chunks of at least 4 "
        f"key blocks); the speechrt-1-per-sm / -4-per-sm rows time the rule at 1 and 4 where those split otherwise"
    )
    ours = [r for r in out.records[n0:] if r.backend == "speechrt"]
    swept = [r for r in out.records[n0:] if _per_sm(r.backend)]
    beaten = [
        f"{r.workload}: {r.backend} {r.value:.0f} us"
        for r in swept
        if any(o.workload == r.workload and r.value < 0.95 * o.value for o in ours)
    ]
    if beaten:
        out.notes.append("attention: the split rule was beaten by 5 % or more at " + "; ".join(beaten))
    two = {r.workload: r.value for r in out.records[n0:] if r.backend == "speechrt-two-launch"}
    faster = [f"{r.workload}: {two[r.workload] / r.value:.2f}x" for r in ours if r.workload in two]
    if faster:
        out.notes.append("attention: one launch against two (two-launch time / one-launch time): " + "; ".join(faster))
    parts = [f"{r.workload}: {r.params['vs_sdpa']:.2f}x SDPA ({r.value:.0f} us)" for r in ours]
    slower = sum(r.params["vs_sdpa"] < 1 for r in ours)
    return ("fail" if bad else "pass"), "; ".join(
        bad + [f"{len(ours) - slower}/{len(ours)} cases at least as fast as SDPA"] + parts
    )


def _per_sm(variant: str) -> int:
    """The programs per SM of a sweep variant's name ("speechrt-4-per-sm" -> 4); 0 for the others."""
    parts = variant.split("-")
    return int(parts[1]) if len(parts) == 4 and parts[2:] == ["per", "sm"] else 0
