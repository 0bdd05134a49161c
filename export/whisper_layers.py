"""Whisper's layers as ONNX Runtime fused ops, in an export's precision (see whisper_onnx): initializers, linear
layers (int8: per output channel with activations per call in the encoder, 8-bit blocks in the decoder), fused
residual norms, MLPs, attention heads."""

from __future__ import annotations

import numpy as np
import torch

from speechrt.models.whisper import WhisperConfig

from .graph_builder import MS, GraphBuilder
from .llama_weights import int8_blocks


class WhisperLayers:
    """The layers of one graph (`g`) for one (config, weights, precision): initializers in the graph's float type,
    linear layers in its precision, fused norms, MLPs and attention heads. `part`: the graph being built
    (encoder or decoder: their int8 linears differ)."""

    def __init__(self, c: WhisperConfig, state: dict[str, torch.Tensor], precision: str):
        self.c, self.w, self.precision = c, state, precision
        self.fdt = np.float16 if precision == "fp16" else np.float32
        self.g = GraphBuilder("whisper")
        self.part = "decoder"
        self.made: set[str] = set()

    def arr(self, name: str, values=None) -> str:
        """An initializer in the graph's float type (from the state dict, or `values`)."""
        v = self.w[name] if values is None else values
        return self.g.init(name, np.asarray(v.float().numpy() if torch.is_tensor(v) else v, dtype=self.fdt))

    def linear(self, x: str, weight: torch.Tensor, bias: torch.Tensor | None, tag: str) -> str:
        """x [..., K] @ weight.T (+ bias); weight [N, K]."""
        g = self.g
        if self.precision == "int8" and self.part == "decoder":  # 8-bit blocks, activations per block
            q, s = self.blocks8(weight, tag)
            N, K = weight.shape
            ins = [x, q, s, g.init(f"{tag}.zero", np.full(N * K // 32, 128, np.uint8))]
            y = g.op("MatMulNBits", ins, domain=MS, name=tag, K=K, N=N, bits=8, block_size=32, accuracy_level=4)
            return y if bias is None else g.op("Add", [y, self.arr(f"{tag}.bias", bias)], name=f"{tag}/bias")
        if self.precision == "int8":  # the encoder: int8 per output channel, activations per call
            w = weight.float()
            scale = (w.abs().amax(1) / 127).clamp_min(1e-12)  # per output channel, symmetric
            q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
            ins = [
                x,
                g.init(f"{tag}.qweight", q.T.numpy()),
                g.init(f"{tag}.scale", scale.numpy()),
                g.init(f"{tag}.zero", np.zeros(q.shape[0], np.int8)),
            ]
            if bias is not None:
                ins.append(g.init(f"{tag}.bias", bias.float().numpy()))
            return g.op("DynamicQuantizeMatMul", ins, domain=MS, name=tag)
        y = g.op("MatMul", [x, g.init(f"{tag}.weight", weight.float().T.numpy().astype(self.fdt))], name=tag)
        return y if bias is None else g.op("Add", [y, self.arr(f"{tag}.bias", bias)], name=f"{tag}/bias")

    def blocks8(self, weight: torch.Tensor, tag: str) -> tuple[str, str]:
        """The initializers (q [N, K/32, 32] uint8 with zero point 128, scale [N * K/32]) of weight [N, K]."""
        if f"{tag}.q8" not in self.made:
            q, s = int8_blocks(weight)
            self.g.init(f"{tag}.q8", q)
            self.g.init(f"{tag}.scale", s.reshape(-1))
            self.made.add(f"{tag}.q8")
        return f"{tag}.q8", f"{tag}.scale"

    def token_embedding(self) -> str:
        """tokens -> [N, T, d]. int8: the table in float16, cast after the Gather (40 MB instead of 80 beside
        the 20 MB int8 vocabulary projection; rounding 2^-11 relative, where int8 blocks of the projection's
        table moved the passage's greedy transcript)."""
        g, w = self.g, self.w["decoder.token_embedding.weight"]
        if self.precision != "int8":
            return g.op("Gather", [self.arr("decoder.token_embedding.weight"), "tokens"], name="token_embedding")
        table = g.init("token_embedding.fp16", w.half().numpy())
        return g.op(
            "Cast", [g.op("Gather", [table, "tokens"], name="token_embedding/half")], name="token_embedding", to=1
        )

    def lin(self, x: str, prefix: str, bias: bool = True) -> str:
        return self.linear(x, self.w[f"{prefix}.weight"], self.w[f"{prefix}.bias"] if bias else None, prefix)

    def skip_ln(self, x: str, skip: str, ln: str, bias: str | None = None) -> tuple[str, str]:
        """(LayerNorm(x + skip + bias), x + skip + bias): the residual add fused into the norm."""
        ins = [x, skip, self.arr(f"{ln}.weight"), self.arr(f"{ln}.bias")] + ([bias] if bias else [])
        out = self.g.op("SkipLayerNormalization", ins, 4, domain=MS, name=f"{ln}/skip", epsilon=1e-5)
        return out[0], out[3]

    def mlp(self, h: str, prefix: str) -> str:
        """fc2(gelu(fc1(h))) without fc2's bias (added by the next SkipLayerNormalization)."""
        g = self.g
        a = self.linear(h, self.w[f"{prefix}.fc1.weight"], None, f"{prefix}.fc1")
        a = g.op("BiasGelu", [a, self.arr(f"{prefix}.fc1.bias")], domain=MS, name=f"{prefix}.fc1/gelu")
        return self.linear(a, self.w[f"{prefix}.fc2.weight"], None, f"{prefix}.fc2")

    def heads(self, x: str, out: str) -> str:
        """[B, T, d] -> graph output `out` [B, H, T, Dh]."""
        c, g = self.c, self.g
        shape = g.const_i64(f"{out}/shape", [0, 0, c.n_text_head, c.n_text_state // c.n_text_head])
        return g.op(
            "Transpose",
            [g.op("Reshape", [x, shape], name=f"{out}/split_heads")],
            perm=[0, 2, 1, 3],
            name=out,
            outputs=[out],
        )

    def attention_out(self, o: str, x: str, proj: str, ln: str) -> tuple[str, str]:
        """The attention's output projection `proj`, its bias and the residual add fused into norm `ln`:
        -> (normed, residual sum)."""
        o = self.linear(o, self.w[f"{proj}.weight"], None, proj)
        return self.skip_ln(o, x, ln, self.arr(f"{proj}.bias"))

    def mlp_block(self, h: str, x: str, block: str, nxt: str) -> tuple[str, str]:
        """Block `block`'s MLP on h, fc2's bias and the residual add fused into the next norm `nxt`."""
        return self.skip_ln(self.mlp(h, f"{block}.mlp"), x, nxt, self.arr(f"{block}.mlp.fc2.bias"))
