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
is reproduced exactly: its scale is the block's max / 127), and so is the embedding (GatherBlockQuantized). The
prompts' graph of such an export dequantizes the same blocks to float matrices when ONNX Runtime loads it, and
both graphs keep their weights in one file, each block once (graph_builder.save_shared): an export about the
size of the GGUF (SmolLM2-135M Q4_1: 98 MB -> 115 MB; float32 copies in the graph files made it 768 MB).
"""

from __future__ import annotations

import numpy as np
import torch

from speechrt.models.llama import LlamaConfig, rope_inv_freq

from .graph_builder import MS, GraphBuilder
from .llama_ort import ort_layers
from .llama_standard import gelu_tanh, rms, standard_layers
from .llama_weights import BLOCK, LinearWeights, int8_blocks
from .manifest import Tensor

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
        if cfg.sliding_layers:  # what the sliding-window layers see: the same, less the keys before each window
            ins.append(Tensor("attention_bias_local", cache_dtype, ("batch", 1, "tokens", "total")))
        kv = ("batch", cfg.n_kv_heads, "past", cfg.head_dim)
        present = ("batch", cfg.n_kv_heads, "total", cfg.head_dim)
    outs = [Tensor("logits", "float32", ("batch", cfg.vocab_size))]
    for i in range(cfg.n_layers):
        ins += [Tensor(f"past_key.{i}", cache_dtype, kv), Tensor(f"past_value.{i}", cache_dtype, kv)]
        outs += [Tensor(f"present_key.{i}", cache_dtype, present), Tensor(f"present_value.{i}", cache_dtype, present)]
    return ins, outs


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
        """rows: the prompts' graph of a block-quantized export: the decode graph's blocks (the same bytes on disk)
        dequantized to float32 matrices as ONNX Runtime loads the graph (LinearWeights.dequantize), in plain
        matmuls, and the tied head on the embedding matrix. MatMulNBits costs in
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
        self.blocks = variant == "ort" and precision in ("int4", "int8")  # block-quantized: MatMulNBits & co
        self.rows = rows and self.blocks
        self._int8_blocks: dict = {}
        self._float: dict = {}
        self.linears = LinearWeights(self.g, weights, q4, precision, variant, self.fdt, self.rows)

    def linear(self, x: str, names: list[str], tag: str) -> str:
        """x [..., K] @ W.T for the fused weights `names` in this graph's precision (LinearWeights.linear)."""
        return self.linears.linear(x, names, tag)

    # -- graph -----------------------------------------------------------------------------------------------
    def build(self, opset: int):
        cfg, g = self.cfg, self.g
        cache_dtype = "float16" if self.fdt == np.float16 else "float32"
        ins, outs = io(cfg, self.variant, cache_dtype)
        h = self._embed()
        if cfg.embed_scale != 1.0:  # Gemma: the embedding times sqrt(dim)
            scale = g.init("embed_scale", np.array(cfg.embed_scale, self.fdt))
            h = g.op("Mul", [h, scale], name="embed/scale")
        if self.variant == "ort":
            self._rope_cache(cfg.max_seq_len + 1)
            h, res = ort_layers(self, h)
        else:
            self._rope_cache(cfg.max_seq_len)
            h, res = standard_layers(self, h)
        self._head(h, res)
        return g.model(ins, outs, opset)

    def _embed(self) -> str:
        """The token embeddings of input_ids: rows of the float matrix, or, in a block-quantized ort graph, of its
        8-bit blocks (GatherBlockQuantized), which a tied head's MatMulNBits reads too (the same bytes on disk)."""
        g = self.g
        if not self.blocks:
            emb = g.init("embed_tokens", self.w["tok_embeddings"].numpy().astype(self.fdt))
            return g.op("Gather", [emb, "input_ids"], name="embed")
        if self.rows:  # the float matrix, which the head of the prompts' graph reads too
            return g.op("Gather", [self._dequantized("tok_embeddings"), "input_ids"], name="embed")
        q, s = self._int8("tok_embeddings")
        V, nb = s.shape
        ins = [
            g.init("embed_tokens.qweight", q.reshape(V, nb * BLOCK)),
            "input_ids",
            g.init("embed_tokens.scales", s.astype(self.fdt)),
            g.init("embed_tokens.zero_points", np.full(s.shape, 128, np.uint8)),
        ]
        return g.op(
            "GatherBlockQuantized",
            ins,
            name="embed",
            domain=MS,
            gather_axis=0,
            quantize_axis=1,
            block_size=BLOCK,
            bits=8,
        )

    def _dequantized(self, name: str) -> str:
        """Weight `name` in float, dequantized from its 8-bit blocks as the graph loads (LinearWeights.dequantize),
        once per graph."""
        if name not in self._float:
            q, s = self._int8(name)
            tag = "embed_tokens" if name == "tok_embeddings" else "lm_head"
            self._float[name] = self.linears.dequantize(q, s, 8, np.full(s.shape, 128, np.uint8), tag)
        return self._float[name]

    def _int8(self, name: str):
        """int8_blocks of weight `name`, made once (a tied embedding and head read the same)."""
        if name not in self._int8_blocks:
            self._int8_blocks[name] = int8_blocks(self.w[name])
        return self._int8_blocks[name]

    def _rope_cache(self, n: int):
        """cos_cache / sin_cache [n, D/2], and cos_cache_local / sin_cache_local for sliding-window layers with a
        rotary base of their own (Gemma 3; `rope(i)` names layer i's)."""
        local = self.cfg.local_rope()
        for suffix, cfg in (("", self.cfg), ("_local", local)) if local else (("", self.cfg),):
            t = torch.arange(n, dtype=torch.float64)[:, None] * rope_inv_freq(cfg)[None]  # [n, D/2]
            self.g.init(f"cos_cache{suffix}", t.cos().numpy().astype(self.fdt))
            self.g.init(f"sin_cache{suffix}", t.sin().numpy().astype(self.fdt))

    def rope(self, i: int) -> tuple[str, str]:
        """The names of layer i's rotary tables."""
        local = i in self.cfg.sliding_layers and self.cfg.local_rope() is not None
        return ("cos_cache_local", "sin_cache_local") if local else ("cos_cache", "sin_cache")

    def norm_weight(self, name: str) -> str:
        return self.g.init(name, self.w[name].numpy().astype(self.fdt))

    def qkv(self, x: str, i: int) -> str:
        """Layer i's fused Q/K/V projection of x, with the biases where the config has them (Qwen2)."""
        t = f"layers.{i}"
        qkv = self.linear(x, [f"{t}.wq", f"{t}.wk", f"{t}.wv"], f"{t}.wqkv")
        if not self.cfg.qkv_bias:
            return qkv
        b = torch.cat([self.w[f"{t}.bq"], self.w[f"{t}.bk"], self.w[f"{t}.bv"]])
        return self.g.op("Add", [qkv, self.g.init(f"{t}.bqkv", b.numpy().astype(self.fdt))], name=f"{t}/qkv_bias")

    def split_qkv(self, qkv: str, i: int) -> list[str]:
        """Layer i's packed Q/K/V [B, T, (H + 2 Hkv) * D] -> [q, k, v] along the last axis."""
        cfg, t = self.cfg, f"layers.{i}"
        H, Hkv, D = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        sizes = self.g.const_i64(f"{t}.qkv_split", [H * D, Hkv * D, Hkv * D])
        return self.g.op("Split", [qkv, sizes], n_out=3, name=f"{t}/qkv_split", axis=-1)

    def mlp(self, x: str, i: int) -> str:
        """Layer i's gated MLP (SiLU, or GELU with the tanh approximation for Gemma) on x."""
        g, hd = self.g, self.cfg.hidden_dim
        gu = self.linear(x, [f"layers.{i}.w_gate", f"layers.{i}.w_up"], f"layers.{i}.w_gate_up")
        gate, up = g.op(
            "Split", [gu, g.const_i64(f"layers.{i}.split", [hd, hd])], n_out=2, name=f"layers.{i}/split", axis=-1
        )
        if self.cfg.act == "gelu_tanh" and self.variant == "ort":
            act = g.op("FastGelu", [gate], name=f"layers.{i}/gelu", domain=MS)  # 0.5 x (1 + tanh(...))
        elif self.cfg.act == "gelu_tanh":
            act = gelu_tanh(self, gate, f"layers.{i}/gelu")
        elif self.variant == "ort":
            act = g.op("QuickGelu", [gate], name=f"layers.{i}/silu", domain=MS, alpha=1.0)
        else:
            act = g.op("Mul", [gate, g.op("Sigmoid", [gate], name=f"layers.{i}/sigmoid")], name=f"layers.{i}/silu")
        return self.linear(
            g.op("Mul", [act, up], name=f"layers.{i}/gate_mul"), [f"layers.{i}.w_down"], f"layers.{i}.w_down"
        )

    def _head(self, h, res):
        """Last position only: final norm, then the (tied) output head -> logits [B, V] float32."""
        cfg, g = self.cfg, self.g
        last = [g.const_i64("last.start", [-1]), g.const_i64("last.end", [1 << 62]), g.const_i64("last.axis", [1])]
        h = g.op("Slice", [h] + last, name="last/h")
        res = g.op("Slice", [res] + last, name="last/res")
        norm = self.norm_weight("norm")
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
            x = rms(self, g.op("Add", [h, res], name="final_res"), norm, "final_norm")
        x = g.op("Squeeze", [x, g.const_i64("axes_seq", [1])], name="last/squeeze")  # [B, dim]
        head = "tok_embeddings" if cfg.tie_embeddings else "output"
        if self.precision in ("fp32", "fp16") and cfg.tie_embeddings:  # the embedding matrix: x @ E^T
            y = g.op("Gemm", [x, "embed_tokens"], name="lm_head", transB=1)
        elif not self.blocks:
            y = self.linear(x, [head], "lm_head")
        elif self.rows:  # the prompts' graph: the float matrix, as before the blocks were shared
            y = g.op("Gemm", [x, self._dequantized(head)], name="lm_head", transB=1)
        else:
            q, s = self._int8(head)
            y = self.linears.nbits(x, q, s, 8, "lm_head", zero_points=np.full(s.shape, 128, np.uint8))
        if self.fdt == np.float16:
            y = g.op("Cast", [y], name="logits_fp32", to=1)
        if cfg.final_softcap:  # cap * tanh(logits / cap)
            cap = g.init("final_softcap", np.array(cfg.final_softcap, np.float32))
            y = g.op(
                "Mul",
                [g.op("Tanh", [g.op("Div", [y, cap], name="softcap/div")], name="softcap/tanh"), cap],
                name="softcap",
            )
        g.op("Identity", [y], outputs=["logits"], name="logits")


ROWS_NOTE = "; prefill.onnx (prompts): the same blocks, dequantized to float32 as the graph loads"


def weights_note(graph: LlamaGraph, tensor_types: dict) -> str:
    types = ", ".join(f"{k} x{v}" for k, v in sorted(tensor_types.items()))
    p = graph.precision
    rows = ROWS_NOTE if graph.variant == "ort" else ""
    if graph.fdt == np.float16 and p in ("int4", "int8"):
        rows = rows.replace("float32", "float16") + "; float16 activations and cache"
    if p == "int4":
        kept = "4-bit blocks kept exactly (MatMulNBits, zero = m + 8*d added as a block-sum correction)"
        re = (
            f"; re-quantized to 4 bits by min/max per 32-block: {len(graph.linears.requantized)} weights"
            if graph.linears.requantized
            else ""
        )
        if graph.linears.eight_bit:
            re += f"; the file's other linear weights in 8-bit blocks: {len(graph.linears.eight_bit)}"
        return f"file tensors: {types}; {kept}{re}; head 8-bit per 32-block (Q8_0 exact){rows}"
    if p == "int8":
        return f"file tensors: {types}; dequantized, re-quantized to 8 bits per 32-block (symmetric){rows}"
    return f"file tensors: {types}; dequantized to {p}"
