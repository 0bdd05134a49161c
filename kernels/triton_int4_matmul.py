"""Weight-only 4-bit linear (W4A16): y = x @ W.T with W in groups of G along K, two 4-bit values per byte,
dequantized in registers inside the K loop and accumulated in float32. Same ops as kernels.reference's
`pack_int4` / `linear_int4`.

Format: w[n, k] = (q[n, k] - 8) * s[k // G, n] + z[k // G, n], q in 0..15. It holds, exactly (one float32
rounding of the exact value, as each format's own formula gives it):
- llama.cpp Q4_0 (G 32): s = d, z = 0; Q4_1: s = d, z = m + 8 d; Q4_K (sub-blocks of 32 in super-blocks of
  256, 6-bit scales and mins): s = d * sc, z = 8 d sc - dmin * m (models/gguf_loader.py unpacks the blocks);
- AWQ / GPTQ groups (G 32 / 64 / 128, asymmetric with integer zero points zp): s = scale, z = (8 - zp) * scale.
Packed [N, K / 2] uint8: byte j of row n holds k = 2j in its low nibble and k = 2j + 1 in its high one, so the
kernel dots the even columns of x with the low nibbles and the odd ones with the high nibbles, with no
interleaving in registers. The (s, z) pairs are [K / G, N, 2], float16 when that holds every value exactly
(Q4_0, Q4_1 with f16 mins), else float32.

One-row decode steps have few column tiles (N / 32), so K is split among programs that write float32 partial
sums, added in a fixed order (deterministic) by a second small kernel that rounds once to x's dtype."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import triton_pdl as pdl
from .reference_quant import unpack_int4 as unpack_int4  # (what `pack_int4` was given, from its bytes)
from .triton_matmul import precision, upcast

SM_PROGRAMS = 264  # programs to aim at for a one-row step: two per SM of an H100 (132 SMs)


@triton.jit
def int4_tile(w_ptr, sz_ptr, rn, nm, k0, G, N, swn, BLOCK_K: tl.constexpr):
    """The W.T tile of K columns k0 .. k0 + BLOCK_K (inside one group) and rows rn (nm: which exist; N: all the
    rows, the (s, z) pairs' row length) dequantized in float32, split by parity: (the even columns, the odd ones),
    each [BLOCK_K / 2, BLOCK_N]: the low and the high nibbles of BLOCK_K / 2 bytes."""
    rp = tl.arange(0, BLOCK_K // 2)
    b = tl.load(w_ptr + rn[None, :].to(tl.int64) * swn + (k0 // 2 + rp)[:, None], mask=nm[None, :], other=0)
    psz = sz_ptr + ((k0 // G).to(tl.int64) * N + rn) * 2  # the group's (s, z) per column
    s = tl.load(psz, mask=nm, other=0.0).to(tl.float32)[None, :]
    z = tl.load(psz + 1, mask=nm, other=0.0).to(tl.float32)[None, :]
    return ((b & 15).to(tl.float32) - 8.0) * s + z, ((b >> 4).to(tl.float32) - 8.0) * s + z


@triton.jit
def _linear_w4_kernel(
    x_ptr,
    w_ptr,
    sz_ptr,
    y_ptr,
    M,
    N,
    K,
    G,
    K_SPLIT,
    sxm,
    sxk,
    swn,
    sym,
    sys_,
    PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PDL: tl.constexpr = False,
):
    pdl.gate(PDL)
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_k = tl.program_id(2)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rp = tl.arange(0, BLOCK_K // 2)  # byte (pair of columns) within the K tile
    mm, nm = rm < M, rn < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k_lo = pid_k * K_SPLIT
    k_hi = tl.minimum(K, k_lo + K_SPLIT)
    for k0 in range(k_lo, k_hi, BLOCK_K):  # BLOCK_K divides G and K: the tile lies in one group, and in K
        kk = k0 + 2 * rp  # the even columns
        w_lo, w_hi = int4_tile(w_ptr, sz_ptr, rn, nm, k0, G, N, swn, BLOCK_K)
        px = x_ptr + rm[:, None].to(tl.int64) * sxm + kk[None, :] * sxk
        xm = mm[:, None]
        x_even = tl.load(px, mask=xm, other=0.0)
        x_odd = tl.load(px + sxk, mask=xm, other=0.0)
        if UPCAST:
            acc = tl.dot(x_even.to(tl.float32), w_lo, acc, input_precision=PRECISION)
            acc = tl.dot(x_odd.to(tl.float32), w_hi, acc, input_precision=PRECISION)
        else:
            acc = tl.dot(x_even, w_lo.to(x_even.dtype), acc, input_precision=PRECISION)
            acc = tl.dot(x_odd, w_hi.to(x_odd.dtype), acc, input_precision=PRECISION)
    py = y_ptr + pid_k.to(tl.int64) * sys_ + rm[:, None].to(tl.int64) * sym + rn[None, :]
    tl.store(py, acc.to(y_ptr.dtype.element_ty), mask=mm[:, None] & nm[None, :])


@triton.jit
def _sum_splits_kernel(p_ptr, y_ptr, SPLITS, MN, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    """y[i] = the sum over s of p[s, i] (float32 partials of a split K), in order, rounded once to y's dtype."""
    pdl.gate(PDL)
    r = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = r < MN
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in range(0, SPLITS):
        acc += tl.load(p_ptr + s * MN + r, mask=m, other=0.0)
    tl.store(y_ptr + r, acc.to(y_ptr.dtype.element_ty), mask=m)


SUM_BLOCK = 256


def config(M: int, N: int, K: int, dtype: torch.dtype, G: int = 128) -> dict:
    """The K tile is the largest power of two <= 128 (64 for float32) dividing the group size G (G is a multiple
    of 32), so each tile needs one (s, z) row. Decode (M <= 16): one 16-row tile, 32-column tiles, K split until
    about SM_PROGRAMS programs run (each keeping at least 4 K tiles); prefill: 64 x 64 tiles, no split."""
    bk = 64 if dtype == torch.float32 else 128
    while G % bk:
        bk //= 2
    if M <= 16:
        c = {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": bk, "num_warps": 4, "num_stages": 4}
        tiles = triton.cdiv(N, c["BLOCK_N"])
        c["SPLIT_K"] = max(1, min(triton.cdiv(SM_PROGRAMS, tiles), K // (4 * bk)))
        return c
    return {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": min(bk, 64), "SPLIT_K": 1, "num_warps": 4, "num_stages": 3}


def pack_int4(q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, dtype: torch.dtype = torch.bfloat16):
    """q [N, K] integers 0..15, scale / zero [N, K / G] (w = (q - 8) * scale + zero) -> (packed [N, K / 2]
    uint8, scales_zeros [K / G, N, 2]), the pair `linear_int4` takes. `dtype` (the activation dtype) does not
    round the scales: they stay float32, or float16 where that is exact."""
    N, K = q.shape
    G = K // scale.shape[1] if scale.shape[1] else 0
    if not G or K % G or G % 32 or scale.shape != zero.shape or scale.shape[0] != N:
        raise ValueError(
            f"pack_int4: q {tuple(q.shape)}, scale {tuple(scale.shape)}, zero {tuple(zero.shape)}; valid: "
            "scale and zero [N, K / G] with a group size G, a multiple of 32, dividing K"
        )
    q8 = q.to(torch.uint8)
    packed = (q8[:, 0::2] & 15) | ((q8[:, 1::2] & 15) << 4)
    sz = torch.stack([scale.t().float(), zero.t().float()], dim=-1)
    half = sz.to(torch.float16)
    if torch.equal(half.float(), sz):
        sz = half
    return packed.contiguous(), sz.contiguous()


def linear_int4(x: torch.Tensor, packed: torch.Tensor, scales_zeros: torch.Tensor) -> torch.Tensor:
    """x [..., K] @ W.T with W from `pack_int4` -> [..., N] in x's dtype."""
    K = x.shape[-1]
    N = packed.shape[0]
    G = K // scales_zeros.shape[0]
    if packed.dtype != torch.uint8 or packed.shape[1] * 2 != K or K % scales_zeros.shape[0] or G % 32:
        raise ValueError(
            f"linear_int4: x [..., {K}] with packed {tuple(packed.shape)} {packed.dtype} and scales "
            f"{tuple(scales_zeros.shape)}; valid: packed [N, K / 2] uint8 from pack_int4, scales [K / G, N, 2]"
        )
    x2 = x.reshape(-1, K)
    M = x2.shape[0]
    if not (M and N):
        return torch.empty((*x.shape[:-1], N), dtype=x.dtype, device=x.device)
    cfg = config(M, N, K, x.dtype, G)
    split = cfg.pop("SPLIT_K")  # each program a multiple of BLOCK_K
    k_split = triton.cdiv(triton.cdiv(K, split), cfg["BLOCK_K"]) * cfg["BLOCK_K"]
    split = triton.cdiv(K, k_split)
    y = torch.empty((split, M, N), dtype=torch.float32 if split > 1 else x.dtype, device=x.device)
    grid = (triton.cdiv(N, cfg["BLOCK_N"]), triton.cdiv(M, cfg["BLOCK_M"]), split)
    _linear_w4_kernel[grid](
        x2,
        packed,
        scales_zeros,
        y,
        M,
        N,
        K,
        G,
        k_split,
        x2.stride(0),
        x2.stride(1),
        packed.stride(0),
        y.stride(1),
        y.stride(0),
        PRECISION=precision(x.dtype),
        UPCAST=upcast(x.dtype),
        **cfg,
        **pdl.args(x.device),
    )
    if split > 1:
        parts, y = y, torch.empty((M, N), dtype=x.dtype, device=x.device)
        _sum_splits_kernel[(triton.cdiv(M * N, SUM_BLOCK),)](
            parts, y, split, M * N, BLOCK=SUM_BLOCK, **pdl.args(x.device)
        )
    return y.view(*x.shape[:-1], N)


OPS = {"pack_int4": pack_int4, "linear_int4": linear_int4}
