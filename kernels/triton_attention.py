"""Flash attention (online softmax, K/V streamed in blocks) for prefill and Whisper's encoder:
causal or not, grouped-query heads, any head dim up to 256 (64 and 128 in the models), any length,
optional per-sequence key lengths, a sliding window (causal: the last `window` keys up to each query's position).
Same signature as kernels.reference.attention; single-query
calls (decode) go to the split-K kernel in triton_decode_attention."""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .triton_matmul import precision, upcast

LOG2E = 1.4426950408889634


@triton.jit
def _attention_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    o_ptr,
    len_ptr,
    sqb,
    sqh,
    sqt,
    skb,
    skh,
    skt,
    svb,
    svh,
    svt,
    sob,
    soh,
    sot,
    H,
    GROUP,
    Tq,
    Tk,
    D,
    qk_scale,
    WINDOW,
    CAUSAL: tl.constexpr,
    SLIDING: tl.constexpr,
    HAS_LENS: tl.constexpr,
    PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    # grid (query blocks, B * H); query head h reads key/value head h // GROUP
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // H).to(tl.int64)
    h = bh % H
    hk = (h // GROUP).to(tl.int64)
    h = h.to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    dm = offs_d < D
    q = tl.load(
        q_ptr + b * sqb + h * sqh + offs_m[:, None] * sqt + offs_d[None, :],
        mask=(offs_m < Tq)[:, None] & dm[None, :],
        other=0.0,
    )
    if UPCAST:
        q = q.to(tl.float32)
    kv_len = Tk
    if HAS_LENS:
        kv_len = tl.minimum(tl.load(len_ptr + b).to(tl.int32), Tk)
    end = kv_len
    lo = 0
    if CAUSAL:  # query i sees keys j <= i + (Tk - Tq): the last query is aligned with the last key
        end = tl.minimum(end, (pid_m + 1) * BLOCK_M + Tk - Tq)
        if SLIDING:  # and keys j > i + (Tk - Tq) - WINDOW: the block's first query's window starts here
            lo = tl.maximum(pid_m * BLOCK_M + Tk - Tq - WINDOW + 1, 0) // BLOCK_N * BLOCK_N
    pk = k_ptr + b * skb + hk * skh + offs_n[None, :] * skt + offs_d[:, None]  # [BLOCK_D, BLOCK_N] = K.T
    pv = v_ptr + b * svb + hk * svh + offs_n[:, None] * svt + offs_d[None, :]  # [BLOCK_N, BLOCK_D]
    m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
    for start in range(lo, end, BLOCK_N):
        n = start + offs_n
        nm = n < kv_len
        kt = tl.load(pk + start * skt, mask=dm[:, None] & nm[None, :], other=0.0)
        if UPCAST:
            kt = kt.to(tl.float32)
        s = tl.dot(q, kt, input_precision=PRECISION) * qk_scale  # log2 domain: scale * log2(e) folded in
        valid = nm[None, :]
        if CAUSAL:
            valid = valid & (n[None, :] <= offs_m[:, None] + (Tk - Tq))
            if SLIDING:  # (a constexpr: the other layers' kernels compile without it, registers as before)
                valid = valid & (n[None, :] > offs_m[:, None] + (Tk - Tq) - WINDOW)
        s = tl.where(valid, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with no visible key yet
        p = tl.exp2(s - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        vt = tl.load(pv + start * svt, mask=nm[:, None] & dm[None, :], other=0.0)
        pt = p.to(v_ptr.dtype.element_ty)  # probabilities in v's dtype for the second MMA
        if UPCAST:
            pt, vt = pt.to(tl.float32), vt.to(tl.float32)
        acc = acc * alpha[:, None] + tl.dot(pt, vt, input_precision=PRECISION)
        m_i = m_new
    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]  # a query that sees no key gets zeros
    tl.store(
        o_ptr + b * sob + h * soh + offs_m[:, None] * sot + offs_d[None, :],
        out.to(o_ptr.dtype.element_ty),
        mask=(offs_m < Tq)[:, None] & dm[None, :],
    )


def config(Tq: int, D: int, dtype: torch.dtype, hip: bool | None = None, causal: bool = False) -> dict:
    """Query/key tiles. NVIDIA, 16-bit, head dim <= 64, not causal (Whisper's encoder): 64 query rows x
    64 keys on 4 warps, three stages of keys/values in flight. Two H100 sweeps (docs/gpu.md) against the
    earlier 128 x 64 on 8 warps, 2 stages, Whisper tiny's encoder attention (6 heads x 1500): 27.9 / 34.2
    vs 48.1 / 45.4 us at batch 1, 58.1 / 58.4 vs 83.2 / 83.2 at 4, 178.7 / 179.4 vs 207.2 / 206.8 at 16
    (within 10 % of the best of 30 tile sets at each in the first; PyTorch's SDPA flash kernel 23.5 /
    55.4 / 151.7). Causal prompts (SmolLM2's prefill) gained nothing consistent across the two sweeps and
    keep 128 x 64 on 8 warps, 2 stages, as does the rest (64 rows for short prompts, float32 and head dims
    over 128, which need twice the registers and shared memory).
    AMD (wave64, `hip`): 128 x 32 on 4 waves (x 16 for head dim 128); wider key tiles spill SGPRs/VGPRs
    on CDNA (see `speechrt kernels report`)."""
    if hip is None:
        hip = torch.version.hip is not None
    bd = max(triton.next_power_of_2(D), 16)
    wide = dtype == torch.float32
    bm = 64 if (Tq <= 64 or wide or bd > 128) else 128
    if hip:  # head dim 128 on CDNA2 spills SGPRs with 32- or 64-key tiles; 16-key tiles do not
        return {"BLOCK_M": bm, "BLOCK_N": 16 if bd >= 128 else 32, "BLOCK_D": bd, "num_warps": 4, "num_stages": 2}
    if not (wide or causal) and bd <= 64:
        return {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_D": bd, "num_warps": 4, "num_stages": 3}
    bn = 32 if (wide and bd >= 128) or bd > 128 else 64
    return {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_D": bd, "num_warps": 4 if bm == 64 else 8, "num_stages": 2}


def _unit_last(t):
    return t if t.stride(-1) == 1 else t.contiguous()


def check(q, k, v, lengths):
    B, H, Tq, D = q.shape
    if k.dim() != 4 or k.shape[0] != B or k.shape[3] != D or v.shape != k.shape:
        raise ValueError(f"attention: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} do not match")
    if H % k.shape[1]:
        raise ValueError(f"attention: {H} query heads are not a multiple of {k.shape[1]} key/value heads")
    if D > 256:
        raise ValueError(f"attention: head dim {D} > 256 is not supported by the Triton kernels")
    if lengths is not None and lengths.shape != (B,):
        raise ValueError(f"attention: lengths must be [B]={B}, got {tuple(lengths.shape)}")


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    scale: float | None = None,
    lengths: torch.Tensor | None = None,
    window: int = 0,
    tiles: dict | None = None,
) -> torch.Tensor:
    """`window` (with causal): a sliding window's keys only; `tiles`: a config() to run instead of the chosen one
    (for tuning; `speechrt kernels`)."""
    check(q, k, v, lengths)
    B, H, Tq, D = q.shape
    Hkv, Tk = k.shape[1], k.shape[2]
    scale = scale if scale is not None else 1.0 / math.sqrt(D)
    if Tq == 1:  # a single query per sequence (decode): causal masks nothing; split along the keys
        from .triton_decode_attention import decode_attention

        return decode_attention(q, k, v, scale=scale, lengths=lengths, window=window if causal else 0)
    q, k, v = _unit_last(q), _unit_last(k), _unit_last(v)
    o = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if lengths is not None:
        lengths = lengths.to(device=q.device, dtype=torch.int32)
    if o.numel():
        cfg = tiles or config(Tq, D, q.dtype, causal=bool(causal))
        grid = (triton.cdiv(Tq, cfg["BLOCK_M"]), B * H)
        _attention_kernel[grid](
            q,
            k,
            v,
            o,
            lengths if lengths is not None else q,
            q.stride(0),
            q.stride(1),
            q.stride(2),
            k.stride(0),
            k.stride(1),
            k.stride(2),
            v.stride(0),
            v.stride(1),
            v.stride(2),
            o.stride(0),
            o.stride(1),
            o.stride(2),
            H,
            H // Hkv,
            Tq,
            Tk,
            D,
            scale * LOG2E,
            int(window) if causal else 0,
            CAUSAL=bool(causal),
            SLIDING=bool(causal and window),
            HAS_LENS=lengths is not None,
            PRECISION=precision(q.dtype),
            UPCAST=upcast(q.dtype),
            **cfg,
        )
    return o


OPS = {"attention": attention}
