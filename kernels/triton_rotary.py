"""Rotary embedding (half-split NeoX layout) applied to q and k in one launch: one program per
(batch, position) reads cos/sin once and rotates every query and key head. Same signature as
kernels.reference.rotary; q, k may be strided views (e.g. slices of a fused qkv projection)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rotate(
    x_ptr, o_ptr, b, t, heads, HALF, sxb, sxh, sxt, sob, soh, sot, c, s, BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr
):
    # rotate x[b, 0:heads, t, :] -> o, heads in chunks of BLOCK_H; c, s [BLOCK_HALF] float32
    d = tl.arange(0, BLOCK_HALF)
    for h0 in range(0, heads, BLOCK_H):
        h = h0 + tl.arange(0, BLOCK_H)
        m = (h < heads)[:, None] & (d < HALF)[None, :]
        px = x_ptr + b * sxb + t * sxt + h[:, None] * sxh + d[None, :]
        po = o_ptr + b * sob + t * sot + h[:, None] * soh + d[None, :]
        x1 = tl.load(px, mask=m, other=0.0)
        x2 = tl.load(px + HALF, mask=m, other=0.0).to(tl.float32)
        x1f = x1.to(tl.float32)
        tl.store(po, (x1f * c[None, :] - x2 * s[None, :]).to(x1.dtype), mask=m)
        tl.store(po + HALF, (x2 * c[None, :] + x1f * s[None, :]).to(x1.dtype), mask=m)


@triton.jit
def _rotary_kernel(
    q_ptr,
    k_ptr,
    cos_ptr,
    sin_ptr,
    qo_ptr,
    ko_ptr,
    T,
    H,
    HKV,
    HALF,
    sqb,
    sqh,
    sqt,
    skb,
    skh,
    skt,
    scb,
    sct,
    ssb,
    sst,
    sqob,
    sqoh,
    sqot,
    skob,
    skoh,
    skot,
    BLOCK_H: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
):
    pid = tl.program_id(0)
    b = (pid // T).to(tl.int64)
    t = (pid % T).to(tl.int64)
    d = tl.arange(0, BLOCK_HALF)
    dm = d < HALF
    c = tl.load(cos_ptr + b * scb + t * sct + d, mask=dm, other=0.0).to(tl.float32)  # scb = 0 when shared
    s = tl.load(sin_ptr + b * ssb + t * sst + d, mask=dm, other=0.0).to(tl.float32)
    _rotate(q_ptr, qo_ptr, b, t, H, HALF, sqb, sqh, sqt, sqob, sqoh, sqot, c, s, BLOCK_H, BLOCK_HALF)
    _rotate(k_ptr, ko_ptr, b, t, HKV, HALF, skb, skh, skt, skob, skoh, skot, c, s, BLOCK_H, BLOCK_HALF)


def config(heads: int, half: int) -> dict:
    bh = triton.next_power_of_2(half)
    block_h = max(1, min(triton.next_power_of_2(heads), 4096 // bh))
    return {"BLOCK_H": block_h, "BLOCK_HALF": bh, "num_warps": 4 if block_h * bh >= 1024 else 2}


def _unit_last(t):
    return t if t.stride(-1) == 1 else t.contiguous()


def rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    B, H, T, D = q.shape
    Hkv = k.shape[1]
    half = D // 2
    q, k, cos, sin = _unit_last(q), _unit_last(k), _unit_last(cos), _unit_last(sin)
    cos = cos.expand(B, 1, T, half)
    sin = sin.expand(B, 1, T, half)
    qo, ko = torch.empty(q.shape, dtype=q.dtype, device=q.device), torch.empty(k.shape, dtype=k.dtype, device=k.device)
    if B * T:
        _rotary_kernel[(B * T,)](
            q,
            k,
            cos,
            sin,
            qo,
            ko,
            T,
            H,
            Hkv,
            half,
            q.stride(0),
            q.stride(1),
            q.stride(2),
            k.stride(0),
            k.stride(1),
            k.stride(2),
            cos.stride(0),
            cos.stride(2),
            sin.stride(0),
            sin.stride(2),
            qo.stride(0),
            qo.stride(1),
            qo.stride(2),
            ko.stride(0),
            ko.stride(1),
            ko.stride(2),
            **config(max(H, Hkv), half),
        )
    return qo, ko


OPS = {"rotary": rotary}
