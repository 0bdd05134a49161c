"""Llama's layers: linear layers in their weight storage formats (float, int8 / int4 / fp8 weight-only, with a dense
copy for prompts) and the decoder block (RMSNorm, grouped-query attention with rotary embedding and, per the
config, Q/K/V biases, per-head Q/K norms, a sliding window, post-attention / post-MLP norms (Gemma 3), SwiGLU
or GeGLU MLP)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from speechrt.kernels.reference import quantize_fp8

if TYPE_CHECKING:
    from .llama import LlamaConfig

# Storage of linear-layer weights -> the activation dtype it computes in.
WEIGHT_FORMATS: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "int8": torch.bfloat16,  # int8 weight-only, per-output-channel scale; bf16 activations
    # 4-bit weight-only in groups of 32, bf16 activations: a GGUF's Q4_0 / Q4_1 blocks are kept exactly
    # (no requantization); other linear weights of such a file (e.g. a Q8_0 or Q6_K tensor) become int8;
    # a float checkpoint is quantized to 4 bits per group by min/max. The output head stays int8.
    "int4": torch.bfloat16,
    # float8 E4M3 weights with a float32 scale per output channel (absmax / 448, quantized at load), bf16
    # activations: W8A16 kernels on every GPU, W8A8 on fp8 tensor cores for prompts (kernels/triton_fp8_matmul.py).
    # The output head stays int8.
    "fp8": torch.bfloat16,
}


def quantize_int4(w: torch.Tensor, group: int = 32):
    """float [N, K] -> (q, scale, zero) by asymmetric min/max per group of `group` (w = (q - 8) * s + z)."""
    N, K = w.shape
    if K % group:
        raise ValueError(f"int4 needs the input size ({K}) to be a multiple of the group size {group}")
    g = w.float().view(N, K // group, group)
    lo, hi = g.amin(-1), g.amax(-1)
    scale = ((hi - lo) / 15).clamp_min(1e-12)
    q = torch.round((g - lo[..., None]) / scale[..., None]).clamp_(0, 15).to(torch.uint8).view(N, K)
    return q, scale, lo + 8 * scale


DENSE_MIN_ROWS = 16  # inputs with at least this many rows (prefill) take the dense copy, if there is one


class Linear(nn.Module):
    """y = x @ W.T with W stored as `fmt` (see WEIGHT_FORMATS); the op comes from the kernel set."""

    def __init__(
        self,
        ops,
        weight: torch.Tensor | list[torch.Tensor],
        fmt: str,
        device: torch.device,
        q4=None,
        dense: torch.dtype | None = None,
    ):
        """weight [N, K] float, or a list of them to fuse along N. q4: the file's own 4-bit blocks
        (q, scale, zero) for this weight, used by fmt 'int4'; with fmt 'int4' and no blocks,
        `q4='quantize'` quantizes the float weight, None falls back to int8.

        dense (int4 / int8 only): also keep the dequantized weight in this dtype for inputs of many rows.
        Weight-only kernels are for memory-bound one-row decode steps; a prompt's prefill is compute
        bound, and a matmul in the CPU's native dtype (bf16 with AMX / AVX512-BF16, where it runs prefill
        about twice as fast end to end; float32 elsewhere, as fast as the int4 kernel and exact) computes
        it with the same weight values, converting the activations in and out."""
        super().__init__()
        self.register_buffer("dense", None)
        self._dense_op = ops.linear
        if isinstance(q4, tuple):  # the float copy is not needed
            self.out_features, self.in_features = q4[0].shape
        else:
            weight = torch.cat(weight) if isinstance(weight, list) else weight
            self.out_features, self.in_features = weight.shape
        self.fmt = fmt
        if fmt == "int4" and q4 is not None:
            q, scale, zero = quantize_int4(weight) if isinstance(q4, str) else q4
            if dense:
                N, K = q.shape
                g = K // scale.shape[1]
                w = (q.float().view(N, -1, g) - 8) * scale.float()[..., None] + zero.float()[..., None]
                self.register_buffer("dense", w.view(N, K).to(device, dense).contiguous())
            packed, sz = ops.pack_int4(q.to(device), scale.to(device), zero.to(device), WEIGHT_FORMATS[fmt])
            self.register_buffer("weight", packed)
            self.register_buffer("scale", sz)
            self._op = ops.linear_int4
            self._int8 = True  # (x, weight, scale) call
            return
        if isinstance(weight, list):
            weight = torch.cat(weight)
        if fmt == "fp8":
            w8, scale = quantize_fp8(weight.to(device))
            self.register_buffer("weight", w8)
            self.register_buffer("scale", scale)
            if dense:
                self.register_buffer("dense", (w8.float() * scale[:, None]).to(dense).contiguous())
            self._op = ops.linear_fp8
            self._int8 = True
            return
        if fmt == "int4":
            fmt = self.fmt = "int8"
        if fmt == "int8":
            w = weight.to(device=device, dtype=torch.float32)
            # symmetric per-row: scale = max|w| / 127 (a zero row keeps scale 1 to avoid 0/0)
            scale = w.abs().amax(dim=1).clamp_min(1e-12) / 127.0
            self.register_buffer("weight", torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8))
            self.register_buffer("scale", scale.to(WEIGHT_FORMATS[fmt]))
            if dense:
                self.register_buffer("dense", (self.weight.float() * scale[:, None]).to(dense).contiguous())
            self._op = ops.linear_int8
            self._int8 = True
        else:
            self.register_buffer("weight", weight.to(device=device, dtype=WEIGHT_FORMATS[fmt]).contiguous())
            self.scale = None
            self._op = ops.linear
            self._int8 = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.dense is not None and x.numel() >= DENSE_MIN_ROWS * x.shape[-1]:
            return self._dense_op(x.to(self.dense.dtype), self.dense).to(x.dtype)
        if self._int8:
            return self._op(x, self.weight, self.scale)
        return self._op(x, self.weight)


class Block(nn.Module):
    def __init__(
        self,
        cfg: LlamaConfig,
        index: int,
        ops,
        w: dict,
        fmt: str,
        device,
        adtype,
        q4: dict | str | None = None,
        dense: torch.dtype | None = None,
    ):
        super().__init__()
        self.ops, self.cfg = ops, cfg
        self.attn_norm = nn.Parameter(w["attn_norm"].to(device, adtype), requires_grad=False)
        self.ffn_norm = nn.Parameter(w["ffn_norm"].to(device, adtype), requires_grad=False)
        # Gemma 3: norms of the attention's and the MLP's outputs; a sliding window (its rotary tables apart)
        self.post_attn_norm = self.post_ffn_norm = None
        if cfg.post_norms:
            self.post_attn_norm = nn.Parameter(w["post_attn_norm"].to(device, adtype), requires_grad=False)
            self.post_ffn_norm = nn.Parameter(w["post_ffn_norm"].to(device, adtype), requires_grad=False)
        self.local = index in cfg.sliding_layers
        self.attn_kw = {"window": cfg.window(index)} if cfg.window(index) else {}  # (the plain call elsewhere)
        self.act = ops.silu_mul if cfg.act == "silu" else ops.gelu_tanh_mul

        def blocks(*names):  # the file's 4-bit blocks of these (fused) weights, if it has them for all
            if q4 is None or isinstance(q4, str):
                return q4
            if all(n in q4 for n in names):
                return tuple(torch.cat([q4[n][i] for n in names]) for i in range(3))
            return None

        # fused projections: [(H + 2 Hkv) * D, dim] and [2 * hidden, dim]
        self.wqkv = Linear(ops, [w["wq"], w["wk"], w["wv"]], fmt, device, blocks("wq", "wk", "wv"), dense)
        self.wo = Linear(ops, w["wo"], fmt, device, blocks("wo"), dense)
        self.w_gate_up = Linear(ops, [w["w_gate"], w["w_up"]], fmt, device, blocks("w_gate", "w_up"), dense)
        self.w_down = Linear(ops, w["w_down"], fmt, device, blocks("w_down"), dense)
        self.q_size = cfg.n_heads * cfg.head_dim
        self.kv_size = cfg.n_kv_heads * cfg.head_dim
        # Qwen2: the Q/K/V biases, fused as the weights are; Qwen3: RMSNorm weights [D] over each Q / K head
        bias = torch.cat([w["bq"], w["bk"], w["bv"]]) if cfg.qkv_bias else None
        self.bqkv = None if bias is None else nn.Parameter(bias.to(device, adtype), requires_grad=False)
        self.q_norm = self.k_norm = None
        if cfg.qk_norm:
            self.q_norm = nn.Parameter(w["q_norm"].to(device, adtype), requires_grad=False)
            self.k_norm = nn.Parameter(w["k_norm"].to(device, adtype), requires_grad=False)

    def forward(self, h, residual, rope, kc, vc, write, read, lengths):
        """h [B, T, dim] (the previous block's output, added to `residual` here; residual None at layer 0).
        rope: {local: (cos, sin)} the rotary angles of the global (False) and sliding-window (True) layers.
        kc/vc: this layer's cache [slots, Hkv, S, D]. `write(cache, k)` stores the new keys/values;
        `read(cache)` returns the keys/values to attend over [B, Hkv, Tk, D]; `lengths` [B] or None."""
        ops, cfg = self.ops, self.cfg
        B, T, _ = h.shape
        if residual is None:
            x, residual = ops.rms_norm(h, self.attn_norm, cfg.norm_eps), h
        else:
            x, residual = ops.rms_norm(h, self.attn_norm, cfg.norm_eps, residual=residual)
        qkv = self.wqkv(x)
        if self.bqkv is not None:
            qkv = qkv + self.bqkv
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(B, T, cfg.n_heads, cfg.head_dim)
        k = k.view(B, T, cfg.n_kv_heads, cfg.head_dim)
        if self.q_norm is not None:
            q, k = ops.rms_norm(q, self.q_norm, cfg.norm_eps), ops.rms_norm(k, self.k_norm, cfg.norm_eps)
        q = q.transpose(1, 2)  # [B, H, T, D]
        k = k.transpose(1, 2)  # [B, Hkv, T, D]
        v = v.view(B, T, cfg.n_kv_heads, cfg.head_dim).transpose(1, 2)
        q, k = ops.rotary(q, k, *rope[self.local])
        write(kc, k)
        write(vc, v)
        a = ops.attention(q, read(kc), read(vc), causal=True, lengths=lengths, **self.attn_kw)  # [B, H, T, D]
        h = self.wo(a.transpose(1, 2).reshape(B, T, self.q_size))
        if self.post_attn_norm is not None:
            h = ops.rms_norm(h, self.post_attn_norm, cfg.norm_eps)
        x, residual = ops.rms_norm(h, self.ffn_norm, cfg.norm_eps, residual=residual)
        gu = self.w_gate_up(x)
        h = self.w_down(self.act(*gu.chunk(2, dim=-1)))
        if self.post_ffn_norm is not None:
            h = ops.rms_norm(h, self.post_ffn_norm, cfg.norm_eps)
        return h, residual
