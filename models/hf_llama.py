"""Hugging Face Llama-family directory (config.json + *.safetensors + tokenizer.json) -> LMFile.

The architectures of HF_ARCHS, by config.json's model_type: Llama (1-3.x, SmolLM2), Mistral, Qwen2 / Qwen2.5
(Q/K/V biases), Qwen3 (per-head Q/K norms), Gemma 3 (`gemma3_text`: see models/llama.py's config) and Phi-3
(fused qkv_proj / gate_up_proj, split here into the model's separate weights). Weights keep transformers' rotary
layout (no permutation); they are read with `safetensors` and cast to float32 on the CPU, like the GGUF loader's
output, and named as models/llama.py expects.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from .hf_archs import HF_ARCHS, supported
from .lm_file import LMFile
from .registry import ModelError

# model_type -> what it is, for messages; every one is models/llama.py with the config's switches
# model types whose config's `sliding_window` applies without `use_sliding_window` (Qwen's switch)
_WINDOWED = ("mistral", "phi3")

_LAYER = {
    "input_layernorm.weight": "attn_norm",
    "self_attn.q_proj.weight": "wq",
    "self_attn.k_proj.weight": "wk",
    "self_attn.v_proj.weight": "wv",
    "self_attn.q_proj.bias": "bq",
    "self_attn.k_proj.bias": "bk",
    "self_attn.v_proj.bias": "bv",
    "self_attn.q_norm.weight": "q_norm",
    "self_attn.k_norm.weight": "k_norm",
    "self_attn.o_proj.weight": "wo",
    "post_attention_layernorm.weight": "ffn_norm",
    "mlp.gate_proj.weight": "w_gate",
    "mlp.up_proj.weight": "w_up",
    "mlp.down_proj.weight": "w_down",
    "self_attn.qkv_proj.weight": "wqkv",  # Phi-3: split below
    "mlp.gate_up_proj.weight": "w_gate_up",  # Phi-3: split below
}
_IGNORED = ("rotary_emb.inv_freq",)
# Gemma 3 names its norms after their place: post_attention_layernorm is the attention output's norm there
_GEMMA_LAYER = {
    **_LAYER,
    "post_attention_layernorm.weight": "post_attn_norm",
    "pre_feedforward_layernorm.weight": "ffn_norm",
    "post_feedforward_layernorm.weight": "post_ffn_norm",
}
_GEMMA = ("gemma3_text",)


def _rope(conf: dict, where: Path):
    """(rope theta, RopeScaling or None) of a config, or a ModelError for a kind not implemented."""
    from .llama import RopeScaling

    rp = conf.get("rope_scaling") or conf.get("rope_parameters") or {}
    if "full_attention" in rp:  # per layer type (Gemma 3 in transformers 5): the global layers' here
        rp = rp["full_attention"]
    theta = conf.get("rope_theta") or rp.get("rope_theta", 10000.0)
    kind = rp.get("rope_type", rp.get("type", "default"))
    partial = conf.get("partial_rotary_factor") or rp.get("partial_rotary_factor") or 1.0
    if float(partial) != 1.0:
        raise ModelError(f"{where}: partial rotary embedding (partial_rotary_factor={partial}) is not supported")
    if kind == "linear":
        return theta, RopeScaling("linear", float(rp["factor"]))
    if kind == "llama3":
        return theta, RopeScaling(
            "llama3",
            float(rp["factor"]),
            low_freq_factor=float(rp["low_freq_factor"]),
            high_freq_factor=float(rp["high_freq_factor"]),
            original_max_seq_len=int(rp["original_max_position_embeddings"]),
        )
    if kind not in ("default", None):
        raise ModelError(
            f"{where}: rope scaling {kind!r} is not supported; supported: default (none), linear, llama3"
            + (" (Phi-3's 128k / Phi-3.5's 'longrope' is not implemented)" if kind in ("longrope", "su") else "")
        )
    return theta, None


def config_from_hf(conf: dict, where: Path):
    from .llama import LlamaConfig

    def need(k):
        if k not in conf:
            raise ModelError(f"{where}/config.json lacks {k!r}")
        return conf[k]

    mt = conf.get("model_type", "llama")
    if mt not in HF_ARCHS:
        raise ModelError(f"{where}: model_type {mt!r} is not supported; supported: {supported()}")
    theta, scaling = _rope(conf, where)
    if conf.get("attention_bias") or conf.get("mlp_bias"):
        raise ModelError(f"{where}: attention output / MLP biases are not supported by the Llama model")
    act = conf.get("hidden_activation") or conf.get("hidden_act", "silu")
    act = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_tanh": "gelu_tanh"}.get(act)
    if act is None or (act == "gelu_tanh") != (mt in _GEMMA):
        raise ModelError(
            f"{where}: hidden_act {conf.get('hidden_activation') or conf.get('hidden_act')!r} is not supported for "
            f"{mt}; supported: silu (gelu_pytorch_tanh for Gemma 3)"
        )
    n_heads = need("num_attention_heads")
    max_seq = int(conf.get("max_position_embeddings", 2048))
    window = conf.get("sliding_window") if mt in _WINDOWED or conf.get("use_sliding_window") else None
    if window:  # attention over the last `window` positions is full attention while sequences fit in it
        max_seq = min(max_seq, int(window))
    gemma = _gemma_switches(conf, mt, theta) if mt in _GEMMA else {}
    return LlamaConfig(
        **gemma,
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
        max_seq_len=max_seq,
        tie_embeddings=bool(conf.get("tie_word_embeddings", mt in _GEMMA)),
        qkv_bias=mt == "qwen2",
        qk_norm=mt in ("qwen3", *_GEMMA),
        arch=mt,
    )


def _gemma_switches(conf: dict, mt: str, theta) -> dict:
    """Gemma 3's config switches (models.llama.LlamaConfig): sliding-window layers by `layer_types` (or every
    layer but each sixth), their rotary base, GeGLU, the embedding scale, the post norms, the final logits' soft cap
    (attn_logit_softcapping is not part of Gemma 3: transformers' Gemma3Attention does not apply it)."""
    n = conf["num_hidden_layers"]
    types = conf.get("layer_types") or [
        "sliding_attention" if (i + 1) % conf.get("sliding_window_pattern", 6) else "full_attention" for i in range(n)
    ]
    rp = conf.get("rope_parameters") or {}
    local = conf.get("rope_local_base_freq") or rp.get("sliding_attention", {}).get("rope_theta", 10000.0)
    return dict(
        act="gelu_tanh",
        embed_scale=float(conf["hidden_size"]) ** 0.5,
        post_norms=True,
        sliding_window=int(conf.get("sliding_window") or 0),
        sliding_layers=tuple(i for i, t in enumerate(types) if t == "sliding_attention"),
        rope_local_theta=float(local),
        final_softcap=float(conf.get("final_logit_softcapping") or 0.0),
    )


def _tensor_key(name: str, fname: str, arch: str) -> str | None:
    key = name.removeprefix("model.")
    if key == "embed_tokens.weight":
        return "tok_embeddings"
    if key == "norm.weight":
        return "norm"
    if name == "lm_head.weight":
        return "output"
    if key.startswith("layers."):
        _, i, rest = key.split(".", 2)
        if rest.endswith(_IGNORED):
            return None
        names = _GEMMA_LAYER if arch in _GEMMA else _LAYER
        if rest in names:
            return f"layers.{i}.{names[rest]}"
    raise ModelError(f"{fname}: tensor {name!r} is not part of the {arch} architecture as the Llama model runs it")


def load(d: str | Path) -> LMFile:
    from safetensors import SafetensorError, safe_open

    from .lm_file import check_layer_tensors, fold_gemma, split_fused
    from .lm_text import LMTokenizer

    d = Path(d)
    try:
        conf = json.loads((d / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ModelError(f"{d}/config.json cannot be read: {e}") from None
    cfg = config_from_hf(conf, d)  # an unsupported architecture fails before the weights are read
    files = sorted(d.glob("*.safetensors"))
    if not files:
        raise ModelError(f"{d}: no *.safetensors files")
    weights: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            with safe_open(str(f), framework="pt") as sf:
                for name in sf.keys():
                    k2 = _tensor_key(name, f.name, cfg.arch)
                    if k2 is not None:
                        weights[k2] = sf.get_tensor(name).float()
        except SafetensorError as e:
            raise ModelError(f"{f}: not a readable safetensors file ({e})") from None
    split_fused(weights, cfg)
    check_layer_tensors(weights, cfg, d)
    if cfg.arch in _GEMMA:  # (1 + w) norms; query_pre_attn_scalar (default: head_dim) into the Q norm
        fold_gemma(weights, cfg, plus_one=True, query_scalar=float(conf.get("query_pre_attn_scalar") or cfg.head_dim))
    if "output" in weights and cfg.tie_embeddings:
        weights.pop("output")
    if "output" not in weights and not cfg.tie_embeddings:
        cfg = cfg.replace(tie_embeddings=True)  # no lm_head stored: the head is the embedding
    tok, template = LMTokenizer.from_hf_dir(d)
    return LMFile(cfg, weights, tok, template, str(d), {"safetensors": len(weights)})
