"""FP8 linear: y = x @ (W_e4m3 * scale[:, None]).T with float8 E4M3 weights [N, K] and per-output-channel
float32 scales (kernels.reference.quantize_fp8 makes them: absmax / 448). Two paths in one kernel:
- W8A16 (every GPU): the fp8 tile, read as bytes, is widened to x's dtype in registers by integer ops (exact;
  sm_80 and gfx90a have no fp8 types) and meets x on the 16-bit
  tensor / matrix cores; what batch-1 decode wants, where reading W is the whole cost.
- W8A8 (`act_fp8`, Hopper / Ada: fp8 tensor cores): each row of x is scaled by 448 / absmax(row) (a first pass
  over the row inside the kernel, no extra launch) and rounded to E4M3, and the dot runs on fp8 operands; the
  epilogue applies both scales. The launcher takes it for prefill-sized inputs on CUDA devices of compute
  capability >= 8.9.
Under TRITON_INTERPRET=1 the operands are widened to float32 before the dot (the interpreter's fp8 dot
multiplies raw bits), so there the W8A8 path checks the scaling and the epilogue, not the fp8 MMA."""

from __future__ import annotations

import os
from functools import cache

import torch
import triton
import triton.language as tl

from . import triton_pdl as pdl
from .triton_matmul import precision

FP8_MAX = 448.0


@triton.jit
def e4m3_to_float(b):
    """E4M3 (OCP, float8_e4m3fn) bytes -> float32, exactly, in integer ops any GPU has (sm_80 and gfx90a have no
    fp8 conversions): the sign, exponent and mantissa bits moved into a float16 (bias 15 for E4M3's 7, so the
    value lands 2^-8 low, subnormals included), then scaled by 256. 0x7f / 0xff (E4M3's NaN) read as +-480."""
    h = ((b & 0x7F).to(tl.uint16) << 7) | ((b & 0x80).to(tl.uint16) << 8)
    return h.to(tl.float16, bitcast=True).to(tl.float32) * 256.0


@triton.jit
def _linear_fp8_kernel(
    x_ptr,
    w_ptr,
    s_ptr,
    y_ptr,
    M,
    N,
    K,
    sxm,
    sxk,
    swn,
    swk,
    sym,
    ACT_FP8: tl.constexpr,
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
    mm, nm = rm < M, rn < N
    px = x_ptr + rm[:, None].to(tl.int64) * sxm + rk[None, :] * sxk
    pw = w_ptr + rn[None, :].to(tl.int64) * swn + rk[:, None] * swk  # [BLOCK_K, BLOCK_N] = W.T tile
    x_scale = tl.full((BLOCK_M,), 1.0, tl.float32)
    inv = tl.full((BLOCK_M,), 1.0, tl.float32)
    if ACT_FP8:  # per-row absmax of x
        amax = tl.zeros((BLOCK_M,), dtype=tl.float32)
        nans = tl.zeros((BLOCK_M,), dtype=tl.int32)
        for k0 in range(0, K, BLOCK_K):
            a = tl.load(px + k0 * sxk, mask=mm[:, None] & ((k0 + rk) < K)[None, :], other=0.0).to(tl.float32)
            amax = tl.maximum(amax, tl.max(tl.abs(a), axis=1))
            nans += tl.sum((a != a).to(tl.int32), axis=1)
        x_scale = tl.where(amax > 0, amax / 448.0, 1.0)
        inv = 1.0 / x_scale
        x_scale = tl.where(nans > 0, float("nan"), x_scale)  # a NaN in the row must not be lost to E4M3 rounding
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        km = (k0 + rk) < K
        a = tl.load(px, mask=mm[:, None] & km[None, :], other=0.0)
        w = tl.load(pw, mask=km[:, None] & nm[None, :], other=0.0)
        if ACT_FP8:
            aq = (a.to(tl.float32) * inv[:, None]).to(tl.float8e4nv)
            if UPCAST:
                acc = tl.dot(aq.to(tl.float32), w.to(tl.float32), acc, input_precision=PRECISION)
            else:
                acc = tl.dot(aq, w, acc)
        else:
            wf = e4m3_to_float(w)
            if UPCAST:
                acc = tl.dot(a.to(tl.float32), wf, acc, input_precision=PRECISION)
            else:
                acc = tl.dot(a, wf.to(a.dtype), acc, input_precision=PRECISION)  # E4M3 in fp16 / bf16: exact
        px += BLOCK_K * sxk
        pw += BLOCK_K * swk
    acc = acc * tl.load(s_ptr + rn, mask=nm, other=0.0)[None, :]
    if ACT_FP8:
        acc = acc * x_scale[:, None]
    py = y_ptr + rm[:, None].to(tl.int64) * sym + rn[None, :]
    tl.store(py, acc.to(y_ptr.dtype.element_ty), mask=mm[:, None] & nm[None, :])


def config(M: int, N: int, K: int, dtype: torch.dtype, act_fp8: bool = False) -> dict:
    """Decode (M <= 16): one 16-row tile and 32-column tiles (N / 32 programs stream W); prefill: 64 x 64
    tiles. float32 halves the K tile."""
    wide = dtype == torch.float32 and not act_fp8
    if M <= 16:
        return {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 64 if wide else 128, "num_warps": 4, "num_stages": 4}
    return {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32 if wide else 64, "num_warps": 4, "num_stages": 3}


def interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


@cache
def fp8_tensor_cores(device: torch.device) -> bool:
    """CUDA devices of compute capability >= 8.9 (Ada, Hopper, Blackwell) have E4M3 tensor cores."""
    return device.type == "cuda" and torch.version.hip is None and torch.cuda.get_device_capability(device) >= (8, 9)


def linear_fp8(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, act_fp8: bool | None = None) -> torch.Tensor:
    """x [..., K] @ (weight [N, K] float8_e4m3fn * scale [N]).T -> [..., N] in x's dtype. act_fp8: quantize x
    per row to E4M3 as well (W8A8); None: for inputs of more than 16 rows where fp8 tensor cores exist."""
    if weight.dtype != torch.float8_e4m3fn:
        raise TypeError(f"linear_fp8 expects float8_e4m3fn weights, got {weight.dtype}")
    K = x.shape[-1]
    N = weight.shape[0]
    x2 = x.reshape(-1, K)
    M = x2.shape[0]
    if act_fp8 is None:
        act_fp8 = M > 16 and not interpreted() and fp8_tensor_cores(x.device)
    y = torch.empty((M, N), dtype=x.dtype, device=x.device)
    if M and N:
        cfg = config(M, N, K, x.dtype, act_fp8)
        grid = (triton.cdiv(N, cfg["BLOCK_N"]), triton.cdiv(M, cfg["BLOCK_M"]))
        _linear_fp8_kernel[grid](
            x2,
            weight if act_fp8 else weight.view(torch.uint8),
            scale.float().contiguous(),
            y,
            M,
            N,
            K,
            x2.stride(0),
            x2.stride(1),
            weight.stride(0),
            weight.stride(1),
            y.stride(0),
            ACT_FP8=act_fp8,
            PRECISION=precision(x.dtype),
            UPCAST=interpreted(),
            **cfg,
            **pdl.args(x.device),
        )
    return y.view(*x.shape[:-1], N)


OPS = {"linear_fp8": linear_fp8}
