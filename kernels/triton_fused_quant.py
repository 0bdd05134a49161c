"""Fused kernels of the Llama-family decode step on quantized weights: kernels/triton_fused.py's three ops with W read
as int4 (W4A16: kernels/triton_int4_matmul.py's packed nibbles and (s, z) pairs per group of G along K: the GGUF's
Q4_0 / Q4_1 / Q4_K, AWQ / GPTQ groups), FP8 (E4M3 with a float32 scale per output channel, read as bytes and
widened by integer ops as kernels/triton_fp8_matmul.py's W8A16 path does) or int8 (per-channel scale; what an
int4 model keeps for the tensors its file holds in other blocks).

    norm_qkv_rope   RMSNorm -> packed Q/K/V projection (+ Qwen2 bias) (+ Qwen3 head norms) -> rotary -> cache
    linear_residual output / down projection + residual
    norm_gate_up    RMSNorm -> gate/up projection -> silu(gate) * up

The weight is dequantized in registers inside the K loop and meets the activations on the 16-bit tensor / matrix
cores (float32 activations: float32 products), accumulating in float32; per-channel scales multiply the accumulator
once at the end (they commute with the sum over K, as the norm's rstd does). The norm fold, the epilogues (bias,
head norms, rotary, cache writes, residual, SiLU) and the host-side checks are triton_fused.py's own. No fp8 dot:
a decode step of a few rows is bound by reading W, which the W8A16 path reads as bytes on every target (sm_80 and
gfx90a have no fp8 types), so every kernel here compiles for sm_80, sm_90, gfx90a and gfx942 alike.

The ops take a float weight (then they are triton_fused.py's) or a pair (weight, scale): (packed uint8 [N, K / 2],
scales_zeros [K / G, N, 2]) for int4, (float8_e4m3fn [N, K], float32 [N]) for fp8, (int8 [N, K], [N]) for int8.
Grids and K splits are triton_fused.py's (row blocks x column tiles x splits): every op splits K as its float twin
does (kernels/triton_fused_split.py: partial sums, and the norm-folded ops' sums of squares, added up and run through
the epilogue by each tile's last split, or on ROCm by a second launch).
References: kernels.reference_quant (dequantize, then kernels.reference's fused ops)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import triton_fused as fu
from . import triton_pdl as pdl
from .triton_fp8_matmul import e4m3_to_float
from .triton_int4_matmul import int4_tile

INT4, FP8, INT8 = 1, 2, 3  # the weight formats (the FMT constexpr)
INT4_C, FP8_C = tl.constexpr(INT4), tl.constexpr(FP8)  # as the kernels read them
FORMATS = {torch.uint8: INT4, torch.float8_e4m3fn: FP8, torch.int8: INT8}


@triton.jit
def wdot(a, w, acc, DT: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """acc + a @ w, a the activations and w a dequantized weight tile (float32 values exact in DT, but int4's):
    in DT on the tensor / matrix cores, or float32 products (UPCAST)."""
    if UPCAST:
        return tl.dot(a.to(tl.float32), w, acc, input_precision=PRECISION)
    else:
        return tl.dot(a.to(DT), w.to(DT), acc, input_precision=PRECISION)


@triton.jit
def norm_in(x, g_ptr, k, K, NORM: tl.constexpr, DT: tl.constexpr):
    """A tile of x (its columns k, those past K read as zeros) going in: with NORM, times the norm weight g[k] and
    rounded to DT (as the unfused norm leaves it), and its rows' sums of squares."""
    xf = x.to(tl.float32)
    if NORM:
        g = tl.load(g_ptr + k, mask=k < K, other=0.0).to(tl.float32)
        return fu.rnd(xf * g[None, :], DT), tl.sum(xf * xf, axis=1)
    else:
        return xf, 0.0


@triton.jit
def qdot_pair(
    x_ptr, g_ptr, w_ptr, sz_ptr, rm, cols, rmask, cmask, second, k_lo, k_hi, K, G, NW, sxm, sxk, swn, swk,
    NORM: tl.constexpr, PAIR: tl.constexpr, FMT: tl.constexpr, DT: tl.constexpr, PRECISION: tl.constexpr,
    UPCAST: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """(x[rm] * g) @ W[cols].T and, with PAIR, @ W[cols + second].T over the columns k_lo .. k_hi of x (all K, or a
    split's share), W of NW rows quantized as FMT, in float32, per-channel scales applied; and each row's sum of
    squares there (0 without NORM: no norm folded in)."""
    acc1 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc2 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    ss = tl.zeros((BLOCK_M,), dtype=tl.float32)
    if FMT == INT4_C:  # BLOCK_K divides G and K: no K mask; the even columns meet the low nibbles, the odd the high
        ke = 2 * tl.arange(0, BLOCK_K // 2)
        px = x_ptr + rm[:, None].to(tl.int64) * sxm + ke[None, :] * sxk
        for k0 in range(k_lo, k_hi, BLOCK_K):
            xe, s_e = norm_in(tl.load(px + k0 * sxk, mask=rmask[:, None], other=0.0), g_ptr, k0 + ke, K, NORM, DT)
            xo, s_o = norm_in(
                tl.load(px + (k0 + 1) * sxk, mask=rmask[:, None], other=0.0), g_ptr, k0 + ke + 1, K, NORM, DT
            )
            ss += s_e + s_o
            w_lo, w_hi = int4_tile(w_ptr, sz_ptr, cols, cmask, k0, G, NW, swn, BLOCK_K)
            acc1 = wdot(xo, w_hi, wdot(xe, w_lo, acc1, DT, PRECISION, UPCAST), DT, PRECISION, UPCAST)
            if PAIR:
                w_lo, w_hi = int4_tile(w_ptr, sz_ptr, cols + second, cmask, k0, G, NW, swn, BLOCK_K)
                acc2 = wdot(xo, w_hi, wdot(xe, w_lo, acc2, DT, PRECISION, UPCAST), DT, PRECISION, UPCAST)
    else:  # per-channel formats: a [BLOCK_K, BLOCK_N] tile of bytes widened in registers, the scales at the end
        rk = tl.arange(0, BLOCK_K)
        px = x_ptr + rm[:, None].to(tl.int64) * sxm + rk[None, :] * sxk
        pw = w_ptr + cols[None, :].to(tl.int64) * swn + rk[:, None] * swk  # [BLOCK_K, BLOCK_N] = W.T tile
        for k0 in range(k_lo, k_hi, BLOCK_K):
            km = (k0 + rk) < k_hi
            x = tl.load(px + k0 * sxk, mask=rmask[:, None] & km[None, :], other=0.0)
            a, s_a = norm_in(x, g_ptr, k0 + rk, K, NORM, DT)
            ss += s_a
            wm = km[:, None] & cmask[None, :]
            acc1 = wdot(a, widen(tl.load(pw + k0 * swk, mask=wm, other=0), FMT), acc1, DT, PRECISION, UPCAST)
            if PAIR:
                w2 = widen(tl.load(pw + second * swn + k0 * swk, mask=wm, other=0), FMT)
                acc2 = wdot(a, w2, acc2, DT, PRECISION, UPCAST)
        acc1 = acc1 * tl.load(sz_ptr + cols, mask=cmask, other=0.0).to(tl.float32)[None, :]
        if PAIR:
            acc2 = acc2 * tl.load(sz_ptr + cols + second, mask=cmask, other=0.0).to(tl.float32)[None, :]
    return acc1, acc2, ss


@triton.jit
def widen(b, FMT: tl.constexpr):
    """A tile of per-channel quantized weights -> float32, exactly: E4M3 bytes (read as uint8) or int8."""
    if FMT == FP8_C:
        return e4m3_to_float(b)
    else:
        return b.to(tl.float32)


@triton.jit
def _norm_qkv_rope_q_kernel(
    x_ptr, g_ptr, w_ptr, sz_ptr, b_ptr, qn_ptr, kn_ptr, cos_ptr, sin_ptr, pos_ptr, q_ptr, kc_ptr, vc_ptr, p_ptr, ss_ptr,
    cnt_ptr, M, K, K_SPLIT, G, H, HKV, HALF, s0, sxm, sxk, swn, swk, sct, sqm, sqh, skb, skh, skt, svb, svh, svt, eps,
    HAS_BIAS: tl.constexpr, QK_NORM: tl.constexpr, SPLIT: tl.constexpr, FMT: tl.constexpr, PRECISION: tl.constexpr,
    UPCAST: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_K: tl.constexpr,
    MERGE: tl.constexpr = False, PDL: tl.constexpr = False,
):  # fmt: skip
    pdl.gate(PDL)
    # as triton_fused._norm_qkv_rope_kernel (its grid, its SPLIT and MERGE), the weight quantized as FMT
    rm, mm, head, d, dm, col, split, tile = fu.head_tile(M, HALF, BLOCK_M, BLOCK_HALF, SPLIT)
    k_lo, k_hi = fu.k_range(split, K_SPLIT, K, SPLIT)
    NW = (H + 2 * HKV) * 2 * HALF
    acc1, acc2, ss = qdot_pair(
        x_ptr, g_ptr, w_ptr, sz_ptr, rm, col, mm, dm, HALF, k_lo, k_hi, K, G, NW, sxm, sxk,
        swn, swk, True, True, FMT, q_ptr.dtype.element_ty, PRECISION, UPCAST, BLOCK_M, BLOCK_HALF, BLOCK_K,
    )  # fmt: skip
    fu.qkv_out(
        acc1, acc2, ss, rm, mm, head, d, dm, col, split, tile, p_ptr, ss_ptr, cnt_ptr, b_ptr, qn_ptr, kn_ptr, cos_ptr,
        sin_ptr, pos_ptr, q_ptr, kc_ptr, vc_ptr, M, K, H, HKV, HALF, s0, sct, sqm, sqh, skb, skh, skt, svb, svh, svt,
        eps, HAS_BIAS, QK_NORM, SPLIT, MERGE,
    )  # fmt: skip


@triton.jit
def _linear_residual_q_kernel(
    x_ptr, w_ptr, sz_ptr, b_ptr, r_ptr, y_ptr, p_ptr, cnt_ptr, M, N, K, G, K_SPLIT, sxm, sxk, swn, swk, srm, sym,
    HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr, FMT: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    MERGE: tl.constexpr = False, PDL: tl.constexpr = False,
):  # fmt: skip
    pdl.gate(PDL)
    # grid (row blocks, column blocks, K splits); SPLIT: the float32 partial sums go to p [splits, M, N] (MERGE: the
    # tile's last split adds them up)
    rm, rn = fu.row_col_tile(BLOCK_M, BLOCK_N)
    k_lo = tl.program_id(2) * K_SPLIT
    acc, _, _ = qdot_pair(
        x_ptr, x_ptr, w_ptr, sz_ptr, rm, rn, rm < M, rn < N, 0, k_lo, tl.minimum(K, k_lo + K_SPLIT), K, G, N, sxm,
        sxk, swn, swk, False, False, FMT, y_ptr.dtype.element_ty, PRECISION, UPCAST, BLOCK_M, BLOCK_N, BLOCK_K,
    )  # fmt: skip
    fu.residual_out(acc, rm, rn, M, N, b_ptr, r_ptr, y_ptr, p_ptr, cnt_ptr, srm, sym, HAS_BIAS, SPLIT, MERGE)


@triton.jit
def _norm_gate_up_q_kernel(
    x_ptr, g_ptr, w_ptr, sz_ptr, y_ptr, p_ptr, ss_ptr, cnt_ptr, M, N, K, K_SPLIT, G, sxm, sxk, swn, swk, sym, eps,
    SPLIT: tl.constexpr, FMT: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    MERGE: tl.constexpr = False, PDL: tl.constexpr = False,
):  # fmt: skip
    pdl.gate(PDL)
    # as triton_fused._norm_gate_up_kernel (W [2N, K]: gate rows, then up rows; its grid, SPLIT, MERGE), W as FMT
    rm, rn = fu.row_col_tile(BLOCK_M, BLOCK_N)
    split = tl.program_id(2)
    k_lo, k_hi = fu.k_range(split, K_SPLIT, K, SPLIT)
    acc_g, acc_u, ss = qdot_pair(
        x_ptr, g_ptr, w_ptr, sz_ptr, rm, rn, rm < M, rn < N, N, k_lo, k_hi, K, G, 2 * N,
        sxm, sxk, swn, swk, True, True, FMT, y_ptr.dtype.element_ty, PRECISION, UPCAST, BLOCK_M, BLOCK_N, BLOCK_K,
    )  # fmt: skip
    fu.gate_up_out(acc_g, acc_u, ss, rm, rn, M, N, K, p_ptr, ss_ptr, cnt_ptr, y_ptr, sym, eps, SPLIT, MERGE)


def block_k(fmt: int, G: int, bk: int) -> int:
    """The K tile: triton_fused.py's `bk`, halved for int4 until it divides the group size G (a tile in one
    group: one (s, z) row; G is a multiple of 32, so the two half-tile dots keep K >= 16)."""
    while fmt == INT4 and G % bk:
        bk //= 2
    return bk


def quant_args(w, K: int, op: str) -> tuple[dict, callable]:
    """(weight, scale) -> the kernels' weight arguments and their tile config, or a ValueError / TypeError saying
    what is valid."""
    q, scale = w
    fmt = FORMATS.get(q.dtype)
    if fmt is None:
        raise TypeError(
            f"{op}: quantized weights are uint8 (int4 packed), float8_e4m3fn or int8, not {q.dtype}; float weights "
            "are passed as a tensor"
        )
    G = 0
    if fmt == INT4:
        G = K // scale.shape[0] if scale.dim() == 3 and scale.shape[0] else 0
        if q.shape[1] * 2 != K or q.stride(1) != 1 or not G or K % G or G % 32 or scale.shape[1:] != (q.shape[0], 2):
            raise ValueError(
                f"{op}: x [..., {K}] with int4 weight {tuple(q.shape)} and scales {tuple(scale.shape)}; valid: "
                "packed [N, K / 2] uint8 rows with a unit stride and scales [K / G, N, 2] from pack_int4, G a "
                "multiple of 32"
            )
    elif q.shape[1] != K or scale.shape != (q.shape[0],):
        raise ValueError(
            f"{op}: x [..., {K}] with weight {tuple(q.shape)} and scale {tuple(scale.shape)}; valid: [N, K], [N]"
        )
    args = {
        "w_ptr": q.view(torch.uint8) if fmt == FP8 else q,
        "sz_ptr": scale,
        "G": G,
        "swn": q.stride(0),
        "swk": q.stride(1),
        "FMT": fmt,
    }
    return args, fused_config(fmt, G)


def fused_config(fmt: int, G: int):
    """The tile config of format `fmt` (group size G): triton_fused.config's (same arguments), its K tile cut to
    divide G for int4. fp8 / int8 widen [BLOCK_K, columns] byte tiles to float32 in registers: K tiles of 32 for
    32-row tiles and whole heads of 128, and 8 warps, which halve each thread's share of the widened tiles; a one-row
    step keeps its 64-column K tiles (the bytes in flight of the ~2 programs per SM it runs). None spills on sm_80,
    sm_90, gfx90a or gfx942 in the AOT report (compiled with unit K strides, as launched: int4's 32-row tiles in
    two stages; in one stage its projection + residual spilled on sm_90)."""

    def cfg(M, dtype, half=None, whole_head=False):
        c = fu.config(M, dtype, half, whole_head)
        c["BLOCK_K"] = block_k(fmt, G, c["BLOCK_K"])
        if fmt != INT4:
            c["num_warps"] = 8
            if c["BLOCK_M"] > 16 or c.get("BLOCK_HALF", 0) > 32:
                c["BLOCK_K"] = min(c["BLOCK_K"], 32)
        return c

    return cfg


def norm_qkv_rope(
    x, norm_w, eps, wqkv, n_heads, cos, sin, pos, k_cache, v_cache, s0=0, bias=None, q_norm=None, k_norm=None
):
    """See kernels.reference_quant.norm_qkv_rope."""
    if isinstance(wqkv, torch.Tensor):
        return fu.norm_qkv_rope(
            x, norm_w, eps, wqkv, n_heads, cos, sin, pos, k_cache, v_cache, s0, bias, q_norm, k_norm
        )
    w, cfg = quant_args(wqkv, x.shape[-1], "norm_qkv_rope")
    return fu.launch_qkv(
        _norm_qkv_rope_q_kernel, w, x, norm_w, eps, n_heads, cos, sin, pos, k_cache, v_cache, s0, bias, q_norm, k_norm,
        cfg,
    )  # fmt: skip


def linear_residual(x: torch.Tensor, weight, residual: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """See kernels.reference_quant.linear_residual. A one-row step of a few column tiles splits K among programs
    (triton_fused.launch_rows)."""
    if isinstance(weight, torch.Tensor):
        return fu.linear_residual(x, weight, residual, bias)
    w, cfg = quant_args(weight, x.shape[-1], "linear_residual")
    kw = fu.residual_args(residual, bias, residual)
    return fu.launch_rows(_linear_residual_q_kernel, w, x, weight[0].shape[0], cfg, **kw)


def norm_gate_up(x: torch.Tensor, norm_w: torch.Tensor, eps: float, w_gate_up) -> torch.Tensor:
    """See kernels.reference_quant.norm_gate_up."""
    if isinstance(w_gate_up, torch.Tensor):
        return fu.norm_gate_up(x, norm_w, eps, w_gate_up)
    w, cfg = quant_args(w_gate_up, x.shape[-1], "norm_gate_up")
    return fu.launch_gate_up(_norm_gate_up_q_kernel, w, x, norm_w, eps, w_gate_up[0].shape[0] // 2, cfg)


# the float ops' table with the quantized projections in place (token_inputs and norm_logits take float weights
# only: a quantized output projection is the step's unfused head)
OPS = {**fu.OPS, "norm_qkv_rope": norm_qkv_rope, "linear_residual": linear_residual, "norm_gate_up": norm_gate_up}
