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


def conv1d(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, padding: int = 0,
           dilation: int = 1, groups: int = 1, pre_slope: float | None = None) -> torch.Tensor:
    """1-D convolution, stride 1. x [B, Cin, T], weight [Cout, Cin/groups, K] -> [B, Cout, T'].

    `pre_slope` applies leaky_relu(x, pre_slope) first (HiFi-GAN's activation before every conv; a fused
    kernel reads x once).
    """
    if pre_slope is not None:
        x = F.leaky_relu(x, pre_slope)
    return F.conv1d(x, weight, bias, 1, padding, dilation, groups)


def conv_transpose1d(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, stride: int,
                     padding: int, pre_slope: float | None = None) -> torch.Tensor:
    """Transposed 1-D convolution (upsampling). x [B, Cin, T], weight [Cin, Cout, K] -> [B, Cout, T']
    with T' = (T - 1) * stride - 2 * padding + K. `pre_slope` as in conv1d."""
    if pre_slope is not None:
        x = F.leaky_relu(x, pre_slope)
    return F.conv_transpose1d(x, weight, bias, stride, padding)


def relative_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, emb_rel_k: torch.Tensor,
                       emb_rel_v: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Self-attention with windowed relative-position embeddings (Shaw et al.; the VITS text encoder).

    q, k, v [B, H, T, D]; emb_rel_k, emb_rel_v [1 or H, 2W+1, D] for offsets -W..W (key minus query);
    mask [B, 1, T, T] (or broadcastable), 0 where a score is masked (filled with -1e4, as VITS does).
    scores[i, j] = q_i.k_j / sqrt(D) + q_i.emb_rel_k[j - i] / sqrt(D)  (offsets beyond W contribute 0)
    out[i] = sum_j p[i, j] (v_j + emb_rel_v[j - i]).  Returns [B, H, T, D].
    """
    B, H, T, D = q.shape
    W = (emb_rel_k.shape[1] - 1) // 2
    q = q / math.sqrt(D)
    scores = torch.matmul(q, k.transpose(-2, -1))  # [B, H, T, T]
    # rel [B, H, T, 2W+1]: the query against each relative embedding, then placed on the band |j-i| <= W
    rel = torch.matmul(q, emb_rel_k.unsqueeze(0).transpose(-2, -1))
    i = torch.arange(T, device=q.device)
    off = i[None, :] - i[:, None]  # [T, T] j - i
    band = off.abs() <= W
    idx = (off.clamp(-W, W) + W).expand(B, H, T, T)
    scores = scores + torch.where(band, rel.gather(-1, idx), rel.new_zeros(()))
    if mask is not None:
        scores = scores.masked_fill(mask == 0, -1e4)
    p = torch.softmax(scores, dim=-1)
    out = torch.matmul(p, v)
    # p_rel [B, H, T, 2W+1]: p[i, i + r - W], 0 where that key is outside the sequence
    r = torch.arange(2 * W + 1, device=q.device)
    j = i[:, None] + r[None, :] - W  # [T, 2W+1]
    valid = (j >= 0) & (j < T)
    p_rel = torch.where(valid, p.gather(-1, j.clamp(0, T - 1).expand(B, H, T, 2 * W + 1)), p.new_zeros(()))
    return out + torch.matmul(p_rel, emb_rel_v.unsqueeze(0))


OPS = {
    "layer_norm": layer_norm,
    "rms_norm": rms_norm,
    "gelu": gelu,
    "silu_mul": silu_mul,
    "linear": linear,
    "rotary": rotary,
    "attention": attention,
    "conv1d": conv1d,
    "conv_transpose1d": conv_transpose1d,
    "relative_attention": relative_attention,
}
