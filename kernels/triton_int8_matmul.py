"""Weight-only int8 linear: y = x @ (W_int8 * scale[:, None]).T (+ bias), for batch-1 decode where
reading W is the whole cost: W streams in as int8 (a quarter of float32, half of fp16), is widened
to x's dtype in registers, and the per-output-channel scale and the bias are applied once in the
epilogue. Same signature as kernels.reference.linear_int8."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import triton_pdl as pdl
from .triton_matmul import precision, upcast


@triton.jit
def _linear_int8_kernel(
    x_ptr,
    w_ptr,
    s_ptr,
    b_ptr,
    y_ptr,
    M,
    N,
    K,
    sxm,
    sxk,
    swn,
    swk,
    sym,
    HAS_BIAS: tl.constexpr,
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
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    px = x_ptr + rm[:, None].to(tl.int64) * sxm + rk[None, :] * sxk
    pw = w_ptr + rn[None, :].to(tl.int64) * swn + rk[:, None] * swk  # [BLOCK_K, BLOCK_N] int8
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        km = (k0 + rk) < K
        a = tl.load(px, mask=(rm < M)[:, None] & km[None, :], other=0.0)
        w = tl.load(pw, mask=km[:, None] & (rn < N)[None, :], other=0)
        if UPCAST:
            acc = tl.dot(a.to(tl.float32), w.to(tl.float32), acc, input_precision=PRECISION)
        else:
            acc = tl.dot(a, w.to(a.dtype), acc, input_precision=PRECISION)  # int8 -> fp16/bf16 is exact
        px += BLOCK_K * sxk
        pw += BLOCK_K * swk
    nm = rn < N
    acc = acc * tl.load(s_ptr + rn, mask=nm, other=0.0).to(tl.float32)[None, :]
    if HAS_BIAS:
        acc += tl.load(b_ptr + rn, mask=nm, other=0.0).to(tl.float32)[None, :]
    py = y_ptr + rm[:, None].to(tl.int64) * sym + rn[None, :]
    tl.store(py, acc.to(y_ptr.dtype.element_ty), mask=(rm < M)[:, None] & nm[None, :])


def config(M: int, N: int, K: int, dtype: torch.dtype) -> dict:
    """Decode (M <= 16): one 16-row tile, narrow column tiles so that N/32 programs stream W.
    Larger M (prefill through the same weights): wider tiles."""
    if M <= 16:
        return {
            "BLOCK_M": 16,
            "BLOCK_N": 32,
            "BLOCK_K": 64 if dtype == torch.float32 else 128,
            "num_warps": 4,
            "num_stages": 4,
        }
    return {
        "BLOCK_M": 64,
        "BLOCK_N": 64,
        "BLOCK_K": 32 if dtype == torch.float32 else 64,
        "num_warps": 4,
        "num_stages": 3,
    }


def linear_int8(x: torch.Tensor, w_int8: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None):
    if w_int8.dtype != torch.int8:
        raise TypeError(f"linear_int8 expects int8 weights, got {w_int8.dtype}")
    K = x.shape[-1]
    N = w_int8.shape[0]
    x2 = x.reshape(-1, K)
    M = x2.shape[0]
    y = torch.empty((M, N), dtype=x.dtype, device=x.device)
    if M and N:
        cfg = config(M, N, K, x.dtype)
        grid = (triton.cdiv(N, cfg["BLOCK_N"]), triton.cdiv(M, cfg["BLOCK_M"]))
        _linear_int8_kernel[grid](
            x2,
            w_int8,
            scale.contiguous(),
            bias.contiguous() if bias is not None else scale,
            y,
            M,
            N,
            K,
            x2.stride(0),
            x2.stride(1),
            w_int8.stride(0),
            w_int8.stride(1),
            y.stride(0),
            HAS_BIAS=bias is not None,
            PRECISION=precision(x.dtype),
            UPCAST=upcast(x.dtype),
            **cfg,
            **pdl.args(x.device),
        )
    return y.view(*x.shape[:-1], N)


OPS = {"linear_int8": linear_int8}
