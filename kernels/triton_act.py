"""Fused activations: GELU with the preceding bias add (Whisper's MLP and conv front end), SwiGLU
(silu(gate) * up, Llama's MLP) and GeGLU (gelu_tanh(gate) * up, Gemma's MLP). Inputs may be row-strided views
(e.g. the two halves of a fused gate/up projection) and are read in place. Same signatures as kernels.reference."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _gelu_kernel(x_ptr, b_ptr, y_ptr, N, stride_x, stride_y, HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr):
    # grid (rows, column blocks) over [M, N]; exact erf GELU computed in float32
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = cols < N
    x = tl.load(x_ptr + row * stride_x + cols, mask=m, other=0.0)
    xf = x.to(tl.float32)
    if HAS_BIAS:  # the biased input rounded to x's dtype, like the reference
        xf = (xf + tl.load(b_ptr + cols, mask=m, other=0.0).to(tl.float32)).to(x.dtype).to(tl.float32)
    y = 0.5 * xf * (1.0 + tl.erf(xf * 0.7071067811865476))
    tl.store(y_ptr + row * stride_y + cols, y.to(y_ptr.dtype.element_ty), mask=m)


@triton.jit
def _silu_mul_kernel(g_ptr, u_ptr, y_ptr, N, stride_g, stride_u, stride_y, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = cols < N
    g = tl.load(g_ptr + row * stride_g + cols, mask=m, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + row * stride_u + cols, mask=m, other=0.0)
    # the reference rounds silu(g) to the input dtype before the product
    s = (g / (1.0 + tl.exp(-g))).to(u.dtype).to(tl.float32)
    tl.store(y_ptr + row * stride_y + cols, (s * u.to(tl.float32)).to(y_ptr.dtype.element_ty), mask=m)


@triton.jit
def _gelu_tanh_mul_kernel(g_ptr, u_ptr, y_ptr, N, stride_g, stride_u, stride_y, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = cols < N
    g = tl.load(g_ptr + row * stride_g + cols, mask=m, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + row * stride_u + cols, mask=m, other=0.0)
    # 0.5 g (1 + tanh(t)) = g / (1 + exp(-2 t)), t = sqrt(2 / pi) (g + 0.044715 g^3); rounded as the reference
    t = 0.7978845608028654 * (g + 0.044715 * g * g * g)
    s = (g / (1.0 + tl.exp(-2.0 * t))).to(u.dtype).to(tl.float32)
    tl.store(y_ptr + row * stride_y + cols, (s * u.to(tl.float32)).to(y_ptr.dtype.element_ty), mask=m)


def config(n: int) -> dict:
    block = min(triton.next_power_of_2(n), 1024)
    return {"BLOCK": block, "num_warps": 4 if block >= 512 else max(block // 128, 1)}


def _rows(t: torch.Tensor) -> torch.Tensor:
    """[..., N] -> [M, N] with unit column stride, a view whenever the leading dims collapse."""
    n = t.shape[-1]
    if t.dim() == 2 and t.stride(-1) == 1:
        return t
    try:
        t2 = t.view(-1, n)
    except RuntimeError:
        return t.reshape(-1, n).contiguous()
    return t2 if t2.stride(-1) == 1 else t2.contiguous()


def gelu(x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    n = x.shape[-1]
    x2 = _rows(x)
    y = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    if y.numel():
        cfg = config(n)
        _gelu_kernel[(x2.shape[0], triton.cdiv(n, cfg["BLOCK"]))](
            x2,
            bias.contiguous() if bias is not None else x2,
            y,
            n,
            x2.stride(0),
            y.stride(0),
            HAS_BIAS=bias is not None,
            **cfg,
        )
    return y.view(x.shape)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return _gated(_silu_mul_kernel, gate, up)


def gelu_tanh_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return _gated(_gelu_tanh_mul_kernel, gate, up)


def _gated(kernel, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    if gate.shape != up.shape:
        gate, up = torch.broadcast_tensors(gate, up)
    n = gate.shape[-1]
    g2, u2 = _rows(gate), _rows(up)
    y = torch.empty(g2.shape, dtype=torch.promote_types(gate.dtype, up.dtype), device=gate.device)
    if y.numel():
        cfg = config(n)
        kernel[(g2.shape[0], triton.cdiv(n, cfg["BLOCK"]))](
            g2, u2, y, n, g2.stride(0), u2.stride(0), y.stride(0), **cfg
        )
    return y.view(gate.shape)


OPS = {"gelu": gelu, "silu_mul": silu_mul, "gelu_tanh_mul": gelu_tanh_mul}
