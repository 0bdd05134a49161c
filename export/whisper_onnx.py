"""Whisper (models/whisper.py) -> encoder and decoder graphs written op by op on ONNX Runtime's fused ops.

The 'ort' variant of `speechrt export asr`. The TorchScript export (export/whisper_export.py, the 'standard'
variant for TensorRT) leaves ~400 nodes in a decoder step, half of them shape arithmetic; a step here is ~80:

encoder: mel [B, n_mels, F] (F even, <= 2 * n_audio_ctx: a shorter window encodes only the frames that hold
  audio, whisper.cpp's audio_ctx) and `lengths` int32 [B] (the positions of each row that hold its audio:
  keys past them are masked, so a row's encoding does not depend on the others of its batch) -> every
  decoder layer's cross-attention keys/values [B, H, F / 2, Dh], from one MatMul over all layers' weights.
  Per layer: SkipLayerNormalization (residual add + LayerNorm), MultiHeadAttention, BiasGelu.
decoder: tokens [N, T] at positions offset..offset+T-1, the self-attention cache (the first `offset`
  positions of self_key.i / self_value.i [N, H, L, Dh] are read), the cross keys/values with
  `cross_lengths` int32 [N], and `logit_positions` int64 [P] (which of the T positions get logits: the last
  one for a step or a prompt, all of them for a draft check) -> logits [N, P, vocab] and the step's new
  keys/values [N, H, T, Dh] (the runner writes them into its cache at `offset`).

int8: the encoder's linear weights int8 per output channel, activations quantized per call
(DynamicQuantizeMatMul, bias fused); the decoder's (vocabulary projection included) 8-bit blocks of 32
(MatMulNBits) with int8 activations per block — per-tensor activations cost the 58-s passage 2.7 WER points —
for steps of one or two rows, and a second decoder graph, `prompt`, all float32, for steps of more rows (int8
activations cost in proportion to the rows); the token embedding in float16; convolutions and attention
float32. A float32 decoder's vocabulary projection reads the embedding's own table (FusedMatMul, transB): the table
is stored once (the int8 export 269 -> 192 MB).
fp16: float16 weights and activations (for GPUs).
"""

from __future__ import annotations

import torch

from speechrt.models.whisper import WhisperConfig

from .graph_builder import MS
from .manifest import Tensor
from .whisper_layers import WhisperLayers


def io(c: WhisperConfig, dtype: str = "float32") -> dict[str, tuple[list[Tensor], list[Tensor]]]:
    """Inputs and outputs of the two graphs: the names the runner binds."""
    dh = c.n_text_state // c.n_text_head
    cross = [
        Tensor(f"cross_{kv}.{i}", dtype, ("batch", c.n_text_head, "positions", dh))
        for i in range(c.n_text_layer)
        for kv in ("key", "value")
    ]
    enc = ([Tensor("mel", dtype, ("batch", c.n_mels, "frames")), Tensor("lengths", "int32", ("batch",))], cross)
    self_kv = [
        Tensor(f"self_{kv}.{i}", dtype, ("batch", c.n_text_head, "cache", dh))
        for i in range(c.n_text_layer)
        for kv in ("key", "value")
    ]
    new_kv = [
        Tensor(f"new_{kv}.{i}", dtype, ("batch", c.n_text_head, "tokens", dh))
        for i in range(c.n_text_layer)
        for kv in ("key", "value")
    ]
    dec = (
        [
            Tensor("tokens", "int64", ("batch", "tokens")),
            Tensor("offset", "int64", ()),
            Tensor("logit_positions", "int64", ("logit_tokens",)),
        ]
        + self_kv
        + cross
        + [Tensor("cross_lengths", "int32", ("batch",))],
        [Tensor("logits", "float32", ("batch", "logit_tokens", c.n_vocab))] + new_kv,
    )
    return {"encoder": enc, "decoder": dec}


class WhisperGraphs(WhisperLayers):
    """Builds the two graphs for one (config, weights, precision)."""

    def encoder(self):
        self.part = "encoder"
        c, g, w = self.c, self.g, self.w
        x = g.op(
            "Conv",
            ["mel", self.arr("encoder.conv1.weight"), self.arr("encoder.conv1.bias")],
            name="conv1",
            kernel_shape=[3],
            pads=[1, 1],
        )
        x = g.op("Gelu", [x], domain=MS, name="conv1/gelu")
        x = g.op(
            "Conv",
            [x, self.arr("encoder.conv2.weight"), self.arr("encoder.conv2.bias")],
            name="conv2",
            kernel_shape=[3],
            pads=[1, 1],
            strides=[2],
        )
        x = g.op("Transpose", [g.op("Gelu", [x], domain=MS, name="conv2/gelu")], perm=[0, 2, 1], name="to_bsd")
        S = g.op("Shape", [x], name="positions", start=1, end=2)
        pos = g.op(
            "Slice",
            [self.arr("encoder.positional_embedding"), g.const_i64("zero1", [0]), S, g.const_i64("axis0", [0])],
            name="positional_embedding",
        )
        x = g.op("Add", [x, pos], name="embed")
        h = g.op(
            "LayerNormalization",
            [x, self.arr("encoder.blocks.0.attn_ln.weight"), self.arr("encoder.blocks.0.attn_ln.bias")],
            name="ln0",
            epsilon=1e-5,
        )
        d = c.n_audio_state
        split = g.const_i64("qkv_split", [d, d, d])
        for i in range(c.n_audio_layer):
            p = f"encoder.blocks.{i}"
            qkv = self.linear(h, w[f"{p}.attn.qkv.weight"], None, f"{p}.attn.qkv")
            q, k, v = g.op("Split", [qkv, split], 3, name=f"{p}.attn/split", axis=2)
            o = g.op(
                "MultiHeadAttention",
                [q, k, v, self.arr(f"{p}.attn.qkv.bias"), "lengths"],
                domain=MS,
                name=f"{p}.attn/attention",
                num_heads=c.n_audio_head,
            )
            h, x = self.attention_out(o, x, f"{p}.attn.out", f"{p}.mlp_ln")
            nxt = f"encoder.blocks.{i + 1}.attn_ln" if i + 1 < c.n_audio_layer else "encoder.ln_post"
            h, x = self.mlp_block(h, x, p, nxt)
        # every decoder layer's cross keys/values from one MatMul: [B, S, n_layers * 2 * d]
        L = c.n_text_layer
        kv_w = torch.cat([w[f"decoder.blocks.{i}.cross_attn.kv.weight"] for i in range(L)])
        kv_b = torch.cat([w[f"decoder.blocks.{i}.cross_attn.kv.bias"] for i in range(L)])
        kv = self.linear(h, kv_w, kv_b, "cross_kv")
        parts = g.op(
            "Split", [kv, g.const_i64("cross_split", [c.n_text_state] * 2 * L)], 2 * L, name="cross_kv/split", axis=2
        )
        for j, part in enumerate(parts):
            self.heads(part, f"cross_{('key', 'value')[j % 2]}.{j // 2}")
        return g

    def decoder(self):
        c, g, w = self.c, self.g, self.w
        past_end = g.op("Unsqueeze", ["offset", g.const_i64("axis0", [0])], name="past_end")  # [1]
        end = g.op("Add", [past_end, g.op("Shape", ["tokens"], name="T", start=1, end=2)], name="end")
        pos = g.op(
            "Slice", [self.arr("decoder.positional_embedding"), past_end, end, "axis0"], name="position_embedding"
        )
        x = g.op("Add", [self.token_embedding(), pos], name="embed")
        h = g.op(
            "LayerNormalization",
            [x, self.arr("decoder.blocks.0.attn_ln.weight"), self.arr("decoder.blocks.0.attn_ln.bias")],
            name="ln0",
            epsilon=1e-5,
        )
        d = c.n_text_state
        split = g.const_i64("qkv_split", [d, d, d])
        zero, axis2 = g.const_i64("zero1", [0]), g.const_i64("axis2", [2])
        for i in range(c.n_text_layer):
            p = f"decoder.blocks.{i}"
            qkv = self.lin(h, f"{p}.attn.qkv")  # the bias added before the split: the new values carry it
            q, k, v = g.op("Split", [qkv, split], 3, name=f"{p}.attn/split", axis=2)
            self.heads(k, f"new_key.{i}")
            self.heads(v, f"new_value.{i}")
            past = [
                g.op("Slice", [f"self_{kv}.{i}", zero, past_end, axis2], name=f"{p}.attn/past_{kv}")
                for kv in ("key", "value")
            ]
            o = g.op(
                "MultiHeadAttention",
                [q, k, v, "", "", "", past[0], past[1]],
                3,
                domain=MS,
                name=f"{p}.attn/attention",
                num_heads=c.n_text_head,
                unidirectional=1,
            )[0]
            h, x = self.attention_out(o, x, f"{p}.attn.out", f"{p}.cross_attn_ln")
            q = self.lin(h, f"{p}.cross_attn.q")
            o = g.op(
                "MultiHeadAttention",
                [q, f"cross_key.{i}", f"cross_value.{i}", "", "cross_lengths"],
                domain=MS,
                name=f"{p}.cross_attn/attention",
                num_heads=c.n_text_head,
            )
            h, x = self.attention_out(o, x, f"{p}.cross_attn.out", f"{p}.mlp_ln")
            nxt = f"decoder.blocks.{i + 1}.attn_ln" if i + 1 < c.n_text_layer else "decoder.ln"
            h, x = self.mlp_block(h, x, p, nxt)
        h = g.op("Gather", [h, "logit_positions"], name="logit_positions", axis=1)
        if self.precision == "fp32":  # the token table the Gather reads, transposed in the op: no copy (76 MB)
            table = "decoder.token_embedding.weight"
            logits = g.op("FusedMatMul", [h, table], domain=MS, name="logits", transB=1)
        else:
            logits = self.linear(h, w["decoder.token_embedding.weight"], None, "logits")
        g.op("Cast", [logits], name="logits/float32", outputs=["logits"], to=1)
        return g


def build(c: WhisperConfig, state: dict, precision: str, opset: int) -> dict:
    """-> {"encoder": ModelProto, "decoder": ModelProto}, and for int8 "prompt": the decoder in float32, for
    steps of several rows (prompts, drafts, several sessions' rows): MatMulNBits' int8 activations cost in
    proportion to the rows (AMD EPYC AVX2, 2 threads: a step of 8 rows 30.7 ms, float32 12.9 ms; 1 row
    4.4 ms, float32 7.5 ms)."""
    tdt = "float16" if precision == "fp16" else "float32"
    spec = io(c, tdt)
    out = {}
    parts = [("encoder", "encoder", precision), ("decoder", "decoder", precision)]
    if precision == "int8":
        parts.append(("prompt", "decoder", "fp32"))
    for name, part, prec in parts:
        b = WhisperGraphs(c, state, prec)
        getattr(b, part)()
        out[name] = b.g.model(*spec[part], opset)
    return out
