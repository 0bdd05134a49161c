"""Decode attention: one query per sequence over a preallocated, padded KV cache, for a batch of
sequences of different lengths. The keys are split into chunks processed by separate programs
(flash-decoding), so a few long sequences still fill the GPU; a second kernel merges the chunks'
partial outputs by their log-sum-exp. With grouped-query heads one program serves all the query heads
of a key/value head (as a 16-row matrix product), so each cached key/value is read once per group, not
once per query head. Semantics of kernels.reference.attention with Tq == 1."""

from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl

from .triton_matmul import precision, upcast

LOG2E = 1.4426950408889634
# Splits are chosen so that batch x heads x splits programs reach PROGRAMS_PER_SM per SM / CU of the device: each
# program streams its chunk of the cache with 2-4 warps, so one per SM leaves most of its memory pipes idle and a
# long tail when the programs outnumber the SMs by a fraction; two keep every SM busy in one wave at a modest merge
# cost (the reduce reads D floats per split). `bench gpu --checks attention` times 1, 2 and 4 per SM beside it.
PROGRAMS_PER_SM = 2
DEFAULT_SMS = 128  # without a GPU (the interpreter): an H100-class part's count (132 SMs)


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
    sqb,
    sqh,
    skb,
    skh,
    skt,
    svb,
    svh,
    svt,
    H,
    GROUP,
    Tk,
    D,
    qk_scale,
    SPLIT_LEN,
    NUM_SPLITS,
    WINDOW,
    HAS_LENS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
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
    # partials [B * H, NUM_SPLITS, BLOCK_D] and log2-sum-exp [B * H, NUM_SPLITS]; empty split -> -inf
    row = bh.to(tl.int64) * NUM_SPLITS + split
    tl.store(po_ptr + row * BLOCK_D + offs_d, acc / tl.where(l_i > 0.0, l_i, 1.0))
    l_safe = tl.where(l_i > 0.0, l_i, 1.0)
    tl.store(plse_ptr + row, tl.where(l_i > 0.0, m_i + tl.log2(l_safe), float("-inf")))


@triton.jit
def _decode_attention_grouped_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    len_ptr,
    po_ptr,
    plse_ptr,
    sqb,
    sqh,
    skb,
    skh,
    skt,
    svb,
    svh,
    svt,
    HKV,
    GROUP,
    Tk,
    D,
    qk_scale,
    SPLIT_LEN,
    NUM_SPLITS,
    WINDOW,
    HAS_LENS: tl.constexpr,
    PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
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
    # same partial layout as the per-head kernel: row (b * H + h) * NUM_SPLITS + split
    row = (b * HKV * GROUP + h) * NUM_SPLITS + split
    l_safe = tl.where(l_i > 0.0, l_i, 1.0)
    tl.store(po_ptr + row[:, None] * BLOCK_D + offs_d[None, :], acc / l_safe[:, None], mask=gm[:, None])
    tl.store(plse_ptr + row, tl.where(l_i > 0.0, m_i + tl.log2(l_safe), float("-inf")), mask=gm)


@triton.jit
def _decode_reduce_kernel(
    po_ptr, plse_ptr, o_ptr, H, D, sob, soh, NUM_SPLITS, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr
):
    bh = tl.program_id(0)
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    sm = offs_s < NUM_SPLITS
    base = bh.to(tl.int64) * NUM_SPLITS
    lse = tl.load(plse_ptr + base + offs_s, mask=sm, other=float("-inf"))
    m = tl.max(lse, axis=0)
    w = tl.exp2(lse - tl.where(m == float("-inf"), 0.0, m))  # all splits empty -> weights 0 -> zeros
    po = tl.load(po_ptr + (base + offs_s[:, None]) * BLOCK_D + offs_d[None, :], mask=sm[:, None], other=0.0)
    tot = tl.sum(w, axis=0)
    out = tl.sum(w[:, None] * po, axis=0) / tl.where(tot > 0.0, tot, 1.0)
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


def decode_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float | None = None,
    lengths: torch.Tensor | None = None,
    num_splits: int | None = None,
    window: int = 0,
) -> torch.Tensor:
    """q [B, H, 1, D]; k, v [B, Hkv, Tk, D] (the cache, possibly a strided view); lengths [B] or None
    (all Tk keys valid) -> [B, H, 1, D]. `num_splits` overrides the launcher's choice (tests); `window`: the
    last `window` valid keys only (a sliding-window layer)."""
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
    part_o = torch.empty((B * H, ns, bd), dtype=torch.float32, device=q.device)
    part_lse = torch.empty((B * H, ns), dtype=torch.float32, device=q.device)
    lens = lengths if lengths is not None else q
    strides = (q.stride(0), q.stride(1), k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2))
    if group > 1:
        _decode_attention_grouped_kernel[(B * Hkv, ns)](
            q,
            k,
            v,
            lens,
            part_o,
            part_lse,
            *strides,
            Hkv,
            group,
            Tk,
            D,
            scale * LOG2E,
            cfg["SPLIT_LEN"],
            ns,
            int(window),
            HAS_LENS=lengths is not None,
            PRECISION=precision(q.dtype),
            UPCAST=upcast(q.dtype),
            BLOCK_G=cfg["BLOCK_G"],
            BLOCK_N=cfg["BLOCK_N"],
            BLOCK_D=bd,
            num_warps=cfg["num_warps"],
        )
    else:
        _decode_attention_kernel[(B * H, ns)](
            q,
            k,
            v,
            lens,
            part_o,
            part_lse,
            *strides,
            H,
            1,
            Tk,
            D,
            scale * LOG2E,
            cfg["SPLIT_LEN"],
            ns,
            int(window),
            HAS_LENS=lengths is not None,
            BLOCK_N=cfg["BLOCK_N"],
            BLOCK_D=bd,
            num_warps=cfg["num_warps"],
        )
    _decode_reduce_kernel[(B * H,)](
        part_o,
        part_lse,
        o,
        H,
        D,
        o.stride(0),
        o.stride(1),
        ns,
        BLOCK_S=triton.next_power_of_2(ns),
        BLOCK_D=bd,
        num_warps=2,
    )
    return o


OPS = {}  # reached through triton_attention.attention (Tq == 1)
