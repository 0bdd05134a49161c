"""Fused kernels of the Llama-family decode step: a layer in four launches plus decode attention.

    norm_qkv_rope   RMSNorm -> packed Q/K/V projection (+ Qwen2 bias) (+ Qwen3 per-head q/k RMSNorm)
                    -> rotary at each row's position -> K/V written into the cache; returns Q
    linear_residual output (or down) projection (+ Whisper's bias) + residual add: the new residual stream
    norm_gate_up    RMSNorm -> gate/up projection -> silu(gate) * up

The "next norm" is folded into the kernel that consumes it, not the one that produces the residual: an RMSNorm
needs the sum of squares of the whole row, which spans every column program of the producer (a second pass or
a grid-wide sync), while the consumer streams that whole row through its K loop anyway. The norm is
x * rstd * g with rstd one scalar per row, so the consumer multiplies x by g going in, accumulates sum(x^2)
next to the dot products and scales its accumulator by rstd at the end (rstd commutes with the matmul). The
roundings differ from the unfused path's only there (normalized x is not rounded to the activation dtype
before the weight multiply): within 16-bit tolerance, exact in float32 up to summation order.

Projection tiles: a program holds BLOCK_M rows and, for Q/K/V, BLOCK_HALF column pairs (d, d + D/2) of one
head, so the rotary pairs meet in registers (with per-head norms, the whole head: its sum of squares). The
references are kernels.reference.norm_qkv_rope / linear_residual / norm_gate_up."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .triton_matmul import precision, tile_dot, upcast


@triton.jit
def rnd(x, DT: tl.constexpr):
    """float32 x rounded to DT (to nearest even), kept in float32. bf16 by bit arithmetic: the Triton
    interpreter truncates float32 -> bf16 conversions (a GPU rounds), and the chains of roundings that mirror
    the unfused ops would drift by ulps there; on a GPU the same few integer ops per element."""
    if DT == tl.bfloat16:
        b = x.to(tl.uint32, bitcast=True)
        b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
        return b.to(tl.float32, bitcast=True)
    else:
        return x.to(DT).to(tl.float32)


@triton.jit
def _norm_dot_pair(
    x_ptr, g_ptr, w_ptr, rm, cols, rmask, cmask, second, K, sxm, sxk, swn, swk, eps,
    DT: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """RMSNorm folded into two projections that share their input: (x[rm] * g) @ W[cols].T and @ W[cols +
    second].T in float32 over the whole K, and each row's 1 / rms(x) (rstd) to scale them by. The normed input is
    rounded to DT, as the unfused norm leaves it."""
    rk = tl.arange(0, BLOCK_K)
    px = x_ptr + rm[:, None].to(tl.int64) * sxm + rk[None, :] * sxk  # [BLOCK_M, BLOCK_K]
    pw = w_ptr + cols[None, :] * swn + rk[:, None] * swk  # [BLOCK_K, BLOCK_N] = W.T tile
    acc1 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc2 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    ss = tl.zeros((BLOCK_M,), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        km = (k0 + rk) < K
        x = tl.load(px, mask=rmask[:, None] & km[None, :], other=0.0)
        xf = x.to(tl.float32)
        ss += tl.sum(xf * xf, axis=1)
        a = rnd(xf * tl.load(g_ptr + k0 + rk, mask=km, other=0.0).to(tl.float32)[None, :], DT).to(DT)
        wm = km[:, None] & cmask[None, :]
        w1 = tl.load(pw, mask=wm, other=0.0)
        w2 = tl.load(pw + second * swn, mask=wm, other=0.0)
        if UPCAST:
            a, w1, w2 = a.to(tl.float32), w1.to(tl.float32), w2.to(tl.float32)
        acc1 = tl.dot(a, w1, acc1, input_precision=PRECISION)
        acc2 = tl.dot(a, w2, acc2, input_precision=PRECISION)
        px += BLOCK_K * sxk
        pw += BLOCK_K * swk
    return acc1, acc2, 1.0 / tl.sqrt(ss / K + eps)


@triton.jit
def _norm_qkv_rope_kernel(
    x_ptr,
    g_ptr,
    w_ptr,
    b_ptr,
    qn_ptr,
    kn_ptr,
    cos_ptr,
    sin_ptr,
    pos_ptr,
    q_ptr,
    kc_ptr,
    vc_ptr,
    M,
    K,
    H,
    HKV,
    HALF,
    s0,
    sxm,
    sxk,
    swn,
    swk,
    sct,
    sqm,
    sqh,
    skb,
    skh,
    skt,
    svb,
    svh,
    svt,
    eps,
    HAS_BIAS: tl.constexpr,
    QK_NORM: tl.constexpr,
    PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    # grid (row blocks, H + 2 HKV heads, chunks of D/2): columns d and d + D/2 of head `head` for BLOCK_M rows
    DT: tl.constexpr = q_ptr.dtype.element_ty  # the activations' (and the cache's) dtype
    pid_m = tl.program_id(0)
    head = tl.program_id(1)
    chunk = tl.program_id(2)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    mm = rm < M
    d = chunk * BLOCK_HALF + tl.arange(0, BLOCK_HALF)
    dm = d < HALF
    col = (head * 2 * HALF + d).to(tl.int64)  # rows of W for the first half; + HALF for the second
    acc1, acc2, rstd = _norm_dot_pair(
        x_ptr, g_ptr, w_ptr, rm, col, mm, dm, HALF, K, sxm, sxk, swn, swk, eps,
        DT, PRECISION, UPCAST, BLOCK_M, BLOCK_HALF, BLOCK_K,
    )  # fmt: skip
    # the projection's output, rounded to the activation dtype as the unfused linear leaves it
    y1 = rnd(acc1 * rstd[:, None], DT)
    y2 = rnd(acc2 * rstd[:, None], DT)
    if HAS_BIAS:
        y1 = rnd(y1 + tl.load(b_ptr + col, mask=dm, other=0.0).to(tl.float32)[None, :], DT)
        y2 = rnd(y2 + tl.load(b_ptr + col + HALF, mask=dm, other=0.0).to(tl.float32)[None, :], DT)
    om = mm[:, None] & dm[None, :]
    pos = tl.load(pos_ptr + rm, mask=mm, other=0).to(tl.int64)
    slot = (s0 + rm).to(tl.int64)
    if head < H + HKV:
        if QK_NORM:  # the whole head is in this program (one chunk): its RMSNorm, weight [D] of q or k
            r = 1.0 / tl.sqrt(tl.sum(y1 * y1 + y2 * y2, axis=1) / (2 * HALF) + eps)
            # the weight of q's norm or of k's (both tiny, both read)
            n1 = tl.where(head < H, tl.load(qn_ptr + d, mask=dm, other=0.0), tl.load(kn_ptr + d, mask=dm, other=0.0))
            n2 = tl.load(qn_ptr + HALF + d, mask=dm, other=0.0)
            n2 = tl.where(head < H, n2, tl.load(kn_ptr + HALF + d, mask=dm, other=0.0))
            n1, n2 = n1.to(tl.float32), n2.to(tl.float32)
            y1 = rnd(rnd(y1 * r[:, None], DT) * n1[None, :], DT)
            y2 = rnd(rnd(y2 * r[:, None], DT) * n2[None, :], DT)
        pc = pos[:, None] * sct + d[None, :]
        c = tl.load(cos_ptr + pc, mask=om, other=0.0)
        s = tl.load(sin_ptr + pc, mask=om, other=0.0)
        o1 = rnd(y1 * c - y2 * s, DT).to(DT)
        o2 = rnd(y2 * c + y1 * s, DT).to(DT)
        if head < H:
            po = q_ptr + rm[:, None].to(tl.int64) * sqm + head * sqh + d[None, :]
        else:
            po = kc_ptr + slot[:, None] * skb + (head - H) * skh + pos[:, None] * skt + d[None, :]
        tl.store(po, o1, mask=om)
        tl.store(po + HALF, o2, mask=om)
    else:
        po = vc_ptr + slot[:, None] * svb + (head - H - HKV) * svh + pos[:, None] * svt + d[None, :]
        tl.store(po, y1.to(DT), mask=om)
        tl.store(po + HALF, y2.to(DT), mask=om)


@triton.jit
def _linear_residual_kernel(
    x_ptr,
    w_ptr,
    b_ptr,
    r_ptr,
    y_ptr,
    M,
    N,
    K,
    sxm,
    sxk,
    swn,
    swk,
    srm,
    sym,
    HAS_BIAS: tl.constexpr,
    PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    # y = r + (x @ W.T + bias), the product (with its bias, Whisper's) rounded to the activation dtype first (as
    # the unfused linear leaves it)
    DT: tl.constexpr = y_ptr.dtype.element_ty
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tile_dot(x_ptr, w_ptr, rm, rn, M, N, K, sxm, sxk, swn, swk, PRECISION, UPCAST, BLOCK_M, BLOCK_N, BLOCK_K)
    if HAS_BIAS:
        acc += tl.load(b_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
    om = (rm < M)[:, None] & (rn < N)[None, :]
    r = tl.load(r_ptr + rm[:, None].to(tl.int64) * srm + rn[None, :], mask=om, other=0.0).to(tl.float32)
    y = rnd(rnd(acc, DT) + r, DT)
    tl.store(y_ptr + rm[:, None].to(tl.int64) * sym + rn[None, :], y.to(DT), mask=om)


@triton.jit
def _norm_gate_up_kernel(
    x_ptr,
    g_ptr,
    w_ptr,
    y_ptr,
    M,
    N,
    K,
    sxm,
    sxk,
    swn,
    swk,
    sym,
    eps,
    PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    # W [2N, K]: gate rows 0..N-1, up rows N..2N-1; y [M, N] = silu(gate) * up of rmsnorm(x) * g
    DT: tl.constexpr = y_ptr.dtype.element_ty
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    nm = rn < N
    acc_g, acc_u, rstd = _norm_dot_pair(
        x_ptr, g_ptr, w_ptr, rm, rn.to(tl.int64), rm < M, nm, N, K, sxm, sxk, swn, swk, eps,
        DT, PRECISION, UPCAST, BLOCK_M, BLOCK_N, BLOCK_K,
    )  # fmt: skip
    g = rnd(acc_g * rstd[:, None], DT)
    u = rnd(acc_u * rstd[:, None], DT)
    s = rnd(g / (1.0 + tl.exp(-g)), DT)  # the reference rounds silu(g) before the product
    om = (rm < M)[:, None] & nm[None, :]
    tl.store(y_ptr + rm[:, None].to(tl.int64) * sym + rn[None, :], rnd(s * u, DT).to(DT), mask=om)


def config(M: int, dtype: torch.dtype, half: int | None = None, whole_head: bool = False) -> dict:
    """Tiles of the decode step (M rows, 1..64). Row tile: 16 (the dot's minimum) up to 16 rows, else 32 (a
    64-row tile with its two accumulators spilled on every target in the AOT report). Columns: 32 per program
    (16 column pairs of a head), so that even a small layer spreads over many programs that stream W; a
    whole head when its norm needs it. K tile 64 and two stages: wider ones spilled registers too."""
    cfg = {"BLOCK_M": 16 if M <= 16 else 32, "BLOCK_K": 64 if dtype != torch.float32 or M <= 16 else 32}
    cfg.update(num_warps=4, num_stages=2)
    if half is None:
        cfg["BLOCK_N"] = 32
    else:
        cfg["BLOCK_HALF"] = max(16, triton.next_power_of_2(half)) if whole_head else 16
    return cfg


def as_rows(x: torch.Tensor) -> torch.Tensor:
    return x if x.dim() == 2 else x.reshape(-1, x.shape[-1])


def norm_qkv_rope(
    x, norm_w, eps, wqkv, n_heads, cos, sin, pos, k_cache, v_cache, s0=0, bias=None, q_norm=None, k_norm=None
):
    """See kernels.reference.norm_qkv_rope."""
    x = as_rows(x)
    M, K = x.shape
    Hkv, D = k_cache.shape[1], k_cache.shape[3]
    half = D // 2
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1 or cos.stride(-1) != 1 or sin.stride(-1) != 1:
        raise ValueError("norm_qkv_rope: the caches and the cos/sin tables need a unit last stride")
    if cos.stride(0) != sin.stride(0):
        raise ValueError("norm_qkv_rope: cos and sin need the same row stride")
    q = torch.empty((M, n_heads, D), dtype=x.dtype, device=x.device)
    if not M:
        return q
    qk_norm = q_norm is not None
    cfg = config(M, x.dtype, half, whole_head=qk_norm)
    grid = (triton.cdiv(M, cfg["BLOCK_M"]), n_heads + 2 * Hkv, triton.cdiv(half, cfg["BLOCK_HALF"]))
    _norm_qkv_rope_kernel[grid](
        x,
        norm_w,
        wqkv,
        bias if bias is not None else norm_w,
        q_norm if qk_norm else norm_w,
        k_norm if qk_norm else norm_w,
        cos,
        sin,
        pos,
        q,
        k_cache,
        v_cache,
        M,
        K,
        n_heads,
        Hkv,
        half,
        s0,
        x.stride(0),
        x.stride(1),
        wqkv.stride(0),
        wqkv.stride(1),
        cos.stride(0),
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        eps,
        HAS_BIAS=bias is not None,
        QK_NORM=qk_norm,
        PRECISION=precision(x.dtype),
        UPCAST=upcast(x.dtype),
        **cfg,
    )
    return q


def linear_residual(
    x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """See kernels.reference.linear_residual."""
    x, residual = as_rows(x), as_rows(residual)
    M, K = x.shape
    N = weight.shape[0]
    if residual.stride(-1) != 1:
        residual = residual.contiguous()
    y = torch.empty((M, N), dtype=x.dtype, device=x.device)
    if M:
        cfg = config(M, x.dtype)
        grid = (triton.cdiv(M, cfg["BLOCK_M"]), triton.cdiv(N, cfg["BLOCK_N"]))
        _linear_residual_kernel[grid](
            x,
            weight,
            bias if bias is not None else weight,
            residual,
            y,
            M,
            N,
            K,
            x.stride(0),
            x.stride(1),
            weight.stride(0),
            weight.stride(1),
            residual.stride(0),
            y.stride(0),
            HAS_BIAS=bias is not None,
            PRECISION=precision(x.dtype),
            UPCAST=upcast(x.dtype),
            **cfg,
        )
    return y


def norm_gate_up(x: torch.Tensor, norm_w: torch.Tensor, eps: float, w_gate_up: torch.Tensor) -> torch.Tensor:
    """See kernels.reference.norm_gate_up."""
    x = as_rows(x)
    M, K = x.shape
    N = w_gate_up.shape[0] // 2
    y = torch.empty((M, N), dtype=x.dtype, device=x.device)
    if M:
        cfg = config(M, x.dtype)
        grid = (triton.cdiv(M, cfg["BLOCK_M"]), triton.cdiv(N, cfg["BLOCK_N"]))
        _norm_gate_up_kernel[grid](
            x,
            norm_w,
            w_gate_up,
            y,
            M,
            N,
            K,
            x.stride(0),
            x.stride(1),
            w_gate_up.stride(0),
            w_gate_up.stride(1),
            y.stride(0),
            eps,
            PRECISION=precision(x.dtype),
            UPCAST=upcast(x.dtype),
            **cfg,
        )
    return y


OPS = {"norm_qkv_rope": norm_qkv_rope, "linear_residual": linear_residual, "norm_gate_up": norm_gate_up}
