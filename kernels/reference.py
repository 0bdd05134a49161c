"""Pure-torch reference for every op the models use.

These are the semantics every fast path (Triton, fused CPU code) is tested against. Shapes use
B batch, T time (sequence), H heads, Hkv key/value heads, D head dim, C channels.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, eps: float = 1e-5,
               residual: torch.Tensor | None = None):
    """LayerNorm over the last dim. With `residual`, returns (norm(x + residual), x + residual)."""
    if residual is not None:
        x = x + residual
        return F.layer_norm(x, (x.shape[-1],), weight, bias, eps), x
    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, residual: torch.Tensor | None = None):
    """RMSNorm over the last dim, computed in float32. With `residual`, returns (norm(x + r), x + r)."""
    if residual is not None:
        x = x + residual
    xf = x.float()
    y = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight
    return (y, x) if residual is not None else y


def gelu(x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Exact (erf) GELU, with an optional bias added first (fused in the kernels)."""
    if bias is not None:
        x = x + bias
    return F.gelu(x)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """SwiGLU: silu(gate) * up."""
    return F.silu(gate) * up


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., K] @ weight[N, K].T (+ bias)."""
    return F.linear(x, weight, bias)


def linear_int8(x: torch.Tensor, w_int8: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Weight-only int8 linear: x [..., K] @ (w_int8 [N, K] * scale [N, 1]).T (+ bias [N]).

    Per-output-channel scales; activations stay in x's dtype (the batch-1 decode matmul of the SLM).
    """
    y = F.linear(x, w_int8.to(x.dtype)) * scale.to(x.dtype)
    return y + bias if bias is not None else y


def rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """Rotary embedding (the half-split "NeoX" layout used by Llama in HF/GGUF order).

    q [B, H, T, D], k [B, Hkv, T, D], cos/sin [B or 1, 1, T, D/2] -> rotated (q, k).
    """
    def rot(x):
        x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
        xf1, xf2 = x1.float(), x2.float()
        return torch.cat([xf1 * cos - xf2 * sin, xf2 * cos + xf1 * sin], dim=-1).to(x.dtype)
    return rot(q), rot(k)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
              scale: float | None = None, lengths: torch.Tensor | None = None) -> torch.Tensor:
    """Scaled dot-product attention with grouped-query heads.

    q [B, H, Tq, D]; k, v [B, Hkv, Tk, D] with H % Hkv == 0. `causal` aligns the last query with the
    last key (so decode with a cache is causal too). `lengths` [B] masks keys at or past each
    sequence's length (decode over a padded KV cache). Returns [B, H, Tq, D].
    """
    B, H, Tq, D = q.shape
    Hkv, Tk = k.shape[1], k.shape[2]
    if H != Hkv:
        k = k.repeat_interleave(H // Hkv, dim=1)
        v = v.repeat_interleave(H // Hkv, dim=1)
    scale = scale if scale is not None else 1.0 / math.sqrt(D)
    mask = None
    if causal and Tq > 1:
        i = torch.arange(Tq, device=q.device)[:, None] + (Tk - Tq)
        j = torch.arange(Tk, device=q.device)[None, :]
        mask = (j <= i)[None, None]
    if lengths is not None:
        lm = torch.arange(Tk, device=q.device)[None, :] < lengths[:, None]
        lm = lm[:, None, None, :]
        mask = lm if mask is None else (mask & lm)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


OPS = {
    "layer_norm": layer_norm,
    "rms_norm": rms_norm,
    "gelu": gelu,
    "silu_mul": silu_mul,
    "linear": linear,
    "linear_int8": linear_int8,
    "rotary": rotary,
    "attention": attention,
}
