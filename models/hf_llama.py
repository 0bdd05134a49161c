"""Hugging Face Llama-family directory (config.json + *.safetensors + tokenizer.json) -> LMFile.

Weights keep transformers' rotary layout (no permutation); they are read with `safetensors` and cast to
float32 on the CPU, like the GGUF loader's output, and named as models/llama.py expects.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from .lm_file import LMFile
from .registry import ModelError

_LAYER = {
    "input_layernorm.weight": "attn_norm",
    "self_attn.q_proj.weight": "wq",
    "self_attn.k_proj.weight": "wk",
    "self_attn.v_proj.weight": "wv",
    "self_attn.o_proj.weight": "wo",
    "post_attention_layernorm.weight": "ffn_norm",
    "mlp.gate_proj.weight": "w_gate",
    "mlp.up_proj.weight": "w_up",
    "mlp.down_proj.weight": "w_down",
}
_IGNORED = ("rotary_emb.inv_freq",)


def config_from_hf(conf: dict, where: Path):
    from .llama import LlamaConfig, RopeScaling

    def need(k):
        if k not in conf:
            raise ModelError(f"{where}/config.json lacks {k!r}")
        return conf[k]

    rp = conf.get("rope_scaling") or conf.get("rope_parameters") or {}
    theta = conf.get("rope_theta", rp.get("rope_theta", 10000.0))
    kind = rp.get("rope_type", rp.get("type", "default"))
    scaling = None
    if kind == "linear":
        scaling = RopeScaling("linear", float(rp["factor"]))
    elif kind == "llama3":
        scaling = RopeScaling(
            "llama3",
            float(rp["factor"]),
            low_freq_factor=float(rp["low_freq_factor"]),
            high_freq_factor=float(rp["high_freq_factor"]),
            original_max_seq_len=int(rp["original_max_position_embeddings"]),
        )
    elif kind not in ("default", None):
        raise ModelError(f"{where}: rope scaling {kind!r} is not supported; supported: default, linear, llama3")
    if conf.get("attention_bias") or conf.get("mlp_bias"):
        raise ModelError(f"{where}: attention/MLP biases are not supported by the Llama model")
    if conf.get("hidden_act", "silu") != "silu":
        raise ModelError(f"{where}: hidden_act {conf['hidden_act']!r} is not supported; supported: silu")
    n_heads = need("num_attention_heads")
    return LlamaConfig(
        vocab_size=need("vocab_size"),
        dim=need("hidden_size"),
        n_layers=need("num_hidden_layers"),
        n_heads=n_heads,
        n_kv_heads=conf.get("num_key_value_heads") or n_heads,
        hidden_dim=need("intermediate_size"),
        head_dim=conf.get("head_dim") or 0,
        norm_eps=float(conf.get("rms_norm_eps", 1e-6)),
        rope_theta=float(theta),
        rope_scaling=scaling,
        max_seq_len=int(conf.get("max_position_embeddings", 2048)),
        tie_embeddings=bool(conf.get("tie_word_embeddings", False)),
    )


def load(d: str | Path) -> LMFile:
    from safetensors import SafetensorError, safe_open

    from .lm_text import LMTokenizer

    d = Path(d)
    try:
        conf = json.loads((d / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ModelError(f"{d}/config.json cannot be read: {e}") from None
    files = sorted(d.glob("*.safetensors"))
    if not files:
        raise ModelError(f"{d}: no *.safetensors files")
    weights: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            with safe_open(str(f), framework="pt") as sf:
                for name in sf.keys():
                    key = name.removeprefix("model.")
                    if key == "embed_tokens.weight":
                        k2 = "tok_embeddings"
                    elif key == "norm.weight":
                        k2 = "norm"
                    elif name == "lm_head.weight":
                        k2 = "output"
                    elif key.startswith("layers."):
                        _, i, rest = key.split(".", 2)
                        if rest.endswith(_IGNORED):
                            continue
                        if rest not in _LAYER:
                            raise ModelError(f"{f.name}: tensor {name!r} is not part of the Llama architecture")
                        k2 = f"layers.{i}.{_LAYER[rest]}"
                    else:
                        raise ModelError(f"{f.name}: unexpected tensor {name!r} for a Llama-family model")
                    weights[k2] = sf.get_tensor(name).float()
        except SafetensorError as e:
            raise ModelError(f"{f}: not a readable safetensors file ({e})") from None
    cfg = config_from_hf(conf, d)
    if "output" in weights and cfg.tie_embeddings:
        weights.pop("output")
    if "output" not in weights and not cfg.tie_embeddings:
        cfg = cfg.replace(tie_embeddings=True)  # no lm_head stored: the head is the embedding
    tok, template = LMTokenizer.from_hf_dir(d)
    return LMFile(cfg, weights, tok, template, str(d), {"safetensors": len(weights)})
