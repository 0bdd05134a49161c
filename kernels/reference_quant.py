"""References of the fused decode-step ops on quantized weights (kernels/triton_fused_quant.py): the weight
dequantized, then kernels.reference's fused ops (FUSED_OPS) with it.

A weight is a float tensor, or a pair (weight, scale): int4 as (packed uint8 [N, K / 2], scales_zeros [K / G, N,
2]) from kernels.triton_int4_matmul.pack_int4 (or the reference's unpacked q [N, K]), fp8 as (float8_e4m3fn
[N, K], scale [N]), int8 as (int8 [N, K], scale [N]). The dequantized weight is rounded to the activation dtype,
as the unfused W4A16 kernel rounds it before its dot (fp8 / int8: the kernels apply the scale after the dot, in
float32, so in 16 bits the reference rounds once more than they do)."""

from __future__ import annotations

import torch

from . import reference as ref


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """packed [N, K / 2] -> q [N, K] uint8: each byte's low nibble is the even column, its high one the odd."""
    return torch.stack([packed & 15, packed >> 4], dim=-1).reshape(packed.shape[0], -1)


def dequantize(w, k: int, dtype: torch.dtype) -> torch.Tensor:
    """A weight as the fused ops take it (see the module) -> float [N, k] in `dtype`."""
    if isinstance(w, torch.Tensor):
        return w
    q, scale = w
    if q.dtype == torch.uint8:
        return ref.dequantize_int4(unpack_int4(q) if q.shape[1] * 2 == k else q, scale).to(dtype)
    if q.dtype in (torch.float8_e4m3fn, torch.int8):
        return (q.float() * scale.float()[:, None]).to(dtype)
    raise TypeError(f"quantized weights are uint8 (int4), float8_e4m3fn or int8, not {q.dtype}")


def norm_qkv_rope(
    x, norm_w, eps, wqkv, n_heads, cos, sin, pos, k_cache, v_cache, s0=0, bias=None, q_norm=None, k_norm=None
):
    """kernels.reference.norm_qkv_rope with wqkv dequantized."""
    w = dequantize(wqkv, x.shape[-1], x.dtype)
    return ref.norm_qkv_rope(x, norm_w, eps, w, n_heads, cos, sin, pos, k_cache, v_cache, s0, bias, q_norm, k_norm)


def linear_residual(x: torch.Tensor, weight, residual: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """kernels.reference.linear_residual with the weight dequantized."""
    return ref.linear_residual(x, dequantize(weight, x.shape[-1], x.dtype), residual, bias)


def norm_gate_up(x: torch.Tensor, norm_w: torch.Tensor, eps: float, w_gate_up) -> torch.Tensor:
    """kernels.reference.norm_gate_up with w_gate_up dequantized."""
    return ref.norm_gate_up(x, norm_w, eps, dequantize(w_gate_up, x.shape[-1], x.dtype))


# reference.FUSED_OPS with the quantized projections in place (as triton_fused_quant.OPS)
FUSED_QUANT_OPS = {
    **ref.FUSED_OPS,
    "norm_qkv_rope": norm_qkv_rope,
    "linear_residual": linear_residual,
    "norm_gate_up": norm_gate_up,
}
