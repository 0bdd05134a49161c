"""LayerNorm and RMSNorm over the last dim, with the residual add fused (one read of x and residual,
one write of the sum and of the normalized output). Same signatures as kernels.reference."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import triton_pdl as pdl


@triton.jit
def _layer_norm_kernel(
    x_ptr,
    r_ptr,
    w_ptr,
    b_ptr,
    y_ptr,
    s_ptr,
    N,
    stride_x,
    stride_r,
    stride_y,
    stride_s,
    eps,
    HAS_RES: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr = False,
):
    pdl.gate(PDL)
    # one program per row of [M, N]; the whole row sits in registers (BLOCK >= N)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    m = cols < N
    x = tl.load(x_ptr + row * stride_x + cols, mask=m, other=0.0)
    if HAS_RES:
        # the sum rounded to x's dtype, like the reference (added in float32: exact for 16-bit inputs)
        r = tl.load(r_ptr + row * stride_r + cols, mask=m, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)
        tl.store(s_ptr + row * stride_s + cols, x, mask=m)
    xf = x.to(tl.float32)
    mean = tl.sum(xf, axis=0) / N
    d = tl.where(m, xf - mean, 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(d * d, axis=0) / N + eps)
    y = d * rstd * tl.load(w_ptr + cols, mask=m, other=0.0).to(tl.float32)
    if HAS_BIAS:
        y = y + tl.load(b_ptr + cols, mask=m, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * stride_y + cols, y.to(y_ptr.dtype.element_ty), mask=m)


@triton.jit
def _rms_norm_kernel(
    x_ptr,
    r_ptr,
    w_ptr,
    y_ptr,
    s_ptr,
    N,
    stride_x,
    stride_r,
    stride_y,
    stride_s,
    eps,
    HAS_RES: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr = False,
):
    pdl.gate(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    m = cols < N
    x = tl.load(x_ptr + row * stride_x + cols, mask=m, other=0.0)
    if HAS_RES:
        r = tl.load(r_ptr + row * stride_r + cols, mask=m, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)
        tl.store(s_ptr + row * stride_s + cols, x, mask=m)
    xf = x.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / N + eps)
    # HF/Llama order: normalize in float32, round to x's dtype, then scale by the weight
    n = (xf * rstd).to(x.dtype).to(tl.float32)
    y = n * tl.load(w_ptr + cols, mask=m, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * stride_y + cols, y.to(y_ptr.dtype.element_ty), mask=m)


def _rows(t: torch.Tensor, n: int) -> torch.Tensor:
    """[..., n] -> a [M, n] view with unit column stride (copies only when no such view exists)."""
    t2 = t.reshape(-1, n)
    return t2 if t2.stride(-1) == 1 or t2.shape[0] == 0 else t2.contiguous()


def config(n: int) -> dict:
    """Block and warp choice for rows of width n."""
    block = triton.next_power_of_2(n)
    return {"BLOCK": block, "num_warps": min(max(block // 256, 1), 8)}


def layer_norm(x, weight, bias, eps=1e-5, residual=None):
    shape, n = x.shape, x.shape[-1]
    if residual is not None:
        residual = residual.expand_as(x)
    x2 = _rows(x, n)
    r2 = _rows(residual, n) if residual is not None else x2
    y = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    s = torch.empty(x2.shape, dtype=x.dtype, device=x.device) if residual is not None else y
    if x2.shape[0]:
        _layer_norm_kernel[(x2.shape[0],)](
            x2,
            r2,
            weight.contiguous(),
            bias.contiguous() if bias is not None else weight,
            y,
            s,
            n,
            x2.stride(0),
            r2.stride(0),
            y.stride(0),
            s.stride(0),
            eps,
            HAS_RES=residual is not None,
            HAS_BIAS=bias is not None,
            **config(n),
            **pdl.args(x.device),
        )
    y = y.view(shape)
    return (y, s.view(shape)) if residual is not None else y


def rms_norm(x, weight, eps=1e-6, residual=None):
    shape, n = x.shape, x.shape[-1]
    if residual is not None:
        residual = residual.expand_as(x)
    x2 = _rows(x, n)
    r2 = _rows(residual, n) if residual is not None else x2
    y = torch.empty(x2.shape, dtype=torch.promote_types(x.dtype, weight.dtype), device=x.device)
    s = torch.empty(x2.shape, dtype=x.dtype, device=x.device) if residual is not None else y
    if x2.shape[0]:
        _rms_norm_kernel[(x2.shape[0],)](
            x2,
            r2,
            weight.contiguous(),
            y,
            s,
            n,
            x2.stride(0),
            r2.stride(0),
            y.stride(0),
            s.stride(0),
            eps,
            HAS_RES=residual is not None,
            **config(n),
            **pdl.args(x.device),
        )
    y = y.view(shape)
    return (y, s.view(shape)) if residual is not None else y


OPS = {"layer_norm": layer_norm, "rms_norm": rms_norm}
