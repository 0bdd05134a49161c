"""Fused kernels of the Whisper decoder step: LayerNorm folded into the projection that reads it.

    norm_qkv_cache  LayerNorm -> packed Q/K/V projection + bias -> K/V written into the cache at each row's
                    position; returns Q
    norm_linear     LayerNorm -> projection + bias (the cross-attention query, the logits), or -> fc1 + bias ->
                    GELU (the MLP's first half)
    step_inputs     the token + position embeddings (the residual stream's start) and the int32 key lengths the
                    decode attentions read (position + 1; the encoder lengths), in one launch instead of some seven

With kernels.triton_fused.linear_residual (its bias) closing each branch, a decoder layer is six launches plus the
two decode attentions (self, cross), against some twenty unfused.

The fold. A LayerNorm needs the row's mean and variance before any normalized element exists, so unlike the RMSNorm
fold (kernels/triton_fused.py, rstd applied after the matmul) it cannot be applied afterwards exactly: the algebraic
form y = rstd (W (x g)) - rstd mean (W g) + W b subtracts two terms each |mean| / std times the size of the result,
so float32 loses that factor of relative precision (rows whose mean is far from zero, as Whisper's residual stream
has, miss 1e-5: at a mean 30 times the spread, d 384, 2.3e-5 of the largest output against 2.1e-6 for the two-pass
norm, measured against float64), and 16-bit inputs would not round the normalized x where the unfused norm does.
So each program reads its rows of x once before its K loop for their mean and variance (each tile's centered in
registers, merged by Chan's formula: no E[x^2] - mean^2 cancellation), then normalizes x tile by tile in float32
and rounds it to the activation dtype as the unfused norm leaves it, feeding the dot. The extra reads are the rows
of x (M x dim elements, a few KB, cached) against the program's W tile (BLOCK_N x dim): the same numbers as the
unfused path up to summation order. The references are kernels.reference.norm_qkv_cache / norm_linear /
step_inputs."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import triton_pdl as pdl
from .triton_fused import as_rows, config, rnd
from .triton_fused import linear_residual as linear_residual
from .triton_matmul import precision, upcast
from .triton_whisper_pick import whisper_pick

PLAIN, GELU, QKV_CACHE = 0, 1, 2  # the epilogues of _norm_linear_kernel


@triton.jit
def _ln_stats(x_ptr, rm, rmask, K, sxm, sxk, eps, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    """Each row's mean and 1 / sqrt(var + eps) over its K elements, in float32, in one read of the rows: each tile's
    own mean and centered sum of squares (two-pass in registers), merged into the running ones by Chan's parallel
    formula (stable: no E[x^2] - mean^2 cancellation)."""
    rk = tl.arange(0, BLOCK_K)
    px = x_ptr + rm[:, None].to(tl.int64) * sxm + rk[None, :] * sxk
    mean = tl.zeros((BLOCK_M,), dtype=tl.float32)
    m2 = tl.zeros((BLOCK_M,), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        km = (k0 + rk) < K
        x = tl.load(px + k0 * sxk, mask=rmask[:, None] & km[None, :], other=0.0).to(tl.float32)
        nb = tl.minimum(K - k0, BLOCK_K).to(tl.float32)  # this tile's elements; k0 before it
        mb = tl.sum(x, axis=1) / nb
        d = tl.where(km[None, :], x - mb[:, None], 0.0)
        n = k0 + nb
        delta = mb - mean
        mean += delta * (nb / n)
        m2 += tl.sum(d * d, axis=1) + delta * delta * (k0 * nb / n)
    return mean, 1.0 / tl.sqrt(m2 / K + eps)


@triton.jit
def _norm_tile_dot(
    x_ptr, g_ptr, b_ptr, w_ptr, rm, rn, rmask, nmask, K, sxm, sxk, swn, swk, eps,
    DT: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """LayerNorm(x[rm]) (weight g, bias b; rounded to DT) @ W[rn].T in float32 over the whole K."""
    mean, rstd = _ln_stats(x_ptr, rm, rmask, K, sxm, sxk, eps, BLOCK_M, BLOCK_K)
    rk = tl.arange(0, BLOCK_K)
    px = x_ptr + rm[:, None].to(tl.int64) * sxm + rk[None, :] * sxk
    pw = w_ptr + rn[None, :].to(tl.int64) * swn + rk[:, None] * swk  # [BLOCK_K, BLOCK_N] = W.T tile
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        km = (k0 + rk) < K
        x = tl.load(px, mask=rmask[:, None] & km[None, :], other=0.0).to(tl.float32)
        g = tl.load(g_ptr + k0 + rk, mask=km, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + k0 + rk, mask=km, other=0.0).to(tl.float32)
        a = rnd((x - mean[:, None]) * rstd[:, None] * g[None, :] + b[None, :], DT).to(DT)  # 0 past K (g, b = 0)
        w = tl.load(pw, mask=km[:, None] & nmask[None, :], other=0.0)
        if UPCAST:
            a, w = a.to(tl.float32), w.to(tl.float32)
        acc = tl.dot(a, w, acc, input_precision=PRECISION)
        px += BLOCK_K * sxk
        pw += BLOCK_K * swk
    return acc


@triton.jit
def _norm_linear_kernel(
    x_ptr,
    g_ptr,
    b_ptr,
    w_ptr,
    bias_ptr,
    y_ptr,
    pos_ptr,
    kc_ptr,
    vc_ptr,
    M,
    N,
    K,
    HD,
    D,
    sxm,
    sxk,
    swn,
    swk,
    sym,
    spos,
    skb,
    skh,
    skt,
    svb,
    svh,
    svt,
    eps,
    EPILOGUE: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PDL: tl.constexpr = False,
):
    pdl.gate(PDL)
    # grid (row blocks, column blocks): y[rm, rn] = epilogue(LayerNorm(x) @ W.T + bias). QKV_CACHE: columns
    # [0, HD) are Q (to y, [M, HD]), [HD, 2 HD) K and [2 HD, 3 HD) V (head (n % HD) // D, element n % D) written to
    # the caches [rows, H, S, D] at (row, head, pos[row])
    DT: tl.constexpr = x_ptr.dtype.element_ty  # the activations' dtype (y may be float32: the logits)
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mm = rm < M
    nm = rn < N
    acc = _norm_tile_dot(
        x_ptr, g_ptr, b_ptr, w_ptr, rm, rn, mm, nm, K, sxm, sxk, swn, swk, eps,
        DT, PRECISION, UPCAST, BLOCK_M, BLOCK_N, BLOCK_K,
    )  # fmt: skip
    if EPILOGUE == 1:  # GELU: as the unfused linear (no bias) -> gelu(h, bias) leave it
        y = rnd(acc, DT)
        if HAS_BIAS:
            y = rnd(y + tl.load(bias_ptr + rn, mask=nm, other=0.0).to(tl.float32)[None, :], DT)
        y = 0.5 * y * (1.0 + tl.erf(y * 0.7071067811865476))
    else:  # the linear's bias added in float32, one rounding (the unfused linear kernel's epilogue)
        if HAS_BIAS:
            acc += tl.load(bias_ptr + rn, mask=nm, other=0.0).to(tl.float32)[None, :]
        y = acc
    y = y.to(DT).to(y_ptr.dtype.element_ty)
    om = mm[:, None] & nm[None, :]
    row = rm[:, None].to(tl.int64)
    if EPILOGUE == 2:
        part = rn // HD  # 0 q, 1 k, 2 v
        c = rn % HD
        head = (c // D).to(tl.int64)
        d = c % D
        pos = tl.load(pos_ptr + rm.to(tl.int64) * spos, mask=mm, other=0).to(tl.int64)[:, None]
        tl.store(y_ptr + row * sym + c[None, :], y, mask=om & (part == 0)[None, :])
        pk = kc_ptr + row * skb + head[None, :] * skh + pos * skt + d[None, :]
        tl.store(pk, y, mask=om & (part == 1)[None, :])
        pv = vc_ptr + row * svb + head[None, :] * svh + pos * svt + d[None, :]
        tl.store(pv, y, mask=om & (part == 2)[None, :])
    else:
        tl.store(y_ptr + row * sym + rn[None, :], y, mask=om)


def _launch(x, ln_w, ln_b, eps, weight, bias, y, epilogue, n, pos=None, k_cache=None, v_cache=None):
    M, K = x.shape
    if not M:
        return
    cfg = config(M, x.dtype)
    kc = k_cache if k_cache is not None else y
    vc = v_cache if v_cache is not None else y
    HD, D = (k_cache.shape[1] * k_cache.shape[3], k_cache.shape[3]) if k_cache is not None else (n, 1)
    ks = (kc.stride(0), kc.stride(1), kc.stride(2)) if k_cache is not None else (0, 0, 0)
    vs = (vc.stride(0), vc.stride(1), vc.stride(2)) if v_cache is not None else (0, 0, 0)
    grid = (triton.cdiv(M, cfg["BLOCK_M"]), triton.cdiv(n, cfg["BLOCK_N"]))
    _norm_linear_kernel[grid](
        x,
        ln_w,
        ln_b,
        weight,
        bias if bias is not None else ln_w,
        y,
        pos if pos is not None else y,
        kc,
        vc,
        M,
        n,
        K,
        HD,
        D,
        x.stride(0),
        x.stride(1),
        weight.stride(0),
        weight.stride(1),
        y.stride(0),
        pos.stride(0) if pos is not None else 0,
        *ks,
        *vs,
        eps,
        EPILOGUE=epilogue,
        HAS_BIAS=bias is not None,
        PRECISION=precision(x.dtype),
        UPCAST=upcast(x.dtype),
        **cfg,
        **pdl.args(x.device),
    )


def norm_linear(x, ln_w, ln_b, eps, weight, bias=None, act=None, out_dtype=None):
    """See kernels.reference.norm_linear."""
    if act not in (None, "gelu"):
        raise ValueError(f"norm_linear: act is None or 'gelu', not {act!r}")
    x = as_rows(x)
    y = torch.empty((x.shape[0], weight.shape[0]), dtype=out_dtype or x.dtype, device=x.device)
    _launch(x, ln_w, ln_b, eps, weight, bias, y, GELU if act else PLAIN, weight.shape[0])
    return y


def norm_qkv_cache(x, ln_w, ln_b, eps, wqkv, bqkv, pos, k_cache, v_cache):
    """See kernels.reference.norm_qkv_cache."""
    x = as_rows(x)
    H, D = k_cache.shape[1], k_cache.shape[3]
    if wqkv.shape[0] != 3 * H * D or v_cache.shape[1:] != k_cache.shape[1:]:
        raise ValueError(f"norm_qkv_cache: wqkv has {wqkv.shape[0]} rows, the caches {H} heads of {D}")
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("norm_qkv_cache: the caches need a unit last stride")
    q = torch.empty((x.shape[0], H, D), dtype=x.dtype, device=x.device)
    _launch(x, ln_w, ln_b, eps, wqkv, bqkv, q, QKV_CACHE, 3 * H * D, pos, k_cache, v_cache)
    return q


@triton.jit
def _step_inputs_kernel(
    tok_ptr, temb_ptr, pemb_ptr, pos_ptr, cl_ptr, s_ptr, sl_ptr, cl32_ptr, d, stok, ste, spe, ssm,
    HAS_CL: tl.constexpr, BLOCK: tl.constexpr,
    PDL: tl.constexpr = False,
):  # fmt: skip
    pdl.gate(PDL)
    # grid (rows,): s[b] = temb[tok[b]] + pemb[pos] (the sum of two DT values rounded once, as DT's add); the lengths
    DT: tl.constexpr = s_ptr.dtype.element_ty
    b = tl.program_id(0).to(tl.int64)
    t = tl.load(tok_ptr + b * stok).to(tl.int64)
    p = tl.load(pos_ptr).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    for c0 in range(0, d, BLOCK):
        c = c0 + cols
        cm = c < d
        e = tl.load(temb_ptr + t * ste + c, mask=cm, other=0.0).to(tl.float32)
        e += tl.load(pemb_ptr + p * spe + c, mask=cm, other=0.0).to(tl.float32)
        tl.store(s_ptr + b * ssm + c, rnd(e, DT).to(DT), mask=cm)
    tl.store(sl_ptr + b, (p + 1).to(tl.int32))
    if HAS_CL:
        tl.store(cl32_ptr + b, tl.load(cl_ptr + b).to(tl.int32))


def inputs_config(d: int) -> dict:
    """The embedding kernel's column block (the row in chunks of at most 512) and warps."""
    block = min(triton.next_power_of_2(d), 512)
    return {"BLOCK": block, "num_warps": 4 if block >= 256 else 1}


def step_inputs(tokens, tok_emb, pos_emb, position, cross_lengths=None):
    """See kernels.reference.step_inputs."""
    B, d = tokens.shape[0], tok_emb.shape[1]
    if tok_emb.stride(1) != 1 or pos_emb.stride(1) != 1 or (cross_lengths is not None and cross_lengths.stride(0) != 1):
        raise ValueError("step_inputs: the embeddings need a unit column stride, the encoder lengths a unit stride")
    s = torch.empty((B, d), dtype=tok_emb.dtype, device=tok_emb.device)
    lengths = torch.empty((B,), dtype=torch.int32, device=tok_emb.device)
    cl = torch.empty((B,), dtype=torch.int32, device=tok_emb.device) if cross_lengths is not None else None
    if B:
        _step_inputs_kernel[(B,)](
            tokens,
            tok_emb,
            pos_emb,
            position,
            cross_lengths if cl is not None else lengths,
            s,
            lengths,
            cl if cl is not None else lengths,
            d,
            tokens.stride(0),
            tok_emb.stride(0),
            pos_emb.stride(0),
            s.stride(0),
            HAS_CL=cl is not None,
            **inputs_config(d),
            **pdl.args(tok_emb.device),
        )
    return s, lengths, cl


OPS = {
    "norm_qkv_cache": norm_qkv_cache,
    "norm_linear": norm_linear,
    "linear_residual": linear_residual,
    "step_inputs": step_inputs,
    "whisper_pick": whisper_pick,  # the greedy pick after the step (decode loops on the device)
}
