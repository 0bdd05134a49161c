"""Pure-torch reference for every op the models use.

These are the semantics every fast path (Triton, fused CPU code) is tested against. Shapes use
B batch, T time (sequence), H heads, Hkv key/value heads, D head dim, C channels.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .reference_pick import whisper_pick


def layer_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    eps: float = 1e-5,
    residual: torch.Tensor | None = None,
):
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


def gelu_tanh_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """GeGLU (Gemma): gelu(gate) with the tanh approximation, times up."""
    return F.gelu(gate, approximate="tanh") * up


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., K] @ weight[N, K].T (+ bias)."""
    return F.linear(x, weight, bias)


def rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """Rotary embedding (the half-split "NeoX" layout used by Llama in HF/GGUF order).

    q [B, H, T, D], k [B, Hkv, T, D], cos/sin [B or 1, 1, T, D/2] -> rotated (q, k).
    """

    def rot(x):
        x1, x2 = x.float().chunk(2, dim=-1)
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)

    if q.shape[0] == k.shape[0] and q.shape[2:] == k.shape[2:] and q.dtype == k.dtype:
        # one pass over all H + Hkv heads: half the (tiny, overhead-bound) ops of a decode step
        qk = rot(torch.cat([q, k], dim=1))
        return qk[:, : q.shape[1]], qk[:, q.shape[1] :]
    return rot(q), rot(k)


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    scale: float | None = None,
    lengths: torch.Tensor | None = None,
    window: int = 0,
) -> torch.Tensor:
    """Scaled dot-product attention with grouped-query heads.

    q [B, H, Tq, D]; k, v [B, Hkv, Tk, D] with H % Hkv == 0. `causal` aligns the last query with the
    last key (so decode with a cache is causal too). `lengths` [B] masks keys at or past each
    sequence's length (decode over a padded KV cache). `window` (with causal): each query sees only the
    `window` keys up to its own position (a sliding-window layer). Returns [B, H, Tq, D].
    """
    if window and causal:
        return _attention_window(q, k, v, scale, lengths, window)
    B, H, Tq, D = q.shape
    Hkv, Tk = k.shape[1], k.shape[2]
    gqa = {}
    if H != Hkv:
        if _SDPA_GQA:  # SDPA reads each key/value head for its group of query heads, no copies
            gqa = {"enable_gqa": True}
        else:
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
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, **gqa)


def _attention_window(q, k, v, scale, lengths, window):
    """causal attention over the last `window` keys up to each query's position (with `lengths`, the last query
    of row b is at lengths[b] - 1; without, at the last key)."""
    B, Tq, Tk = q.shape[0], q.shape[2], k.shape[2]
    end = lengths[:, None] if lengths is not None else torch.full((B, 1), Tk, device=q.device)  # [B, 1]
    qpos = (end - Tq + torch.arange(Tq, device=q.device)[None])[..., None]  # [B, Tq, 1]: each query's position
    j = torch.arange(Tk, device=q.device)[None, None]
    keep = (j < end[:, :, None]) & (j <= qpos) & (j > qpos - window)  # [B, Tq, Tk]
    H, Hkv = q.shape[1], k.shape[1]
    if H != Hkv:
        k, v = k.repeat_interleave(H // Hkv, dim=1), v.repeat_interleave(H // Hkv, dim=1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=keep[:, None], scale=scale)


# torch >= 2.5: scaled_dot_product_attention(enable_gqa=True)
_SDPA_GQA = "enable_gqa" in (F.scaled_dot_product_attention.__doc__ or "")


def linear_int8(
    x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """Weight-only int8 linear: x [..., K] @ (weight [N, K] int8 * scale [N]).T (+ bias [N]) -> [..., N] in
    x's dtype (per-output-channel scales; the batch-1 decode matmul of the language model).

    On the CPU this is ATen's fused int8-weight GEMM (`_weight_int8pack_mm`, which wants a 2-D
    contiguous input and is fast for bf16); elsewhere, and as the definition it is tested against, the scale
    is applied after the matmul (it is per output channel, so x @ (q * s).T == (x @ q.T) * s).
    """
    # ATen's kernel reads out of bounds (and can crash) unless K % 32 == 0 and N % 16 == 0; the models'
    # shapes all qualify, other shapes take the plain matmul
    N, K = weight.shape
    if (
        x.device.type == "cpu"
        and hasattr(torch, "_weight_int8pack_mm")
        and x.dtype == torch.bfloat16
        and K % 32 == 0
        and N % 16 == 0
        and weight.is_contiguous()
    ):
        x2 = x.reshape(-1, x.shape[-1])
        if not x2.is_contiguous():
            x2 = x2.contiguous()
        y = torch._weight_int8pack_mm(x2, weight, scale.to(x.dtype)).view(*x.shape[:-1], weight.shape[0])
    else:
        y = linear_int8_ref(x, weight, scale)
    return y + bias if bias is not None else y


def linear_int8_ref(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Definition of `linear_int8`, in plain matmuls (the int8 values are exact in bf16/fp16/fp32)."""
    return (F.linear(x.float(), weight.float()) * scale.float()).to(x.dtype)


def pack_int4(q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, dtype: torch.dtype = torch.bfloat16):
    """4-bit weights in groups along K -> the (packed, scales_zeros) pair `linear_int4` takes.

    q [N, K] integers 0..15, scale / zero [N, K // g]: w[n, k] = (q[n, k] - 8) * scale[n, k // g] + zero[n, k // g]
    (llama.cpp's Q4_0 and Q4_1 blocks are exactly this with g = 32). scales_zeros is [K // g, N, 2] in
    `dtype`, the activation dtype. On the CPU with bf16 activations q is packed for ATen's int4 GEMM
    ([N, K / 2] bytes); otherwise it stays one uint8 per weight ([N, K]).
    """
    sz = torch.stack([scale.t(), zero.t()], dim=-1).to(dtype).contiguous()
    if q.device.type == "cpu" and dtype == torch.bfloat16 and hasattr(torch, "_convert_weight_to_int4pack_for_cpu"):
        return torch._convert_weight_to_int4pack_for_cpu(q.to(torch.int32).contiguous(), 2), sz
    return q.to(torch.uint8).contiguous(), sz


def linear_int4(x: torch.Tensor, packed: torch.Tensor, scales_zeros: torch.Tensor) -> torch.Tensor:
    """Weight-only 4-bit linear: x [..., K] @ W.T with W from `pack_int4` -> [..., N] in x's dtype."""
    K = x.shape[-1]
    if packed.shape[-1] != K:  # ATen's packed CPU layout: two weights per byte
        g = K // scales_zeros.shape[0]
        x2 = x.reshape(-1, K)
        y = torch._weight_int4pack_mm_for_cpu(x2 if x2.is_contiguous() else x2.contiguous(), packed, g, scales_zeros)
        return y.view(*x.shape[:-1], packed.shape[0])
    return linear_int4_ref(x, packed, scales_zeros)


def linear_int4_ref(x: torch.Tensor, q: torch.Tensor, scales_zeros: torch.Tensor) -> torch.Tensor:
    """Definition of `linear_int4` on unpacked q [N, K] (dequantize, then a plain matmul)."""
    N, K = q.shape
    G = scales_zeros.shape[0]
    s, z = scales_zeros[..., 0].t().float(), scales_zeros[..., 1].t().float()  # [N, G]
    w = (q.float().view(N, G, K // G) - 8) * s[..., None] + z[..., None]
    return F.linear(x, w.view(N, K).to(x.dtype))


def int4_from_zero_points(q: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor):
    """AWQ / GPTQ-style groups -> `pack_int4`'s (q, scale, zero): w = (q - zero_point) * scale per group, with
    integer zero points 0..15 -> zero = (8 - zero_point) * scale (exact in float32 for float16 scales, so the
    dequantized values are the same numbers)."""
    return q, scale.float(), (8 - zero_point.float()) * scale.float()


def dequantize_int4(q: torch.Tensor, scales_zeros: torch.Tensor) -> torch.Tensor:
    """q [N, K] (0..15) and `pack_int4`'s scales_zeros [K / G, N, 2] -> W [N, K] float32, (q - 8) * s + z."""
    N, K = q.shape
    G = scales_zeros.shape[0]
    s, z = scales_zeros[..., 0].t().float(), scales_zeros[..., 1].t().float()  # [N, G]
    return ((q.float().view(N, G, K // G) - 8) * s[..., None] + z[..., None]).view(N, K)


def quantize_fp8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float [N, K] -> (E4M3 weights [N, K] float8_e4m3fn, float32 scale [N]) with scale = absmax(row) / 448
    (a zero row keeps scale 1), rounding to nearest even."""
    w = w.float()
    scale = w.abs().amax(dim=1)
    scale = torch.where(scale > 0, scale / FP8_MAX, torch.ones_like(scale))
    return (w / scale[:, None]).clamp_(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn), scale


FP8_MAX = 448.0


def linear_fp8(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, act_fp8: bool | None = None) -> torch.Tensor:
    """FP8 linear: x [..., K] @ (weight [N, K] float8_e4m3fn * scale [N]).T -> [..., N] in x's dtype. act_fp8:
    x is rounded to E4M3 per row first (scale absmax(row) / 448), as the W8A8 kernel does; None means False
    here (the reference has no fp8 tensor cores). Computed in float32 and rounded once to x's dtype, as the
    kernel's epilogue does."""
    if act_fp8:
        xf = x.float()
        amax = xf.abs().amax(-1, keepdim=True)
        xs = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
        xq = (xf / xs).to(torch.float8_e4m3fn).float()
        return (F.linear(xq, weight.float()) * scale.float() * xs).to(x.dtype)
    return (F.linear(x.float(), weight.float()) * scale.float()).to(x.dtype)


def conv1d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    padding: int = 0,
    dilation: int = 1,
    groups: int = 1,
    pre_slope: float | None = None,
) -> torch.Tensor:
    """1-D convolution, stride 1. x [B, Cin, T], weight [Cout, Cin/groups, K] -> [B, Cout, T'].

    `pre_slope` applies leaky_relu(x, pre_slope) first (HiFi-GAN's activation before every conv; a fused
    kernel reads x once).
    """
    if pre_slope is not None:
        x = F.leaky_relu(x, pre_slope)
    return F.conv1d(x, weight, bias, 1, padding, dilation, groups)


def conv_transpose1d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    stride: int,
    padding: int,
    pre_slope: float | None = None,
) -> torch.Tensor:
    """Transposed 1-D convolution (upsampling). x [B, Cin, T], weight [Cin, Cout, K] -> [B, Cout, T']
    with T' = (T - 1) * stride - 2 * padding + K. `pre_slope` as in conv1d."""
    if pre_slope is not None:
        x = F.leaky_relu(x, pre_slope)
    return F.conv_transpose1d(x, weight, bias, stride, padding)


def relative_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    emb_rel_k: torch.Tensor,
    emb_rel_v: torch.Tensor,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
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


# Fused ops of the Llama-family decode step (kernels/triton_fused.py), defined by the ops above. Rows are the
# decode step's sequences: x [M, dim], one token each.


def norm_qkv_rope(
    x, norm_w, eps, wqkv, n_heads, cos, sin, pos, k_cache, v_cache, s0=0, bias=None, q_norm=None, k_norm=None
):
    """RMSNorm of x [M, dim] -> x @ wqkv.T ([(H + 2 Hkv) * D, dim], + bias) -> per-head RMSNorm of q and k
    (q_norm / k_norm [D], Qwen3) -> rotary at pos [M] (cos / sin [positions, D/2] tables) -> the keys and
    values written to k_cache / v_cache [slots, Hkv, S, D] at (slot s0 + i, position pos[i]). Returns the
    rotated queries [M, H, D]."""
    M = x.shape[0]
    Hkv, D = k_cache.shape[1], k_cache.shape[3]
    qkv = linear(rms_norm(x, norm_w, eps), wqkv)
    if bias is not None:
        qkv = qkv + bias
    q, k, v = qkv.split([n_heads * D, Hkv * D, Hkv * D], dim=-1)
    q, k, v = q.view(M, n_heads, D), k.reshape(M, Hkv, D), v.reshape(M, Hkv, D)
    if q_norm is not None:
        q, k = rms_norm(q, q_norm, eps), rms_norm(k, k_norm, eps)
    c, s = cos[pos][:, None, None], sin[pos][:, None, None]  # [M, 1, 1, D/2]
    q, k = rotary(q[:, :, None], k[:, :, None], c, s)
    rows = torch.arange(s0, s0 + M, device=x.device)
    k_cache[rows, :, pos] = k[:, :, 0]
    v_cache[rows, :, pos] = v
    return q[:, :, 0].contiguous()


def linear_residual(
    x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """residual + (x @ weight.T + bias) (the product in x's dtype first): an output or down projection closing a
    residual branch."""
    return linear(x, weight, bias) + residual


def norm_gate_up(x: torch.Tensor, norm_w: torch.Tensor, eps: float, w_gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up of RMSNorm(x) @ w_gate_up.T, w_gate_up [2 * hidden, dim] (gate rows, then up rows)."""
    return silu_mul(*linear(rms_norm(x, norm_w, eps), w_gate_up).chunk(2, dim=-1))


def norm_logits(x: torch.Tensor, norm_w: torch.Tensor, eps: float, w: torch.Tensor) -> torch.Tensor:
    """The last of a Llama decode step: RMSNorm(x) @ w.T (the output projection, in x's dtype), as float32."""
    return linear(rms_norm(x, norm_w, eps), w).float()


def token_inputs(tokens: torch.Tensor, tok_emb: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A Llama decode step's inputs from tokens [N] at positions pos [N]: the residual stream tok_emb[tokens] [N, d]
    and each row's key count pos + 1 as int32 [N] (what the decode attention reads)."""
    return F.embedding(tokens, tok_emb), (pos + 1).to(torch.int32)


FUSED_OPS = {
    "token_inputs": token_inputs,
    "norm_qkv_rope": norm_qkv_rope,
    "linear_residual": linear_residual,
    "norm_gate_up": norm_gate_up,
    "norm_logits": norm_logits,
}


# Fused ops of the Whisper decoder step (kernels/triton_fused_whisper.py): each LayerNorm folded into the projection
# that reads it. Rows are the step's sequences: x [M, d], one token each.


def norm_linear(x, ln_w, ln_b, eps, weight, bias=None, act=None, out_dtype=None):
    """LayerNorm(x [M, d]) (weight ln_w, bias ln_b) @ weight.T + bias -> [M, N]; with act="gelu", the GELU of it (the
    MLP's fc1, its bias folded into the activation as models.whisper.MLP does). In x's dtype, then `out_dtype` (the
    logits: float32)."""
    h = layer_norm(x, ln_w, ln_b, eps)
    if act not in (None, "gelu"):
        raise ValueError(f"norm_linear: act is None or 'gelu', not {act!r}")
    y = gelu(linear(h, weight), bias) if act == "gelu" else linear(h, weight, bias)
    return y.to(out_dtype) if out_dtype is not None else y


def norm_qkv_cache(x, ln_w, ln_b, eps, wqkv, bqkv, pos, k_cache, v_cache):
    """LayerNorm(x [M, d]) @ wqkv.T + bqkv (wqkv [3 H D, d]: Q, K, V rows) -> the keys and values written to
    k_cache / v_cache [M, H, S, D] at (row i, position pos[i]) (pos [M]). Returns the queries [M, H, D]."""
    M = x.shape[0]
    H, D = k_cache.shape[1], k_cache.shape[3]
    q, k, v = linear(layer_norm(x, ln_w, ln_b, eps), wqkv, bqkv).view(M, 3, H, D).unbind(1)
    rows = torch.arange(M, device=x.device)
    k_cache[rows, :, pos] = k
    v_cache[rows, :, pos] = v
    return q.contiguous()


def step_inputs(tokens, tok_emb, pos_emb, position, cross_lengths=None):
    """The decode step's inputs from tokens [B] at position (int64 [1]): the residual stream tok_emb[tokens] +
    pos_emb[position] [B, d], each row's self-attention key count position + 1 and its encoder length
    (cross_lengths [B], or None) as int32 [B] (what the decode attention reads)."""
    s = F.embedding(tokens, tok_emb) + pos_emb.index_select(0, position)
    lengths = (position + 1).to(torch.int32).expand(tokens.shape[0]).contiguous()
    return s, lengths, cross_lengths.to(torch.int32) if cross_lengths is not None else None


WHISPER_FUSED_OPS = {
    "norm_qkv_cache": norm_qkv_cache,
    "norm_linear": norm_linear,
    "linear_residual": linear_residual,
    "step_inputs": step_inputs,
    "whisper_pick": whisper_pick,
}


OPS = {
    "layer_norm": layer_norm,
    "rms_norm": rms_norm,
    "gelu": gelu,
    "silu_mul": silu_mul,
    "gelu_tanh_mul": gelu_tanh_mul,
    "linear": linear,
    "rotary": rotary,
    "attention": attention,
    "linear_int8": linear_int8,
    "pack_int4": pack_int4,
    "linear_int4": linear_int4,
    "linear_fp8": linear_fp8,
}

# Ops only the VITS model uses. Their fast path on a GPU is the vendor convolution library (cuDNN, MIOpen;
# oneDNN on the CPU), not a Triton kernel, so they are kept out of OPS (a 'triton' kernel set stays all
# Triton); models.vits.with_vits_ops() adds them to whatever kernel set the model is built with.
VITS_OPS = {
    "conv1d": conv1d,
    "conv_transpose1d": conv_transpose1d,
    "relative_attention": relative_attention,
}


def block_linear(
    x: torch.Tensor, q: torch.Tensor, d: torch.Tensor, z: torch.Tensor | None = None, fine: bool = False
) -> torch.Tensor:
    """Definition of the CPU decode step's matmul (kernels/cpu_decode): x [M, K] @ W.T -> [M, N] float64.

    W is block-quantized along K in blocks of 32: w = d * (q - 8) + z (4-bit, q in 0..15) or w = d * q
    (8-bit, z None); q [N, K], d / z [N, K / 32]. x is quantized the way the kernel does it, per block of 32
    in float32: scale max|x| / 127, values round(x * 127 / max|x|) (half to even), which meet q - 8 (or q);
    with `fine`, what that leaves of x is quantized the same way and meets the weights too (x in two int8
    terms). The offsets' term takes x's exact block sums. A block holding a NaN or inf gives NaN.
    """
    M, K = x.shape
    N, nb = q.shape[0], K // 32
    xb = x.float().reshape(M, nb, 32)
    wq = q.double().reshape(N, nb, 32) - (8 if z is not None else 0)

    def quantize(b):
        amax = b.abs().amax(-1)
        bad = ~torch.isfinite(b).all(-1)
        inv = torch.where((amax > 0) & ~bad, 127 / amax, torch.zeros_like(amax))
        bq = torch.round(torch.nan_to_num(b) * inv[..., None])  # [M, nb, 32]
        return bq, torch.where(bad, torch.full_like(amax, float("nan")), amax / 127)

    xq, xd = quantize(xb)
    y = (torch.einsum("mbj,nbj->mnb", xq.double(), wq) * d.double()[None] * xd.double()[:, None]).sum(-1)
    if fine:
        rq, rd = quantize(xb - xd[..., None] * xq)
        y = y + (torch.einsum("mbj,nbj->mnb", rq.double(), wq) * d.double()[None] * rd.double()[:, None]).sum(-1)
    if z is not None:
        y = y + (z.double()[None] * xb.double().sum(-1)[:, None]).sum(-1)
    return y
