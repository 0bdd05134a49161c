"""`speechrt export lm`: a Llama-family GGUF / Hugging Face model -> model.onnx + manifest.json + tokenizer.json."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from speechrt.models.llama import LlamaConfig, RopeScaling
from speechrt.models.lm_loaders import load_lm

from .graph_builder import save, save_shared
from .llama_onnx import LlamaGraph, io, weights_note
from .manifest import Graph, Manifest, speechrt_version

DEFAULT_PRECISION = {"ort": "int4", "standard": "fp32"}
PREFILL_OPSET = 21
WEIGHTS = "weights.bin"  # a block-quantized export's weights, which its decode and prompt graphs share


def config_from_dict(d: dict) -> LlamaConfig:
    d = dict(d)
    rs = d.get("rope_scaling")
    if rs is not None:
        d["rope_scaling"] = RopeScaling(**{**rs, "freq_factors": tuple(rs.get("freq_factors", ()))})
    return LlamaConfig(**d)


def export(
    model, out: Path, precision: str | None, opset: int, variant: str, bar, activations: str = "float32"
) -> Manifest:
    from speechrt.errors import UserError

    precision = precision or DEFAULT_PRECISION[variant]
    if activations == "float16" and (precision not in ("int4", "int8") or variant != "ort"):
        raise UserError(
            f"--activations float16 is for the ort variant's weight-only precisions int4 and int8 (what "
            f"ONNX Runtime's GPU providers run); not {variant} {precision} (fp16: float16 throughout)"
        )
    bar.set_description("reading weights")
    f = load_lm(model)
    cfg = f.config
    # block-quantized weights on ONNX Runtime: a second graph for prompts, float32 weights at load (LlamaGraph rows)
    names = ["model", "prefill"] if variant == "ort" and precision in ("int4", "int8") else ["model"]
    if len(names) > 1:  # the prompts' graph unpacks the blocks by a blocked DequantizeLinear: opset 21
        opset = max(opset, PREFILL_OPSET)
    bar.reset(total=len(names) * (cfg.n_layers + 1) + 1)
    bar.update(1)
    cache_dtype = "float16" if precision == "fp16" or activations == "float16" else "float32"
    ins, outs = io(cfg, variant, cache_dtype)
    graphs, built, protos = {}, [], {}
    for name in names:
        bar.set_description(f"building {variant} {precision} {name} graph")
        graph = LlamaGraph(
            cfg,
            f.weights,
            f.q4,
            precision,
            variant,
            progress=bar.update,
            rows=name == "prefill",
            activations=activations,
        )
        built.append(graph)
        protos[out / f"{name}.onnx"] = graph.build(opset)
        data = WEIGHTS if len(names) > 1 else ""
        graphs[name] = Graph(f"{name}.onnx", tuple(ins), tuple(outs), data=data)
        bar.update(1)
    bar.set_description("writing")
    if len(names) > 1:  # the graphs' blocks once, in one file that both read
        save_shared(protos, WEIGHTS)
    else:
        save(*protos.popitem()[::-1])
    cache = {
        "layout": "per layer past_key.i / past_value.i [batch, kv_heads, cache, head_dim]",
        "layers": cfg.n_layers,
        "kv_heads": cfg.n_kv_heads,
        "head_dim": cfg.head_dim,
        "dtype": cache_dtype,
        "max_seq": cfg.max_seq_len,
    }
    if variant == "ort":
        cache.update(
            scratch_positions=1,
            shared_buffers=True,
            note="cache = max_seq + 1 positions; present_* are bound to the past_* buffers (written in place)",
        )
    else:
        cache.update(shared_buffers=False, note="present_* = past_* with the step's positions appended")
    m = Manifest(
        "lm",
        model.name,
        dataclasses.asdict(cfg),
        graphs,
        precision,
        variant,
        cache,
        weights_note(built[0], f.tensor_types),
        {"path": str(model.path), "format": model.format},
        opset,
        speechrt_version(),
        {"tokenizer": f.tokenizer.save(out), "chat_template": f.chat_template},
    )
    return m
