"""Runner interfaces, one per model family. Decoding loops are written against these only.

Tensors crossing the seam are torch tensors on the runner's device (ids int64, logits float32);
runners of non-torch engines (ONNX Runtime, TensorRT) convert at their edge.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Iterator

import torch


class ASRRunner(ABC):
    """Encoder-decoder speech recognizer (Whisper). `config` is a models.whisper.WhisperConfig."""

    config: Any
    device: torch.device

    @abstractmethod
    def encode(self, mel: torch.Tensor) -> Any:
        """mel [B, n_mels, 3000] float32 -> encoder output (opaque to the caller)."""

    @abstractmethod
    def start(self, encoded: Any, repeat: int, max_tokens: int) -> Any:
        """New decoder state for `encoded`, each item repeated `repeat` times (beams) in a row:
        cross-attention keys/values are computed here, once per window; the self-attention cache is
        preallocated for `max_tokens` positions."""

    @abstractmethod
    def decode_step(self, state: Any, tokens: torch.Tensor) -> torch.Tensor:
        """tokens [N, t] (the prompt on the first call, then one per row) -> logits [N, vocab] float32
        of the last position. Appends to the state's cache."""

    @abstractmethod
    def reorder(self, state: Any, index: torch.Tensor) -> Any:
        """Keep rows `index` [N'] of the state (beam reordering, or dropping finished rows)."""


class SLMRunner(ABC):
    """Decoder-only language model with a preallocated, slot-addressed KV cache.

    `config` has at least `vocab_size` and `max_seq_len`; runners also carry the model's `tokenizer` and
    `chat_template` (models.llm_text). The cache object is the runner's own, exposing `max_batch` and
    `max_seq`; each slot holds one sequence, so a scheduler can add and drop sequences between steps
    (continuous batching).
    """

    config: Any
    device: torch.device

    @abstractmethod
    def new_cache(self, max_batch: int, max_seq: int) -> Any:
        """Preallocate the KV cache for `max_batch` sequence slots of up to `max_seq` tokens."""

    @abstractmethod
    def prefill(self, cache: Any, slot: int, tokens: torch.Tensor, start: int = 0) -> torch.Tensor:
        """Run tokens [T] into `slot` at positions start..start+T-1 -> logits [vocab] float32 of the last.
        start=0 (re)starts the slot; start=n continues a slot that holds n positions."""

    @abstractmethod
    def decode_step(self, cache: Any, slots: list[int] | torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """One token [N] for each of `slots` [N] (distinct slots holding sequences of different lengths;
        a host list of ints lets the step be planned without waiting on the device) -> logits [N, vocab]
        float32. Each slot's sequence grows by one position."""


class TTSRunner(ABC):
    """Text-to-speech acoustic model + vocoder (VITS)."""

    sample_rate: int

    @abstractmethod
    def synthesize(self, phoneme_ids: list[int], options: Any) -> Iterator[torch.Tensor]:
        """Phoneme ids -> float32 audio chunks [n] at `sample_rate`, in order."""


class Backend(ABC):
    """A way to run models: builds one runner per model family from a resolved model."""

    name: str

    def asr(self, model, device: str = "cpu", dtype: str | None = None) -> ASRRunner:
        raise NotImplementedError(f"backend {self.name!r} does not run speech recognition models")

    def slm(self, model, device: str = "cpu", dtype: str | None = None) -> SLMRunner:
        raise NotImplementedError(f"backend {self.name!r} does not run language models")

    def tts(self, model, device: str = "cpu", dtype: str | None = None) -> TTSRunner:
        raise NotImplementedError(f"backend {self.name!r} does not run speech synthesis models")
