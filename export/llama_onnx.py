"""Llama-family decoder (models/llama.py) -> one ONNX graph for prefill and decode, written op by op.

variant 'ort' (ONNX Runtime's fast path): per layer SkipSimplifiedLayerNormalization (residual add + RMSNorm),
MatMulNBits (4/8-bit block weights, int8 activations at accuracy level 4), GroupQueryAttention with the
rotary embedding inside it over the slot-addressed KV cache, QuickGelu(alpha=1) = SiLU. The cache inputs
`past_key.i` [B, Hkv, S + 1, D] are bound to the same buffers as the outputs `present_key.i`: ORT writes the
new keys in place at each row's position (`seqlens_k` [B] = length after the step - 1). Position S is a
scratch column for rows that only fill a gap in a contiguous range of slots (see backends/onnxruntime/lm.py).

variant 'standard' (plain ONNX ops, for TensorRT and any runtime): RMSNorm, rotary and attention written
out; the caller passes the past keys [B, Hkv, P, D], position ids [B, T] and an additive attention bias
[B, 1, T, P + T]; the graph returns the keys with the new ones appended [B, Hkv, P + T, D].

Weights: a GGUF's Q4_0 / Q4_1 blocks are kept exactly. MatMulNBits computes w = (q - 8) * scale (its
default zero point); ONNX Runtime's float zero points, which Q4_1's minimum needs, run ~30x slower on
the CPU, so the minimum is added as a correction instead: y += (sums of x over each 32-block) @ zero^T,
where zero = m + 8 * scale (`models.gguf_loader`). The tied head is 8-bit per 32-block (a Q8_0 embedding
is reproduced exactly: its scale is the block's max / 127).
"""

from __future__ import annotations

import numpy as np
import torch

from speechrt.models.llama import LlamaConfig, quantize_int4, rope_inv_freq

from .graph_builder import MS, GraphBuilder
from .manifest import Tensor

BLOCK = 32
VARIANTS = ("ort", "standard")
PRECISIONS = {"ort": ("int4", "int8", "fp32", "fp16"), "standard": ("fp32", "fp16", "int8")}


def io(cfg: LlamaConfig, variant: str, cache_dtype: str) -> tuple[list[Tensor], list[Tensor]]:
    """The graph's inputs and outputs: the names the runners bind."""
    kv = ("batch", cfg.n_kv_heads, "cache", cfg.head_dim)
    ins = [Tensor("input_ids", "int64", ("batch", "tokens"))]
    if variant == "ort":
        ins += [Tensor("seqlens_k", "int32", ("batch",)), Tensor("total_sequence_length", "int32", ())]
        present = kv
    else:
        ins += [
            Tensor("position_ids", "int64", ("batch", "tokens")),
            Tensor("attention_bias", cache_dtype, ("batch", 1, "tokens", "total")),
        ]
        kv = ("batch", cfg.n_kv_heads, "past", cfg.head_dim)
        present = ("batch", cfg.n_kv_heads, "total", cfg.head_dim)
    outs = [Tensor("logits", "float32", ("batch", cfg.vocab_size))]
    for i in range(cfg.n_layers):
        ins += [Tensor(f"past_key.{i}", cache_dtype, kv), Tensor(f"past_value.{i}", cache_dtype, kv)]
        outs += [Tensor(f"present_key.{i}", cache_dtype, present), Tensor(f"present_value.{i}", cache_dtype, present)]
    return ins, outs


def _pack4(q: np.ndarray) -> np.ndarray:
    """q [N, K] in 0..15 -> MatMulNBits' B [N, K/32, 16]: weight 2j in the low nibble of byte j."""
    N, K = q.shape
    q = q.reshape(N, K // BLOCK, BLOCK // 2, 2).astype(np.uint8)
    return q[..., 0] | (q[..., 1] << 4)


def int8_blocks(w: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """float [N, K] -> (uint8 q [N, K/32, 32] with zero point 128, scale [N, K/32]), symmetric per block."""
    N, K = w.shape
    g = w.float().reshape(N, K // BLOCK, BLOCK)
    scale = (g.abs().amax(-1) / 127).clamp_min(1e-12)
    q = torch.round(g / scale[..., None]).clamp_(-127, 127) + 128
    return q.to(torch.uint8).numpy(), scale.numpy()


class LlamaGraph:
    """Builds the graph for one (config, weights, precision, variant)."""

    def __init__(
        self,
        cfg: LlamaConfig,
        weights: dict,
        q4: dict,
        precision: str,
        variant: str,
        progress=None,
        rows: bool = False,
        activations: str = "float32",
    ):
        """rows: the prompts' graph of a block-quantized export: the file's weights in float32 (a Q4 file's blocks
        dequantized: exact) in plain MatMuls, and the tied head on the embedding matrix. MatMulNBits costs in
        proportion to the rows at int8 activations (accuracy level 4) and dequantizes every weight on every call at
        float32 ones (level 1). SmolLM2-135M, AMD EPYC AVX2, 2 threads, a 35-token prompt: 141 ms here, 183 ms at
        level 4, 340 ms at level 1 (a fixed ~0.2 s). (int8 weights per channel in DynamicQuantizeMatMul were
        ~10 % faster but changed the answers: one activation scale per call is too coarse for this model's
        outlier features, and int8 x uint8 pair sums saturate on AVX2 without VNNI.)
        activations: float16 runs an int4 / int8 graph's activations, norms, rotary tables and cache in float16
        (GPU execution providers: their GroupQueryAttention has no float32 kernel)."""
        if variant not in VARIANTS:
            raise ValueError(f"unknown Llama graph variant {variant!r}; valid: {', '.join(VARIANTS)}")
        if precision not in PRECISIONS[variant]:
            raise ValueError(
                f"precision {precision!r} is not available for the {variant} graph; valid: "
                f"{', '.join(PRECISIONS[variant])}"
            )
        for n in ("dim", "hidden_dim"):
            if getattr(cfg, n) % BLOCK:
                raise ValueError(f"{n} = {getattr(cfg, n)} is not a multiple of {BLOCK}: no block-quantized graph")
        self.cfg, self.w, self.q4, self.precision, self.variant = cfg, weights, q4, precision, variant
        self.fdt = np.float16 if precision == "fp16" or activations == "float16" else np.float32
        self.g = GraphBuilder("llama")
        self.progress = progress
        self.rows = rows and variant == "ort" and precision in ("int4", "int8")
        self.requantized: list[str] = []  # linear weights without 4-bit blocks in the file (int4 only)

    # -- weights ---------------------------------------------------------------------------------------------
    def _blocks(self, names: list[str]):
        """(q, scale, zero) of fused weights `names`: the file's blocks, or min/max 4-bit quantization."""
        if all(n in self.q4 for n in names):
            return tuple(torch.cat([self.q4[n][i] for n in names]) for i in range(3))
        self.requantized += names
        return quantize_int4(torch.cat([self.w[n] for n in names]))

    def linear(self, x: str, names: list[str], tag: str) -> str:
        """x [..., K] @ W.T for the fused weights `names` ([N, K] each) in this graph's precision."""
        g, p = self.g, self.precision
        w = torch.cat([self.w[n] for n in names]) if p != "int4" or self.rows else None
        if p in ("fp32", "fp16") or self.rows:
            return g.op("MatMul", [x, g.init(f"{tag}.weight", w.T.numpy().astype(self.fdt))], name=tag)
        if p == "int8":
            if self.variant == "standard":  # weight-only int8 with per-row scales, dequantized in the graph
                return self._dq_linear(x, w, tag)
            q, s = int8_blocks(w)
            return self._nbits(x, q, s, 8, tag, zero_points=np.full(s.shape, 128, np.uint8))
        q, s, z = self._blocks(names)
        y = self._nbits(x, _pack4(q.numpy()), s.numpy(), 4, tag)
        if not torch.any(z != 0):  # Q4_0: nothing to add
            return y
        # the sums of x over each 32-block, [..., K/32]: a reshape and a reduction, no weights to read
        blocks = g.op("Reshape", [x, g.const_i64("block_shape", [0, 0, -1, BLOCK])], name=f"{tag}/blocks")
        sums = g.op("ReduceSum", [blocks, g.const_i64("axes_last", [-1])], name=f"{tag}/block_sums", keepdims=0)
        corr = g.op("MatMul", [sums, g.init(f"{tag}.zero", z.T.numpy().astype(self.fdt))], name=f"{tag}/zero")
        return g.op("Add", [y, corr], name=f"{tag}/add_zero")

    def _nbits(self, x, q, scale, bits, tag, zero_points=None):
        g = self.g
        N, nb = scale.shape
        ins = [
            x,
            g.init(f"{tag}.qweight", q.reshape(N, nb, -1)),
            g.init(f"{tag}.scales", scale.reshape(-1).astype(self.fdt)),
        ]
        if zero_points is not None:
            ins.append(g.init(f"{tag}.zero_points", zero_points.reshape(-1)))
        return g.op(
            "MatMulNBits", ins, name=tag, domain=MS, K=nb * BLOCK, N=N, bits=bits, block_size=BLOCK, accuracy_level=4
        )

    def _dq_linear(self, x, w, tag):
        g = self.g
        scale = (w.abs().amax(1) / 127).clamp_min(1e-12)  # per output channel
        q = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)
        wt = g.op(
            "DequantizeLinear",
            [
                g.init(f"{tag}.qweight", q.T.contiguous().numpy()),
                g.init(f"{tag}.scale", scale.numpy().astype(self.fdt)),
            ],
            name=f"{tag}/dq",
            axis=1,
        )
        return g.op("MatMul", [x, wt], name=tag)

    # -- graph -----------------------------------------------------------------------------------------------
    def build(self, opset: int):
        cfg, g = self.cfg, self.g
        cache_dtype = "float16" if self.fdt == np.float16 else "float32"
        ins, outs = io(cfg, self.variant, cache_dtype)
        emb = g.init("embed_tokens", self.w["tok_embeddings"].numpy().astype(self.fdt))
        h = g.op("Gather", [emb, "input_ids"], name="embed")
        if self.variant == "ort":
            self._rope_cache(cfg.max_seq_len + 1)
            h, res = self._ort_layers(h)
        else:
            self._rope_cache(cfg.max_seq_len)
            h, res = self._standard_layers(h)
        self._head(h, res)
        return g.model(ins, outs, opset)

    def _rope_cache(self, n: int):
        t = torch.arange(n, dtype=torch.float64)[:, None] * rope_inv_freq(self.cfg)[None]  # [n, D/2]
        self.g.init("cos_cache", t.cos().numpy().astype(self.fdt))
        self.g.init("sin_cache", t.sin().numpy().astype(self.fdt))

    def _norm_weight(self, name):
        return self.g.init(name, self.w[name].numpy().astype(self.fdt))

    def _mlp(self, x, i):
        g, hd = self.g, self.cfg.hidden_dim
        gu = self.linear(x, [f"layers.{i}.w_gate", f"layers.{i}.w_up"], f"layers.{i}.w_gate_up")
        gate, up = g.op(
            "Split", [gu, g.const_i64(f"layers.{i}.split", [hd, hd])], n_out=2, name=f"layers.{i}/split", axis=-1
        )
        if self.variant == "ort":
            act = g.op("QuickGelu", [gate], name=f"layers.{i}/silu", domain=MS, alpha=1.0)
        else:
            act = g.op("Mul", [gate, g.op("Sigmoid", [gate], name=f"layers.{i}/sigmoid")], name=f"layers.{i}/silu")
        return self.linear(
            g.op("Mul", [act, up], name=f"layers.{i}/gate_mul"), [f"layers.{i}.w_down"], f"layers.{i}.w_down"
        )

    def _ort_layers(self, h):
        cfg, g = self.cfg, self.g
        res = None
        for i in range(cfg.n_layers):
            an = self._norm_weight(f"layers.{i}.attn_norm")
            if res is None:
                x, res = (
                    g.op(
                        "SimplifiedLayerNormalization",
                        [h, an],
                        name=f"layers.{i}/attn_norm",
                        epsilon=cfg.norm_eps,
                        axis=-1,
                    ),
                    h,
                )
            else:
                x, _, _, res = g.op(
                    "SkipSimplifiedLayerNormalization",
                    [h, res, an],
                    n_out=4,
                    name=f"layers.{i}/attn_norm",
                    domain=MS,
                    epsilon=cfg.norm_eps,
                )
            qkv = self.linear(x, [f"layers.{i}.wq", f"layers.{i}.wk", f"layers.{i}.wv"], f"layers.{i}.wqkv")
            a = g.op(
                "GroupQueryAttention",
                [
                    qkv,
                    "",
                    "",
                    f"past_key.{i}",
                    f"past_value.{i}",
                    "seqlens_k",
                    "total_sequence_length",
                    "cos_cache",
                    "sin_cache",
                ],
                outputs=[f"layers.{i}/attn", f"present_key.{i}", f"present_value.{i}"],
                name=f"layers.{i}/gqa",
                domain=MS,
                num_heads=cfg.n_heads,
                kv_num_heads=cfg.n_kv_heads,
                do_rotary=1,
                rotary_interleaved=0,
            )
            o = self.linear(a, [f"layers.{i}.wo"], f"layers.{i}.wo")
            x, _, _, res = g.op(
                "SkipSimplifiedLayerNormalization",
                [o, res, self._norm_weight(f"layers.{i}.ffn_norm")],
                n_out=4,
                name=f"layers.{i}/ffn_norm",
                domain=MS,
                epsilon=cfg.norm_eps,
            )
            h = self._mlp(x, i)
            if self.progress:
                self.progress(1)
        return h, res

    def _rms(self, x, weight, tag):
        g = self.g
        eps = g.init(f"{tag}.eps", np.array(self.cfg.norm_eps, self.fdt))
        ms = g.op("ReduceMean", [g.op("Mul", [x, x], name=f"{tag}/sq")], name=f"{tag}/mean", axes=[-1], keepdims=1)
        inv = g.op(
            "Reciprocal",
            [g.op("Sqrt", [g.op("Add", [ms, eps], name=f"{tag}/eps")], name=f"{tag}/sqrt")],
            name=f"{tag}/inv",
        )
        return g.op("Mul", [g.op("Mul", [x, inv], name=f"{tag}/scale"), weight], name=tag)

    def _rotary(self, x, cos, sin, tag):
        """x [B, n, T, D] rotated by cos/sin [B, 1, T, D/2] (half-split pairs, as models/llama.py)."""
        g, D = self.g, self.cfg.head_dim
        x1, x2 = g.op(
            "Split", [x, g.const_i64(f"{tag}.split", [D // 2, D // 2])], n_out=2, name=f"{tag}/split", axis=-1
        )
        a = g.op(
            "Sub", [g.op("Mul", [x1, cos], name=f"{tag}/m1"), g.op("Mul", [x2, sin], name=f"{tag}/m2")], name=f"{tag}/a"
        )
        b = g.op(
            "Add", [g.op("Mul", [x2, cos], name=f"{tag}/m3"), g.op("Mul", [x1, sin], name=f"{tag}/m4")], name=f"{tag}/b"
        )
        return g.op("Concat", [a, b], name=tag, axis=-1)

    def _standard_layers(self, h):
        cfg, g = self.cfg, self.g
        H, Hkv, D = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        shape_q = g.const_i64("shape_q", [0, 0, H, D])
        shape_kv = g.const_i64("shape_kv", [0, 0, Hkv, D])
        shape_grp = g.const_i64("shape_grp", [0, Hkv, H // Hkv, -1, D])  # [B, Hkv, G, T, D]
        shape_out = g.const_i64("shape_out", [0, 0, H * D])
        unsq = g.const_i64("axes_1", [1])
        unsq2 = g.const_i64("axes_2", [2])
        cos = g.op(
            "Unsqueeze", [g.op("Gather", ["cos_cache", "position_ids"], name="rope/cos"), unsq], name="rope/cos4"
        )
        sin = g.op(
            "Unsqueeze", [g.op("Gather", ["sin_cache", "position_ids"], name="rope/sin"), unsq], name="rope/sin4"
        )
        bias = g.op("Unsqueeze", ["attention_bias", unsq2], name="attn/bias5")  # [B, 1, 1, T, S]
        scale = g.init("attn.scale", np.array(1.0 / np.sqrt(D), self.fdt))
        res = None
        for i in range(cfg.n_layers):
            t = f"layers.{i}"
            res = h if res is None else g.op("Add", [h, res], name=f"{t}/res_attn")
            x = self._rms(res, self._norm_weight(f"{t}.attn_norm"), f"{t}/attn_norm")
            qkv = self.linear(x, [f"{t}.wq", f"{t}.wk", f"{t}.wv"], f"{t}.wqkv")
            q, k, v = g.op(
                "Split",
                [qkv, g.const_i64(f"{t}.qkv_split", [H * D, Hkv * D, Hkv * D])],
                n_out=3,
                name=f"{t}/qkv_split",
                axis=-1,
            )
            q = g.op("Transpose", [g.op("Reshape", [q, shape_q], name=f"{t}/q4")], name=f"{t}/qT", perm=[0, 2, 1, 3])
            k = g.op("Transpose", [g.op("Reshape", [k, shape_kv], name=f"{t}/k4")], name=f"{t}/kT", perm=[0, 2, 1, 3])
            v = g.op("Transpose", [g.op("Reshape", [v, shape_kv], name=f"{t}/v4")], name=f"{t}/vT", perm=[0, 2, 1, 3])
            q, k = self._rotary(q, cos, sin, f"{t}/rope_q"), self._rotary(k, cos, sin, f"{t}/rope_k")
            kall = g.op("Concat", [f"past_key.{i}", k], outputs=[f"present_key.{i}"], name=f"{t}/kcat", axis=2)
            vall = g.op("Concat", [f"past_value.{i}", v], outputs=[f"present_value.{i}"], name=f"{t}/vcat", axis=2)
            qg = g.op("Reshape", [q, shape_grp], name=f"{t}/qgrp")  # [B, Hkv, G, T, D]
            kt = g.op(
                "Unsqueeze", [g.op("Transpose", [kall], name=f"{t}/kTT", perm=[0, 1, 3, 2]), unsq2], name=f"{t}/k5"
            )
            s = g.op(
                "Add",
                [g.op("Mul", [g.op("MatMul", [qg, kt], name=f"{t}/qk"), scale], name=f"{t}/scaled"), bias],
                name=f"{t}/masked",
            )
            p = g.op("Softmax", [s], name=f"{t}/softmax", axis=-1)
            o = g.op("MatMul", [p, g.op("Unsqueeze", [vall, unsq2], name=f"{t}/v5")], name=f"{t}/pv")  # [B,Hkv,G,T,D]
            o = g.op(
                "Reshape",
                [
                    g.op(
                        "Transpose",
                        [g.op("Reshape", [o, g.const_i64(f"{t}.shape_h", [0, H, -1, D])], name=f"{t}/o4")],
                        name=f"{t}/oT",
                        perm=[0, 2, 1, 3],
                    ),
                    shape_out,
                ],
                name=f"{t}/o3",
            )
            res = g.op("Add", [self.linear(o, [f"{t}.wo"], f"{t}.wo"), res], name=f"{t}/res_mlp")
            x = self._rms(res, self._norm_weight(f"{t}.ffn_norm"), f"{t}/ffn_norm")
            h = self._mlp(x, i)
            if self.progress:
                self.progress(1)
        return h, res

    def _head(self, h, res):
        """Last position only: final norm, then the (tied) output head -> logits [B, V] float32."""
        cfg, g = self.cfg, self.g
        last = [g.const_i64("last.start", [-1]), g.const_i64("last.end", [1 << 62]), g.const_i64("last.axis", [1])]
        h = g.op("Slice", [h] + last, name="last/h")
        res = g.op("Slice", [res] + last, name="last/res")
        norm = self._norm_weight("norm")
        if self.variant == "ort":
            x, _, _, _ = g.op(
                "SkipSimplifiedLayerNormalization",
                [h, res, norm],
                n_out=4,
                name="final_norm",
                domain=MS,
                epsilon=cfg.norm_eps,
            )
        else:
            x = self._rms(g.op("Add", [h, res], name="final_res"), norm, "final_norm")
        x = g.op("Squeeze", [x, g.const_i64("axes_seq", [1])], name="last/squeeze")  # [B, dim]
        head = "tok_embeddings" if cfg.tie_embeddings else "output"
        if (self.precision in ("fp32", "fp16") or self.rows) and cfg.tie_embeddings:  # the embedding matrix: x @ E^T
            y = g.op("Gemm", [x, "embed_tokens"], name="lm_head", transB=1)
        elif self.precision in ("fp32", "fp16") or self.variant == "standard":
            y = self.linear(x, [head], "lm_head")
        else:
            q, s = int8_blocks(self.w[head])
            y = self._nbits(x, q, s, 8, "lm_head", zero_points=np.full(s.shape, 128, np.uint8))
        if self.fdt == np.float16:
            y = g.op("Cast", [y], name="logits_fp32", to=1)
        g.op("Identity", [y], outputs=["logits"], name="logits")


ROWS_NOTE = "; prefill.onnx (prompts): the file's weights in float32"


def weights_note(graph: LlamaGraph, tensor_types: dict) -> str:
    types = ", ".join(f"{k} x{v}" for k, v in sorted(tensor_types.items()))
    p = graph.precision
    rows = ROWS_NOTE if graph.variant == "ort" else ""
    if graph.fdt == np.float16 and p in ("int4", "int8"):
        rows = rows.replace("float32", "float16") + "; float16 activations and cache"
    if p == "int4":
        kept = "4-bit blocks kept exactly (MatMulNBits, zero = m + 8*d added as a block-sum correction)"
        re = (
            f"; re-quantized to 4 bits by min/max per 32-block: {len(graph.requantized)} weights"
            if graph.requantized
            else ""
        )
        return f"file tensors: {types}; {kept}{re}; head 8-bit per 32-block (Q8_0 exact){rows}"
    if p == "int8":
        return f"file tensors: {types}; dequantized, re-quantized to 8 bits per 32-block (symmetric){rows}"
    return f"file tensors: {types}; dequantized to {p}"
