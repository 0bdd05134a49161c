"""The Whisper decoder step in fused layer kernels: per layer, LayerNorm + Q/K/V + bias + cache write in one op, decode
attention over the cache, output projection + bias + residual, LayerNorm + cross-attention query, decode attention
over the encoder's keys/values, its output projection + residual, LayerNorm + fc1 + bias + GELU, fc2 + bias +
residual; then the final LayerNorm folded into the tied logits projection (kernels/triton_fused_whisper.py; their
references in kernels.reference.WHISPER_FUSED_OPS).

The fixed-shape step of TextDecoder.forward (one token per row, a `position` tensor: what the triton backend replays
from a graph), the same logits up to rounding order: the residual stream is one tensor, each projection that closes a
branch adds its output to it, and each norm is computed inside the projection that reads it."""

from __future__ import annotations

import torch

EPS = 1e-5  # models.whisper.LayerNorm's


def decoder_step_fused(decoder, fops, tokens, caches, cross_kvs, position, cross_lengths=None) -> torch.Tensor:
    """TextDecoder.forward(tokens, caches, 0, cross_kvs, position=position, cross_lengths=cross_lengths) (tokens
    [B, 1], position int64 [1] on the device; logits [B, vocab] float32) through `fops`: a mapping with
    step_inputs, norm_qkv_cache, norm_linear and linear_residual (kernels.triton_fused_whisper.OPS, or
    kernels.reference.WHISPER_FUSED_OPS)."""
    B = tokens.shape[0]
    if tokens.shape[1] != 1:
        raise ValueError(f"the fused decode step takes one token per row, got {tokens.shape[1]}")
    ops = decoder.ops
    # the residual stream [B, d] and the int32 key counts of the decode attentions (converted once, not per layer)
    s, lengths, cross_lengths = fops["step_inputs"](
        tokens[:, 0], decoder.token_embedding.weight, decoder.positional_embedding, position, cross_lengths
    )
    pos = position.expand(B)
    for blk, (kc, vc), (ck, cv) in zip(decoder.blocks, caches, cross_kvs):
        H, D = kc.shape[1], kc.shape[3]
        a, c, mlp = blk.attn, blk.cross_attn, blk.mlp
        ln = blk.attn_ln
        q = fops["norm_qkv_cache"](s, ln.weight, ln.bias, EPS, a.qkv.weight, a.qkv.bias, pos, kc, vc)  # [B, H, D]
        o = ops.attention(q[:, :, None], kc, vc, causal=True, lengths=lengths)  # [B, H, 1, D]
        s = fops["linear_residual"](o.reshape(B, H * D), a.out.weight, s, a.out.bias)
        ln = blk.cross_attn_ln
        q = fops["norm_linear"](s, ln.weight, ln.bias, EPS, c.q.weight, c.q.bias)  # [B, H * D]
        o = ops.attention(q.view(B, H, 1, D), ck, cv, causal=False, lengths=cross_lengths)
        s = fops["linear_residual"](o.reshape(B, H * D), c.out.weight, s, c.out.bias)
        ln = blk.mlp_ln
        h = fops["norm_linear"](s, ln.weight, ln.bias, EPS, mlp.fc1.weight, mlp.fc1.bias, act="gelu")
        s = fops["linear_residual"](h, mlp.fc2.weight, s, mlp.fc2.bias)
    ln, emb = decoder.ln, decoder.token_embedding.weight
    return fops["norm_linear"](s, ln.weight, ln.bias, EPS, emb, out_dtype=torch.float32)
