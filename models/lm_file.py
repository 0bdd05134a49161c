"""What a language-model loader (GGUF, Hugging Face folder) hands the model builder: LMFile."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


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
