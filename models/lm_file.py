"""What a language-model loader (GGUF, Hugging Face folder) hands the model builder: LMFile, and the two steps
every loader ends with (fused projections split into the model's weights, unused layer tensors refused)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .registry import ModelError


@dataclass
class LMFile:
    """What a loader hands the model builder. `weights` use the names of models/llama.py, float32, on CPU."""

    config: LlamaConfig  # noqa: F821 - models.llama.LlamaConfig
    weights: dict[str, torch.Tensor]
    tokenizer: LMTokenizer  # noqa: F821 - models.lm_text.LMTokenizer
    chat_template: str | None
    source: str
    tensor_types: dict[str, int] = field(default_factory=dict)  # quant type name -> count, for logs
    # 4-bit weights exactly as the file stores them (Q4_0 / Q4_1 blocks): name -> (q uint8 [N, K] in 0..15,
    # scale [N, K/32], zero [N, K/32]) with w = (q - 8) * scale + zero, for the int4 weight format
    q4: dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = field(default_factory=dict)


def split_fused(weights: dict, cfg, q4: dict | None = None) -> None:
    """Fused projections (Phi-3's qkv_proj / attn_qkv as `layers.{i}.wqkv`, gate_up_proj / ffn_up as
    `layers.{i}.w_gate_up`) -> the separate weights of models/llama.py, in place; rows q, k, v and gate, up.
    The 4-bit blocks of such a weight (`q4`) are split by the same rows."""
    q, kv = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    for key in [k for k in weights if k.endswith((".wqkv", ".w_gate_up"))]:
        base = key.rsplit(".", 1)[0]
        if key.endswith(".wqkv"):
            names, sizes = ("wq", "wk", "wv"), [q, kv, kv]
        else:
            names, sizes = ("w_gate", "w_up"), [cfg.hidden_dim, cfg.hidden_dim]
        w = weights.pop(key)
        if w.shape[0] != sum(sizes):
            raise ModelError(f"fused tensor {key} has {w.shape[0]} rows; the config says {sum(sizes)}")
        for n, part in zip(names, w.split(sizes)):
            weights[f"{base}.{n}"] = part.contiguous()
        if q4 and key in q4:
            blocks = [x.split(sizes) for x in q4.pop(key)]
            for j, n in enumerate(names):
                q4[f"{base}.{n}"] = tuple(b[j].contiguous() for b in blocks)


def check_layer_tensors(weights: dict, cfg, where) -> None:
    """A layer tensor the architecture's config does not use (a bias, a norm) is an error, not ignored."""
    from .llama import layer_tensors

    known = set(layer_tensors(cfg))
    extra = sorted({k.split(".", 2)[2] for k in weights if k.startswith("layers.")} - known)
    if extra:
        raise ModelError(
            f"{where}: tensors {', '.join(extra)} are not part of the {cfg.arch} architecture as the Llama "
            f"model runs it (its layer tensors: {', '.join(sorted(known))})"
        )
