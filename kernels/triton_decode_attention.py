"""Decode attention: one query per sequence over a preallocated, padded KV cache, for a batch of
sequences of different lengths, in one launch. The keys are split into chunks processed by separate programs
(flash-decoding), so a few long sequences still fill the GPU; the chunks' partial outputs are merged by their
log-sum-exp inside the same launch, by the program that finishes last. With grouped-query heads one program serves
all the query heads of a key/value head (as a 16-row matrix product), so each cached key/value is read once per
group, not once per query head. Semantics of kernels.reference.attention with Tq == 1.

Launches. With one split (the launcher's choice when batch x heads fill the device, or a short cache) the program
writes the normalized output straight into `o` (OUT_MODE DIRECT). With several, each program writes its partial
output and log2-sum-exp, then draws a ticket from a per-(row, key/value head) int32 counter; the program that draws
the last ticket (NUM_SPLITS - 1) merges every split's partials into `o`, in split order as _decode_reduce_kernel
does (the same helper, so the result does not depend on which program came last), and puts the counter back to 0
for the next launch or graph replay (OUT_MODE MERGE). `decode_attention(..., one_launch=False)` (or ONE_LAUNCH =
False) keeps the former two launches, partials then _decode_reduce_kernel, for `bench gpu --checks attention`; on
ROCm several splits take them by default (ONE_LAUNCH None, merges_in_launch: see the memory model below).

Memory model of the merge (the pattern of CUTLASS's split-K semaphore and Triton's stream-K fix-up):
  1. every thread stores its part of the partials (weak stores);
  2. tl.debug_barrier() (bar.sync / s_barrier): those stores happen before the barrier for every thread of the
     program (CTA scope);
  3. one thread's tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu"): its release half is cumulative, so it
     publishes at GPU scope every store ordered before it by the barrier; its acquire half, in the program that
     draws the last ticket, synchronizes with the releases of all the other programs (each earlier ticket was a
     release on the same counter: a release sequence), so their partials are visible to it;
  4. a second tl.debug_barrier() orders that acquire before every thread's loads of the partials, which also go
     through L2 (cache_modifier ".cg") so no stale L1 line of an earlier launch can be read;
  5. the counter's reset is a plain store: the next launch on the stream starts after this one has finished.
Compiled (AOT, Triton 3.9): sm_90 gives stores; bar.sync; one thread's atom.global.gpu.acq_rel.add; the ticket
through shared memory and bar.sync; bar.sync; ld.global.cg. gfx942 gives stores; s_barrier; buffer_wbl2 sc1,
s_waitcnt; global_atomic_add; s_waitcnt; buffer_inv sc1; s_barrier; loads. On AMD the other waves do not wait for
their own stores (s_waitcnt vmcnt(0)) before the barrier: that the atomic's release still covers them rests on the
LLVM AMDGPU memory model keeping happens-before through a workgroup barrier transitive (its CU-mode sequences for
GFX10+ were corrected for exactly this in 2025) - unverified on an MI-series GPU.
No program waits on another (no spin), so the merge cannot deadlock whatever order the programs run in. The Triton
interpreter runs programs one after another, so every ordering holds there trivially: the interpreter tests check
the arithmetic, the tickets and the counters' reset, NOT the ordering; only a GPU can (`speechrt bench gpu --checks
attention` compares the one-launch output with the two-launch one at every shape it times).

The counters persist across calls and graph replays: one zeroed buffer per (device, thread) (the families of the
server capture and replay their graphs each on their own thread and stream, and two launches running at the same
time must not share counters), never freed (a captured graph holds its address), grown only outside a capture;
CapturedStep's eager warm-up runs the step before capturing it, so the buffer exists by then."""

from __future__ import annotations

import functools
import math
import threading

import torch
import triton
import triton.language as tl

from . import triton_pdl as pdl
from .triton_matmul import precision, upcast

LOG2E = 1.4426950408889634
# Splits are chosen so that batch x heads x splits programs reach PROGRAMS_PER_SM per SM / CU of the device: each
# program streams its chunk of the cache with 2-4 warps, so one per SM leaves most of its memory pipes idle and a
# long tail when the programs outnumber the SMs by a fraction; two keep every SM busy in one wave at a modest merge
# cost (the reduce reads D floats per split). `bench gpu --checks attention` times 1, 2 and 4 per SM beside it.
PROGRAMS_PER_SM = 2
DEFAULT_SMS = 128  # without a GPU (the interpreter): an H100-class part's count (132 SMs)
# The launcher's default for several splits: True merges them in the same launch, False takes two (partials, then
# _decode_reduce_kernel); None: one launch except on ROCm, where the merge's ordering is unverified (the docstring's
# memory model): there several splits take the two launches until an MI-series GPU has run the ordering trials of
# `bench gpu --checks attention`. One split writes its output directly everywhere (no program reads another's).
ONE_LAUNCH: bool | None = None


def merges_in_launch() -> bool:
    """Whether the launcher merges several splits in the launch that computes them (ONE_LAUNCH; None: not on ROCm)."""
    return ONE_LAUNCH if ONE_LAUNCH is not None else torch.version.hip is None


PARTIALS, DIRECT, MERGE = 0, 1, 2  # OUT_MODE: partials for the reduce kernel; one split into o; last ticket merges
# NVIDIA: the register cap (.maxnreg) of every launch that merges in the launch (here, and the fused ops' K splits:
# triton_fused_split). Without one ptxas kept some merged variants at 48-80 registers and spilled: the fused int8
# projection + residual (sm_90) and int4 G 32 Q/K/V (sm_80) under Triton 3.9, and with Triton 3.6 (the lent GPUs'
# image) SmolLM2's grouped decode attention (80 registers, 16 bytes spilled); capped, none spills
MERGE_MAXNREG = 128


def merge_options(device: torch.device) -> dict:
    """The launch options of a kernel that merges in its launch on `device`: the register cap on NVIDIA GPUs."""
    return {"maxnreg": MERGE_MAXNREG} if device.type == "cuda" and torch.version.hip is None else {}


MIN_COUNTERS = 4096  # the counter buffer's first size (int32: 16 KB), grown to B x H when a call needs more


@functools.lru_cache(maxsize=16)
def _multiprocessors(kind: str, index: int | None) -> int:
    if kind == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_properties(index if index is not None else 0).multi_processor_count
    return DEFAULT_SMS


def multiprocessors(device: torch.device | None = None) -> int:
    """The SMs (CUs on ROCm) of `device`; DEFAULT_SMS without a GPU."""
    device = torch.device(device) if device is not None else torch.device("cpu")
    return _multiprocessors(device.type, device.index)


def target_programs(device: torch.device | None = None) -> int:
    """The programs a decode attention launch on `device` aims at: PROGRAMS_PER_SM per SM (CU on ROCm)."""
    return PROGRAMS_PER_SM * multiprocessors(device)


@triton.jit
def _decode_attention_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    len_ptr,
    po_ptr,
    plse_ptr,
    o_ptr,
    cnt_ptr,
    sqb,
    sqh,
    skb,
    skh,
    skt,
    svb,
    svh,
    svt,
    sob,
    soh,
    H,
    GROUP,
    Tk,
    D,
    qk_scale,
    SPLIT_LEN,
    NUM_SPLITS,
    WINDOW,
    HAS_LENS: tl.constexpr,
    OUT_MODE: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PDL: tl.constexpr = False,
):
    pdl.gate(PDL)
    # grid (B * H, NUM_SPLITS): keys [split * SPLIT_LEN, (split + 1) * SPLIT_LEN) of one (b, h)
    bh = tl.program_id(0)
    split = tl.program_id(1)
    b = (bh // H).to(tl.int64)
    h = bh % H
    hk = (h // GROUP).to(tl.int64)
    h = h.to(tl.int64)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    dm = offs_d < D
    kv_len = Tk
    if HAS_LENS:
        kv_len = tl.minimum(tl.load(len_ptr + b).to(tl.int32), Tk)
    lo = split * SPLIT_LEN
    hi = tl.minimum(lo + SPLIT_LEN, kv_len)
    if WINDOW > 0:  # a sliding window: the last WINDOW keys only
        lo = tl.maximum(lo, kv_len - WINDOW)
    q = tl.load(q_ptr + b * sqb + h * sqh + offs_d, mask=dm, other=0.0).to(tl.float32) * qk_scale
    pk = k_ptr + b * skb + hk * skh + offs_n[:, None] * skt + offs_d[None, :]
    pv = v_ptr + b * svb + hk * svh + offs_n[:, None] * svt + offs_d[None, :]
    m_i = float("-inf")
    l_i = 0.0
    acc = tl.zeros((BLOCK_D,), dtype=tl.float32)
    for start in range(lo, hi, BLOCK_N):
        nm = (start + offs_n) < hi
        kt = tl.load(pk + start * skt, mask=nm[:, None] & dm[None, :], other=0.0).to(tl.float32)
        s = tl.where(nm, tl.sum(kt * q[None, :], axis=1), float("-inf"))  # [BLOCK_N], log2 domain
        m_new = tl.maximum(m_i, tl.max(s, axis=0))
        p = tl.exp2(s - m_new)
        alpha = tl.exp2(m_i - m_new)
        vt = tl.load(pv + start * svt, mask=nm[:, None] & dm[None, :], other=0.0).to(tl.float32)
        acc = acc * alpha + tl.sum(p[:, None] * vt, axis=0)
        l_i = l_i * alpha + tl.sum(p, axis=0)
        m_i = m_new
    l_safe = tl.where(l_i > 0.0, l_i, 1.0)  # no valid key: zeros
    po = o_ptr + b * sob + h * soh + offs_d
    if OUT_MODE == 1:  # DIRECT: the only split
        tl.store(po, (acc / l_safe).to(o_ptr.dtype.element_ty), mask=dm)
    else:
        # partials [B * H, NUM_SPLITS, BLOCK_D] and log2-sum-exp [B * H, NUM_SPLITS]; empty split -> -inf
        row = bh.to(tl.int64) * NUM_SPLITS + split
        tl.store(po_ptr + row * BLOCK_D + offs_d, acc / l_safe)
        tl.store(plse_ptr + row, tl.where(l_i > 0.0, m_i + tl.log2(l_safe), float("-inf")))
        if OUT_MODE == 2:  # MERGE: the last of the row's programs merges (module docstring: the memory model)
            tl.debug_barrier()
            ticket = tl.atomic_add(cnt_ptr + bh, 1, sem="acq_rel", scope="gpu")
            if ticket == NUM_SPLITS - 1:
                tl.debug_barrier()
                out = _merge_splits(po_ptr, plse_ptr, bh, NUM_SPLITS, BLOCK_S, BLOCK_D)
                tl.store(po, out.to(o_ptr.dtype.element_ty), mask=dm)
                tl.store(cnt_ptr + bh, 0)


@triton.jit
def _decode_attention_grouped_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    len_ptr,
    po_ptr,
    plse_ptr,
    o_ptr,
    cnt_ptr,
    sqb,
    sqh,
    skb,
    skh,
    skt,
    svb,
    svh,
    svt,
    sob,
    soh,
    HKV,
    GROUP,
    Tk,
    D,
    qk_scale,
    SPLIT_LEN,
    NUM_SPLITS,
    WINDOW,
    HAS_LENS: tl.constexpr,
    OUT_MODE: tl.constexpr,
    BLOCK_S: tl.constexpr,
    PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PDL: tl.constexpr = False,
):
    pdl.gate(PDL)
    # grid (B * HKV, NUM_SPLITS): the GROUP query heads of key/value head hk (rows padded to BLOCK_G >= 16
    # for the matrix units) against keys [split * SPLIT_LEN, (split + 1) * SPLIT_LEN)
    bk = tl.program_id(0)
    split = tl.program_id(1)
    b = (bk // HKV).to(tl.int64)
    hk = (bk % HKV).to(tl.int64)
    offs_g = tl.arange(0, BLOCK_G)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    gm = offs_g < GROUP
    dm = offs_d < D
    h = hk * GROUP + offs_g  # query heads of this group
    q = tl.load(q_ptr + b * sqb + h[:, None] * sqh + offs_d[None, :], mask=gm[:, None] & dm[None, :], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    kv_len = Tk
    if HAS_LENS:
        kv_len = tl.minimum(tl.load(len_ptr + b).to(tl.int32), Tk)
    lo = split * SPLIT_LEN
    hi = tl.minimum(lo + SPLIT_LEN, kv_len)
    if WINDOW > 0:  # a sliding window: the last WINDOW keys only
        lo = tl.maximum(lo, kv_len - WINDOW)
    pk = k_ptr + b * skb + hk * skh + offs_n[None, :] * skt + offs_d[:, None]  # [BLOCK_D, BLOCK_N] = K.T
    pv = v_ptr + b * svb + hk * svh + offs_n[:, None] * svt + offs_d[None, :]
    m_i = tl.full((BLOCK_G,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_G,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_G, BLOCK_D), dtype=tl.float32)
    for start in range(lo, hi, BLOCK_N):  # every block has at least one valid key (start < hi)
        nm = (start + offs_n) < hi
        kt = tl.load(pk + start * skt, mask=dm[:, None] & nm[None, :], other=0.0)
        if UPCAST:
            kt = kt.to(tl.float32)
        s = tl.dot(q, kt, input_precision=PRECISION) * qk_scale
        s = tl.where(nm[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        vt = tl.load(pv + start * svt, mask=nm[:, None] & dm[None, :], other=0.0)
        pt = p.to(v_ptr.dtype.element_ty)
        if UPCAST:
            pt, vt = pt.to(tl.float32), vt.to(tl.float32)
        acc = acc * alpha[:, None] + tl.dot(pt, vt, input_precision=PRECISION)
        m_i = m_new
    l_safe = tl.where(l_i > 0.0, l_i, 1.0)  # no valid key: zeros
    if OUT_MODE == 1:  # DIRECT: the only split
        po = o_ptr + b * sob + h[:, None] * soh + offs_d[None, :]
        tl.store(po, (acc / l_safe[:, None]).to(o_ptr.dtype.element_ty), mask=gm[:, None] & dm[None, :])
    else:
        # same partial layout as the per-head kernel: row (b * H + h) * NUM_SPLITS + split
        row = (b * HKV * GROUP + h) * NUM_SPLITS + split
        tl.store(po_ptr + row[:, None] * BLOCK_D + offs_d[None, :], acc / l_safe[:, None], mask=gm[:, None])
        tl.store(plse_ptr + row, tl.where(l_i > 0.0, m_i + tl.log2(l_safe), float("-inf")), mask=gm)
        if OUT_MODE == 2:  # MERGE: the last of the group's programs merges its heads (module docstring)
            tl.debug_barrier()
            ticket = tl.atomic_add(cnt_ptr + bk, 1, sem="acq_rel", scope="gpu")
            if ticket == NUM_SPLITS - 1:
                tl.debug_barrier()
                for g in range(GROUP):  # head by head: [BLOCK_S, BLOCK_D] partials each, as the reduce kernel
                    hg = hk * GROUP + g
                    out = _merge_splits(po_ptr, plse_ptr, b * HKV * GROUP + hg, NUM_SPLITS, BLOCK_S, BLOCK_D)
                    tl.store(o_ptr + b * sob + hg * soh + offs_d, out.to(o_ptr.dtype.element_ty), mask=dm)
                tl.store(cnt_ptr + bk, 0)


@triton.jit
def _merge_splits(po_ptr, plse_ptr, bh, NUM_SPLITS, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr):
    """Partial row bh's NUM_SPLITS partial outputs weighted by their log2-sum-exp -> [BLOCK_D] float32; the same
    arithmetic in the same order wherever it runs. Loads through L2 (".cg"): another program wrote them."""
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    sm = offs_s < NUM_SPLITS
    base = bh.to(tl.int64) * NUM_SPLITS
    lse = tl.load(plse_ptr + base + offs_s, mask=sm, other=float("-inf"), cache_modifier=".cg")
    m = tl.max(lse, axis=0)
    w = tl.exp2(lse - tl.where(m == float("-inf"), 0.0, m))  # all splits empty -> weights 0 -> zeros
    pp = po_ptr + (base + offs_s[:, None]) * BLOCK_D + offs_d[None, :]
    po = tl.load(pp, mask=sm[:, None], other=0.0, cache_modifier=".cg")
    tot = tl.sum(w, axis=0)
    return tl.sum(w[:, None] * po, axis=0) / tl.where(tot > 0.0, tot, 1.0)


@triton.jit
def _decode_reduce_kernel(
    po_ptr, plse_ptr, o_ptr, H, D, sob, soh, NUM_SPLITS, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
    PDL: tl.constexpr = False,
):  # fmt: skip
    pdl.gate(PDL)
    # the two-launch path's second launch (ONE_LAUNCH False): one program per (b, h)
    bh = tl.program_id(0)
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    offs_d = tl.arange(0, BLOCK_D)
    out = _merge_splits(po_ptr, plse_ptr, bh, NUM_SPLITS, BLOCK_S, BLOCK_D)
    tl.store(o_ptr + b * sob + h * soh + offs_d, out.to(o_ptr.dtype.element_ty), mask=offs_d < D)


def config(
    programs: int, Tk: int, D: int, group: int = 1, num_splits: int | None = None, target: int | None = None
) -> dict:
    """Key block and split count for `programs` (batch x heads, or x key/value heads when grouped)
    programs per split: split until programs * splits reaches `target` (default: target_programs() of no GPU;
    the launcher passes its device's), but never into chunks shorter than 4 key blocks (merging costs a write
    and read of D floats per split)."""
    bd = max(triton.next_power_of_2(D), 16)
    bn = 64 if bd <= 64 else 32
    if num_splits is None:
        target = target or target_programs()
        want = max(1, triton.cdiv(target, max(programs, 1)))
        num_splits = max(1, min(want, triton.cdiv(Tk, 4 * bn)))
    split_len = triton.cdiv(triton.cdiv(max(Tk, 1), num_splits), bn) * bn
    num_splits = triton.cdiv(max(Tk, 1), split_len)
    cfg = {
        "BLOCK_N": bn,
        "BLOCK_D": bd,
        "SPLIT_LEN": split_len,
        "NUM_SPLITS": num_splits,
        "num_warps": 4 if bd >= 128 else 2,
    }
    if group > 1:
        cfg.update(BLOCK_G=max(16, triton.next_power_of_2(group)), num_warps=4)
    return cfg


_COUNTERS: dict = {}  # (device, thread id) -> int32 zeros; every buffer ever made is kept (graphs hold them)
_COUNTERS_LOCK = threading.Lock()


def counters(device: torch.device, n: int) -> torch.Tensor:
    """This thread's merge counters on `device`, at least n of them, all 0 between launches (module docstring). A
    larger buffer is made only outside a CUDA graph capture; inside one, a call that needs more raises."""
    key = (str(device), threading.get_ident())
    bufs = _COUNTERS.get(key)
    if bufs and bufs[-1].numel() >= n:  # the usual case: no lock
        return bufs[-1]
    with _COUNTERS_LOCK:
        bufs = _COUNTERS.setdefault(key, [])
        if not bufs or bufs[-1].numel() < n:
            if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
                raise RuntimeError(
                    f"decode attention needs {n} merge counters inside a CUDA graph capture but this thread has "
                    f"{bufs[-1].numel() if bufs else 0}: run the step once before capturing it"
                )
            bufs.append(torch.zeros(max(n, MIN_COUNTERS), dtype=torch.int32, device=device))
        return bufs[-1]


def decode_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float | None = None,
    lengths: torch.Tensor | None = None,
    num_splits: int | None = None,
    window: int = 0,
    one_launch: bool | None = None,
) -> torch.Tensor:
    """q [B, H, 1, D]; k, v [B, Hkv, Tk, D] (the cache, possibly a strided view); lengths [B] or None
    (all Tk keys valid) -> [B, H, 1, D]. `num_splits` overrides the launcher's choice (tests); `window`: the
    last `window` valid keys only (a sliding-window layer); `one_launch`: merge the splits in the same launch (one
    split: write the output directly), False: partials then the reduce kernel (the former path, kept for `bench gpu`);
    None: one split direct, several merged in the launch where merges_in_launch() (ONE_LAUNCH)."""
    B, H, Tq, D = q.shape
    assert Tq == 1, "decode_attention takes one query per sequence"
    Hkv, Tk = k.shape[1], k.shape[2]
    scale = scale if scale is not None else 1.0 / math.sqrt(D)
    q = q if q.stride(-1) == 1 else q.contiguous()
    k = k if k.stride(-1) == 1 else k.contiguous()
    v = v if v.stride(-1) == 1 else v.contiguous()
    o = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if not o.numel():
        return o
    if lengths is not None:
        lengths = lengths.to(device=q.device, dtype=torch.int32)
    group = H // Hkv
    cfg = config(B * Hkv, Tk, D, group, num_splits, target_programs(q.device))
    ns, bd = cfg["NUM_SPLITS"], cfg["BLOCK_D"]
    if one_launch is None:  # the default: several splits merged where merges_in_launch(), one split direct
        one_launch = merges_in_launch() or (ns == 1 and ONE_LAUNCH is None)
    mode = PARTIALS if not one_launch else DIRECT if ns == 1 else MERGE
    if mode == DIRECT:  # no partials, no counters: the pointers are not read
        part_o = part_lse = cnt = o
    else:
        part_o = torch.empty((B * H, ns, bd), dtype=torch.float32, device=q.device)
        part_lse = torch.empty((B * H, ns), dtype=torch.float32, device=q.device)
        cnt = counters(q.device, B * Hkv) if mode == MERGE else part_lse
    lens = lengths if lengths is not None else q
    strides = (q.stride(0), q.stride(1), k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2))
    args = (q, k, v, lens, part_o, part_lse, o, cnt, *strides, o.stride(0), o.stride(1))
    block_s = triton.next_power_of_2(ns)
    tail = (cfg["SPLIT_LEN"], ns, int(window))
    merging = merge_options(q.device) if mode == MERGE else {}
    if group > 1:
        _decode_attention_grouped_kernel[(B * Hkv, ns)](
            *args,
            Hkv,
            group,
            Tk,
            D,
            scale * LOG2E,
            *tail,
            HAS_LENS=lengths is not None,
            OUT_MODE=mode,
            BLOCK_S=block_s,
            PRECISION=precision(q.dtype),
            UPCAST=upcast(q.dtype),
            BLOCK_G=cfg["BLOCK_G"],
            BLOCK_N=cfg["BLOCK_N"],
            BLOCK_D=bd,
            num_warps=cfg["num_warps"],
            **pdl.args(q.device),
            **merging,
        )
    else:
        _decode_attention_kernel[(B * H, ns)](
            *args,
            H,
            1,
            Tk,
            D,
            scale * LOG2E,
            *tail,
            HAS_LENS=lengths is not None,
            OUT_MODE=mode,
            BLOCK_S=block_s,
            BLOCK_N=cfg["BLOCK_N"],
            BLOCK_D=bd,
            num_warps=cfg["num_warps"],
            **pdl.args(q.device),
            **merging,
        )
    if mode == PARTIALS:
        _decode_reduce_kernel[(B * H,)](
            part_o,
            part_lse,
            o,
            H,
            D,
            o.stride(0),
            o.stride(1),
            ns,
            BLOCK_S=block_s,
            BLOCK_D=bd,
            num_warps=2,
            **pdl.args(q.device),
        )
    return o


OPS = {}  # reached through triton_attention.attention (Tq == 1)
