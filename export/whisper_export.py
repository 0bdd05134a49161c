"""`speechrt export asr`: Whisper (models/whisper.py) -> encoder.onnx + decoder.onnx + manifest + tokenizer.

Variant 'ort' (the default): the graphs written op by op on ONNX Runtime's fused ops (export/whisper_onnx.py).
Variant 'standard' (plain ONNX ops, for TensorRT and other runtimes), described below:

encoder: mel [B, n_mels, 2 * n_audio_ctx] -> every decoder layer's cross-attention keys and values
  cross_key.i / cross_value.i [B, H, n_audio_ctx, Dh], computed once per window.
decoder: tokens [N, T] at positions offset..offset+T-1 (T > 1: a prompt, or a draft checked in one pass;
  N rows: beams, or utterances of several sessions), the self-attention cache self_key.i / self_value.i
  [N, H, L, Dh] (a preallocated buffer of which the first `offset` positions are read) and the cross
  keys/values -> logits [N, T, vocab] and the step's keys/values new_key.i / new_value.i [N, H, T, Dh],
  which the runner writes into its buffer at `offset` (reordering and rewinding stay torch ops on it).

Both are traced from the torch model's own modules (the same linears, norms and attention op), through
torch.onnx's TorchScript exporter. int8: ONNX Runtime's dynamic quantization of the MatMul weights
(MatMulInteger, per output channel). fp16: the model in float16 (for GPUs).
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import torch
from torch import nn

from speechrt.models.whisper import Whisper, WhisperConfig
from speechrt.models.whisper_loaders import load_weights

from . import whisper_onnx
from .graph_builder import save
from .manifest import Graph, Manifest, Tensor, speechrt_version
from .trace import export_ops, trace

PRECISIONS = ("fp32", "fp16", "int8")


def io(c: WhisperConfig, dtype: str = "float32") -> dict[str, tuple[list[Tensor], list[Tensor]]]:
    """Inputs and outputs of the two graphs: the names the runner binds."""
    dh = c.n_text_state // c.n_text_head
    cross = [
        Tensor(f"cross_{kv}.{i}", dtype, ("batch", c.n_text_head, c.n_audio_ctx, dh))
        for i in range(c.n_text_layer)
        for kv in ("key", "value")
    ]
    enc = ([Tensor("mel", dtype, ("batch", c.n_mels, 2 * c.n_audio_ctx))], cross)
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
        [Tensor("tokens", "int64", ("batch", "tokens")), Tensor("offset", "int64", ())]
        + self_kv
        + [Tensor(t.name, dtype, ("batch",) + t.shape[1:]) for t in cross],
        [Tensor("logits", "float32", ("batch", "tokens", c.n_vocab))] + new_kv,
    )
    return {"encoder": enc, "decoder": dec}


class EncoderGraph(nn.Module):
    def __init__(self, model: Whisper):
        super().__init__()
        self.model = model

    def forward(self, mel):
        out = []
        for k, v in self.model.cross_kv(self.model.encoder(mel)):
            out += [k, v]
        return tuple(out)


class DecoderGraph(nn.Module):
    """models.whisper.TextDecoder with the cache read up to `offset` and the new keys/values returned."""

    def __init__(self, model: Whisper):
        super().__init__()
        self.dec = model.decoder

    def forward(self, tokens, offset, *kv):
        n = len(self.dec.blocks)
        caches, cross = kv[: 2 * n], kv[2 * n :]
        T = tokens.shape[1]
        pos = self.dec.positional_embedding.index_select(0, offset + torch.arange(T))
        x = self.dec.token_embedding(tokens) + pos
        new = []
        for i, b in enumerate(self.dec.blocks):
            a = b.attn
            h = b.attn_ln(x)
            B, _, d = h.shape
            qkv = a.qkv(h).view(B, T, 3, a.heads, d // a.heads).permute(2, 0, 3, 1, 4)
            q, k, v = qkv[0], qkv[1], qkv[2]  # [B, H, T, Dh]
            kall = torch.cat([caches[2 * i][:, :, :offset], k], dim=2)
            vall = torch.cat([caches[2 * i + 1][:, :, :offset], v], dim=2)
            o = a.ops.attention(q, kall, vall, causal=True)
            x = x + a.out(o.transpose(1, 2).reshape(B, T, d))
            x = x + b.cross_attn(b.cross_attn_ln(x), (cross[2 * i], cross[2 * i + 1]))
            x = x + b.mlp(b.mlp_ln(x))
            new += [k, v]
        return (self.dec.logits(self.dec.ln(x)),) + tuple(new)


def quantize_int8(path: Path) -> None:
    """MatMul weights -> int8 per output channel, activations quantized per call (ONNX Runtime's dynamic
    quantization: DynamicQuantizeLinear + MatMulInteger)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    tmp = path.with_suffix(".fp32.onnx")
    path.rename(tmp)
    quantize_dynamic(
        str(tmp), str(path), weight_type=QuantType.QInt8, per_channel=True, op_types_to_quantize=["MatMul"]
    )
    tmp.unlink()


def export(model, out: Path, precision: str | None, opset: int, variant: str, bar) -> Manifest:
    precision = precision or "fp32"
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r} is not available for Whisper; valid: {', '.join(PRECISIONS)}")
    bar.reset(total=4)
    bar.set_description("reading weights")
    w = load_weights(model)
    c = w.config
    if w.tokenizer_path is None:
        raise ValueError(f"{model.path}: the model has no tokenizer.json; it is needed beside the graphs")
    tdt = "float16" if precision == "fp16" else "float32"
    bar.update(1)
    if variant == "ort":
        spec = whisper_onnx.io(c, tdt)
        bar.set_description("writing the graphs")
        for name, g in whisper_onnx.build(c, w.state, precision, opset).items():
            save(g, out / f"{name}.onnx")
            if name not in spec:  # the decoder for many rows: the decoder's inputs and outputs
                spec[name] = spec["decoder"]
        bar.update(2)
        weights = {
            "fp32": "float32 as loaded",
            "fp16": "float16",
            "int8": "encoder: linear weights int8 per output channel, activations per call "
            "(DynamicQuantizeMatMul); decoder: 8-bit blocks of 32 (MatMulNBits), activations "
            "int8 per block, in steps of 1-2 rows; a float32 copy (the prompt graph) for steps of "
            "more rows; convolutions and attention float32",
        }[precision]
    else:
        spec = io(c, tdt)
        _trace_graphs(w, spec, out, opset, bar, precision)
        weights = {
            "fp32": "float32 as loaded",
            "fp16": "float16",
            "int8": "MatMul weights int8 per output channel (dynamic quantization), convolutions float32",
        }[precision]
    bar.update(1)
    shutil.copy(w.tokenizer_path, out / "tokenizer.json")
    graphs = {k: Graph(f"{k}.onnx", tuple(i), tuple(o)) for k, (i, o) in spec.items()}
    cache = {
        "layout": "self_key.i / self_value.i [batch, heads, cache, head_dim], positions < offset read",
        "max_tokens": c.n_text_ctx,
        "dtype": tdt,
        "cross": "cross_key.i / cross_value.i from the encoder",
    }
    return Manifest(
        "asr",
        model.name,
        dataclasses.asdict(c),
        graphs,
        precision,
        variant,
        cache,
        weights,
        {"path": str(model.path), "format": model.format},
        opset,
        speechrt_version(),
        {"alignment_heads": [list(h) for h in w.alignment_heads]},
    )


def _trace_graphs(w, spec, out: Path, opset: int, bar, precision: str) -> None:
    """The standard variant: both graphs traced from the torch modules (plain ONNX ops)."""
    c = w.config
    m = Whisper(c, export_ops())
    m.load_state_dict(w.state, strict=False)  # the encoder's positional embedding is computed, not loaded
    dtype = torch.float16 if precision == "fp16" else torch.float32
    m = m.to(dtype).eval().requires_grad_(False)
    bar.set_description("tracing the encoder")
    trace(
        EncoderGraph(m),
        (torch.zeros(1, c.n_mels, 2 * c.n_audio_ctx, dtype=dtype),),
        out / "encoder.onnx",
        *spec["encoder"],
        opset,
    )
    bar.set_description("tracing the decoder")
    dh = c.n_text_state // c.n_text_head
    n = c.n_text_layer
    kv = [torch.zeros(2, c.n_text_head, 8, dh, dtype=dtype) for _ in range(2 * n)]
    cross = [torch.zeros(2, c.n_text_head, c.n_audio_ctx, dh, dtype=dtype) for _ in range(2 * n)]
    args = (torch.zeros(2, 3, dtype=torch.long), torch.tensor(2)) + tuple(kv) + tuple(cross)
    trace(DecoderGraph(m), args, out / "decoder.onnx", *spec["decoder"], opset)
    bar.update(1)
    if precision == "int8":
        bar.set_description("quantizing to int8")
        for name in ("encoder", "decoder"):
            quantize_int8(out / f"{name}.onnx")
