"""Runner interfaces, one per model family. Decoding loops are written against these only.

Tensors crossing the seam are torch tensors on the runner's device (ids int64, logits float32);
runners of non-torch engines (ONNX Runtime, TensorRT) convert at their edge.
"""
from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Iterator

import torch


class ASRRunner(ABC):
    """Encoder-decoder speech recognizer (Whisper). `config` is a models.whisper.WhisperConfig."""

    config: Any
    device: torch.device

    @abstractmethod
    def encode(self, mel: torch.Tensor, stop=None) -> Any:
        """mel [B, n_mels, 3000] float32 -> encoder output (opaque to the caller). `stop()`, if given, may
        be asked during the pass; when it returns True the pass is abandoned and None returned."""

    @abstractmethod
    def start(self, encoded: Any, repeat: int, max_tokens: int) -> Any:
        """New decoder state for `encoded`, each item repeated `repeat` times (beams) in a row:
        cross-attention keys/values are computed here, once per window; the self-attention cache is
        preallocated for `max_tokens` positions."""

    @abstractmethod
    def decode_step(self, state: Any, tokens: torch.Tensor, last_only: bool = True) -> torch.Tensor:
        """tokens [N, t] (the prompt on the first call, then one per row) -> logits [N, vocab] float32
        of the last position, or [N, t, vocab] of every position with last_only=False (checking a
        draft in one pass). Appends to the state's cache."""

    @abstractmethod
    def rewind(self, state: Any, length: int) -> Any:
        """Keep the first `length` positions of the state's self-attention cache and forget the rest
        (the next decode_step writes at `length`): a checked draft's rejected tail."""

    @abstractmethod
    def reorder(self, state: Any, index: torch.Tensor) -> Any:
        """Keep rows `index` [N'] of the state (beam reordering, or dropping finished rows)."""

    def loop_threads(self):
        """Context for the decoding loop around encode/decode steps (the torch runner narrows it to
        one CPU thread: the loop's many small ops stall on thread barriers otherwise)."""
        return contextlib.nullcontext()


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
        start=0 (re)starts the slot; start=n keeps the first n positions the slot holds (n at most what
        it holds; any later ones are forgotten) and continues from there."""

    @abstractmethod
    def decode_step(self, cache: Any, slots: list[int] | torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """One token [N] for each of `slots` [N] (distinct slots holding sequences of different lengths;
        a host list of ints lets the step be planned without waiting on the device) -> logits [N, vocab]
        float32. Each slot's sequence grows by one position."""


@dataclass
class Latent:
    """A sentence's vocoder input: z [1, C, F] float32 (F latent frames, `hop_length` samples each), plus
    whatever conditioning the runner's vocoder needs besides z (the speaker embedding), opaque to callers."""

    z: torch.Tensor
    cond: Any = None

    @property
    def frames(self) -> int:
        return self.z.shape[-1]


class TTSRunner(ABC):
    """Text-to-speech acoustic model + vocoder (VITS), split where streaming needs it: `latent` runs the
    text encoder, durations, prior and flow for a whole sentence; `vocode` turns any window of that latent
    into audio. The chunking policy (windows, context, crossfade) is written once, in models.synthesis."""

    sample_rate: int
    hop_length: int  # audio samples per latent frame
    context_frames: int  # latent frames each side of a window that the vocoder's output inside it depends on
    voice: Any  # models.piper_loader.VoiceConfig

    @abstractmethod
    def latent(self, phoneme_ids: list[int], options: Any) -> Latent:
        """Phoneme ids of one sentence -> its Latent. `options` is a models.synthesis.SynthesisOptions."""

    @abstractmethod
    def vocode(self, latent: Latent, start: int, end: int) -> torch.Tensor:
        """Frames [start, end) of `latent` -> float32 audio [(end - start) * hop_length] (CPU tensor).
        Windows shorter than the whole latent see zero padding at their edges: callers add context."""

    parallel: int = 1  # vocode calls that may usefully run at once (see vocode_async)

    def vocode_async(self, latent: Latent, start: int, end: int) -> Future:
        """vocode() as a Future. Runners that can run several windows at once (parallel > 1) override it;
        the default runs synchronously."""
        f: Future = Future()
        f.set_result(self.vocode(latent, start, end))
        return f

    def synthesize(self, phoneme_ids: list[int], options: Any) -> Iterator[torch.Tensor]:
        """Phoneme ids -> float32 audio chunks [n] at `sample_rate`, in order (first chunk early)."""
        from speechrt.models.synthesis import stream_latent

        yield from stream_latent(self, self.latent(phoneme_ids, options), options)


class Backend(ABC):
    """A way to run models: builds one runner per model family from a resolved model."""

    name: str

    def asr(self, model, device: str = "cpu", dtype: str | None = None, loop_threads: int | None = None) -> ASRRunner:
        raise NotImplementedError(f"backend {self.name!r} does not run speech recognition models")

    def slm(self, model, device: str = "cpu", dtype: str | None = None) -> SLMRunner:
        raise NotImplementedError(f"backend {self.name!r} does not run language models")

    def tts(self, model, device: str = "cpu", dtype: str | None = None) -> TTSRunner:
        raise NotImplementedError(f"backend {self.name!r} does not run speech synthesis models")
