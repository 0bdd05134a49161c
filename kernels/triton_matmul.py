"""Linear layer y = x @ W.T (+ bias) as a tiled Triton matmul with the bias fused into the epilogue.
W is the [N, K] nn.Linear weight read in place (no transpose copy). float32 inputs use IEEE
products (what torch does by default), 16-bit inputs the tensor cores / matrix cores."""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from . import triton_pdl as pdl

# Products of at least this many rows go to torch's own matmul (cuBLAS, hipBLASLt) instead of _linear_kernel; None:
# never. Off until a GPU run shows the vendor's GEMM makes the tall passes faster (`bench gpu --checks asr-turbo,
# lm-prefill` time Whisper large-v3-turbo's 30-s encoder pass and the Llama prompts both ways: the H100's encoder GEMM
# ran at 0.8x cuBLAS at tiny.en's shape). Decode steps (a few rows, fused) never reach it.
VENDOR_GEMM_MIN_ROWS: int | None = None


@triton.jit
def tile_dot(
    x_ptr,
    w_ptr,
    rm,
    rn,
    M,
    N,
    K,
    sxm,
    sxk,
    swn,
    swk,
    PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """The float32 tile x[rm, :] @ W[rn, :].T over the whole K (rows past M / N read as zeros): the K loop of
    every linear kernel here and in kernels/triton_fused.py."""
    rk = tl.arange(0, BLOCK_K)
    px = x_ptr + rm[:, None].to(tl.int64) * sxm + rk[None, :] * sxk  # [BLOCK_M, BLOCK_K]
    pw = w_ptr + rn[None, :].to(tl.int64) * swn + rk[:, None] * swk  # [BLOCK_K, BLOCK_N] = W.T tile
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        km = (k0 + rk) < K
        a = tl.load(px, mask=(rm < M)[:, None] & km[None, :], other=0.0)
        b = tl.load(pw, mask=km[:, None] & (rn < N)[None, :], other=0.0)
        if UPCAST:
            a, b = a.to(tl.float32), b.to(tl.float32)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
        px += BLOCK_K * sxk
        pw += BLOCK_K * swk
    return acc


@triton.jit
def _linear_kernel(
    x_ptr,
    w_ptr,
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
    GROUP_M: tl.constexpr,
    PDL: tl.constexpr = False,
):
    pdl.gate(PDL)
    # grouped program order: GROUP_M row blocks share each column block of W while it is in L2
    pid = tl.program_id(0)
    n_m, n_n = tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N)
    group = GROUP_M * n_n
    first_m = (pid // group) * GROUP_M
    size_m = min(n_m - first_m, GROUP_M)
    pid_m = first_m + (pid % group) % size_m
    pid_n = (pid % group) // size_m
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tile_dot(x_ptr, w_ptr, rm, rn, M, N, K, sxm, sxk, swn, swk, PRECISION, UPCAST, BLOCK_M, BLOCK_N, BLOCK_K)
    if HAS_BIAS:
        acc += tl.load(b_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
    py = y_ptr + rm[:, None].to(tl.int64) * sym + rn[None, :]
    tl.store(py, acc.to(y_ptr.dtype.element_ty), mask=(rm < M)[:, None] & (rn < N)[None, :])


def config(M: int, N: int, K: int, dtype: torch.dtype) -> dict:
    """Tile choice. Decode (M <= 16): thin row tile, narrow column tiles so that many programs stream
    W; prefill: square tiles. float32 halves the K tile to keep operands in shared memory."""
    wide = dtype == torch.float32
    if M <= 16:
        return {
            "BLOCK_M": 16,
            "BLOCK_N": 32,
            "BLOCK_K": 64 if wide else 128,
            "GROUP_M": 1,
            "num_warps": 4,
            "num_stages": 3,
        }
    if M <= 64:
        return {
            "BLOCK_M": 64,
            "BLOCK_N": 64,
            "BLOCK_K": 32 if wide else 64,
            "GROUP_M": 8,
            "num_warps": 4,
            "num_stages": 3,
        }
    return {
        "BLOCK_M": 64 if wide else 128,
        "BLOCK_N": 64 if wide else 128,
        "BLOCK_K": 32,
        "GROUP_M": 8,
        "num_warps": 4 if wide else 8,
        "num_stages": 3,
    }


def precision(dtype: torch.dtype) -> str:
    """Dot precision for float32 operands: exact products, like torch's default (no TF32, which AMD
    CDNA2 also lacks); 16-bit operands use the tensor / matrix cores regardless."""
    return "ieee"


def upcast(dtype: torch.dtype) -> bool:
    """Widen bf16 dot operands to float32, only under TRITON_INTERPRET=1: the Triton 3.9 interpreter
    keeps bf16 as raw uint16 bits and its dot multiplies those bits. Exact (a bf16 x bf16 product is
    exact in float32, and the GPU's bf16 MMA accumulates in float32 too); GPUs run the bf16 MMA."""
    return dtype == torch.bfloat16 and os.environ.get("TRITON_INTERPRET") == "1"


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    K = x.shape[-1]
    N = weight.shape[0]
    x2 = x.reshape(-1, K)
    M = x2.shape[0]
    if VENDOR_GEMM_MIN_ROWS is not None and M >= VENDOR_GEMM_MIN_ROWS and x.dtype == weight.dtype:
        return torch.nn.functional.linear(x, weight, bias)
    y = torch.empty((M, N), dtype=torch.promote_types(x.dtype, weight.dtype), device=x.device)
    if M and N:
        cfg = config(M, N, K, x.dtype)
        grid = (triton.cdiv(M, cfg["BLOCK_M"]) * triton.cdiv(N, cfg["BLOCK_N"]),)
        _linear_kernel[grid](
            x2,
            weight,
            bias.contiguous() if bias is not None else weight,
            y,
            M,
            N,
            K,
            x2.stride(0),
            x2.stride(1),
            weight.stride(0),
            weight.stride(1),
            y.stride(0),
            HAS_BIAS=bias is not None,
            PRECISION=precision(x.dtype),
            UPCAST=upcast(x.dtype),
            **cfg,
            **pdl.args(x.device),
        )
    return y.view(*x.shape[:-1], N)


OPS = {"linear": linear}
