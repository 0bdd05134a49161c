"""The Llama-family decode step in fused layer kernels: per layer, RMSNorm + Q/K/V + rotary + cache write in one op,
decode attention over the cache, output projection + residual, RMSNorm + gate/up + SiLU, down projection +
residual (kernels/triton_fused.py; their references in kernels/reference.py FUSED_OPS).

The residual stream is one tensor here: each projection that closes a branch adds its output to it, and each
norm is folded into the projection that reads it (so the model's (h, residual) pair of the unfused path, which
lets the norm kernel do the add, is not needed). Same logits as Llama.decode_range, up to rounding order.
Configs the fused ops do not compute (`fused_unsupported`) keep the unfused path."""

from __future__ import annotations

import dataclasses

import torch

# LlamaConfig fields whose every value the fused step computes; a field added for another architecture (a
# sliding window, post-norms, another activation) is refused unless it holds its default
KNOWN_FIELDS = frozenset(
    (
        "vocab_size",
        "dim",
        "n_layers",
        "n_heads",
        "n_kv_heads",
        "hidden_dim",
        "head_dim",
        "norm_eps",
        "rope_theta",
        "rope_scaling",
        "max_seq_len",
        "tie_embeddings",
        "qkv_bias",
        "qk_norm",
        "arch",
    )
)
FLOAT_FORMATS = ("float32", "bfloat16", "float16")
# quantized weights the fused ops read too (kernels/triton_fused_quant.py): int4 groups (and the int8 tensors an int4
# model keeps where its file holds other blocks), int8 and fp8 per output channel
QUANT_FORMATS = ("int4", "int8", "fp8")
MAX_HEAD_DIM = 256  # a head's column pairs sit in one program with per-head norms


def fused_unsupported(cfg, weight_format: str = "bfloat16") -> str | None:
    """Why the fused decode step cannot run a model of `cfg` stored as `weight_format`, or None if it can."""
    for f in dataclasses.fields(cfg):
        if f.name not in KNOWN_FIELDS and getattr(cfg, f.name) != f.default:
            return f"the fused decode kernels do not implement {type(cfg).__name__}.{f.name}={getattr(cfg, f.name)!r}"
    if weight_format not in FLOAT_FORMATS + QUANT_FORMATS:
        valid = ", ".join(FLOAT_FORMATS + QUANT_FORMATS)
        return f"the fused decode kernels read weights stored as {valid}, not {weight_format}"
    if cfg.head_dim > MAX_HEAD_DIM:
        return f"the fused decode kernels take head_dim <= {MAX_HEAD_DIM}, not {cfg.head_dim}"
    return None


def weight(linear):
    """A models.llama_layers.Linear's weight as the fused ops take it: the float tensor, or (weight, scale) of a
    quantized one (kernels/triton_fused_quant.py reads int4, int8 and fp8)."""
    return linear.weight if linear.scale is None else (linear.weight, linear.scale)


def decode_range_fused(model, fops, cache, s0: int, tokens: torch.Tensor, pos: torch.Tensor, tk: int) -> torch.Tensor:
    """Llama.decode_range (same arguments, same result) through `fops`: a mapping with token_inputs, norm_qkv_rope,
    linear_residual, norm_gate_up and norm_logits (kernels.triton_fused.OPS, or kernels.reference.FUSED_OPS; on
    quantized weights kernels.triton_fused_quant.OPS, or kernels.reference_quant.FUSED_QUANT_OPS, which take float
    ones too; a quantized output projection keeps the unfused norm and head)."""
    cfg, ops = model.cfg, model.ops
    N, eps = tokens.shape[0], cfg.norm_eps
    s, lengths = fops["token_inputs"](tokens, model.tok_embeddings, pos)  # the residual stream [N, dim]; pos + 1
    rows = slice(s0, s0 + N)
    for i, layer in enumerate(model.layers):
        kc, vc = cache.k[i], cache.v[i]
        q = fops["norm_qkv_rope"](
            s,
            layer.attn_norm,
            eps,
            weight(layer.wqkv),
            cfg.n_heads,
            model.cos,
            model.sin,
            pos,
            kc,
            vc,
            s0,
            bias=layer.bqkv,
            q_norm=layer.q_norm,
            k_norm=layer.k_norm,
        )  # [N, H, D]
        a = ops.attention(q[:, :, None], kc[rows, :, :tk], vc[rows, :, :tk], causal=True, lengths=lengths)
        s = fops["linear_residual"](a.reshape(N, -1), weight(layer.wo), s)
        s = fops["linear_residual"](
            fops["norm_gate_up"](s, layer.ffn_norm, eps, weight(layer.w_gate_up)), weight(layer.w_down), s
        )
    head = model.output
    if head.scale is None and head.dense is None:  # a float head: the norm folded into it, float32 out
        return fops["norm_logits"](s, model.norm, eps, head.weight)
    return head(ops.rms_norm(s, model.norm, eps)).float()
