"""What a language-model loader (GGUF, Hugging Face folder) hands the model builder: LMFile, and the two steps
every loader ends with (fused projections split into the model's weights, unused layer tensors refused)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, MutableMapping
from dataclasses import dataclass, field

import torch

from .registry import ModelError


class _Later:
    __slots__ = ("make",)

    def __init__(self, make: Callable[[], torch.Tensor]):
        self.make = make


class LazyWeights(MutableMapping):
    """name -> tensor, where a value may be made on its first read (`later`): a GGUF's 4-bit tensors are
    dequantized to float32 only for the runners that read them as floats (the CPU int4 kernel reads the 4-bit
    blocks, LMFile.q4, and never does). Read once, a value is kept."""

    def __init__(self):
        self._d: dict[str, torch.Tensor | _Later] = {}

    def later(self, name: str, make: Callable[[], torch.Tensor]) -> None:
        self._d[name] = _Later(make)

    def made(self, name: str) -> bool:
        """Whether `name`'s value exists yet (set, or read once)."""
        return not isinstance(self._d[name], _Later)

    def __getitem__(self, name: str) -> torch.Tensor:
        v = self._d[name]
        if isinstance(v, _Later):
            v = self._d[name] = v.make()
        return v

    def __setitem__(self, name: str, value: torch.Tensor) -> None:
        self._d[name] = value

    def __delitem__(self, name: str) -> None:
        del self._d[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._d)

    def __len__(self) -> int:
        return len(self._d)


@dataclass
class LMFile:
    """What a loader hands the model builder. `weights` use the names of models/llama.py, float32, on CPU."""

    config: LlamaConfig  # noqa: F821 - models.llama.LlamaConfig
    weights: MutableMapping[str, torch.Tensor]  # a dict, or LazyWeights
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


def fold_gemma(weights, cfg, plus_one: bool, query_scalar: float) -> None:
    """Gemma's norms and attention scale as plain weights, in place: RMSNorm's (1 + w) as w (`plus_one`: a Hugging
    Face folder's w; llama.cpp's converter stores 1 + w already), and the scores' 1 / sqrt(query_pre_attn_scalar),
    where the models take 1 / sqrt(head_dim), as a factor on the Q norm's weight (Q is linear in it: the rotary
    and the dot product follow)."""
    norms = ("attn_norm", "ffn_norm", "post_attn_norm", "post_ffn_norm", "q_norm", "k_norm")
    if plus_one:
        for k in [k for k in weights if k == "norm" or k.rsplit(".", 1)[-1] in norms]:
            weights[k] = weights[k] + 1.0
    factor = (cfg.head_dim / query_scalar) ** 0.5
    if factor != 1.0:
        for i in range(cfg.n_layers):
            weights[f"layers.{i}.q_norm"] = weights[f"layers.{i}.q_norm"] * factor
