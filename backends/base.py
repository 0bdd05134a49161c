"""Runner interfaces, one per model family. The pipelines (speechrt.pipelines) are written against these only.

Tensors crossing the seam are torch tensors on the runner's device (ids int64, logits float32);
runners of non-torch engines (ONNX Runtime, TensorRT) convert at their edge. Everything a caller needs
to know about a runner is a declared member here: nothing above this layer asks a runner with
getattr/hasattr.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from speechrt.errors import UserError

from .tts_plan import WINDOW_GROWTH, windows


@dataclass(frozen=True)
class RunnerInfo:
    """What a runner runs, for logs, benchmarks and /healthz: the backend, the model's name and file
    format, the precision its weights compute in (a dtype name, or a weight format such as int4), the
    device, and how it uses the CPU's threads."""

    backend: str
    model: str
    format: str
    precision: str
    device: str
    threads: str = ""

    def __str__(self) -> str:
        extra = f", {self.threads}" if self.threads else ""
        return f"{self.model} ({self.format}) as {self.precision} on {self.backend}/{self.device}{extra}"


class Runner(ABC):
    """What every runner declares: `info`, and `loop()`, the context in which a caller runs its decoding
    loop around the runner's steps (its own small tensor ops: logit rules, sampling). A runner applies
    its CPU thread policy there (see backends.threads.ThreadPolicy); the default does nothing."""

    info: RunnerInfo
    device: torch.device

    def loop(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()


class ASRRunner(Runner):
    """Encoder-decoder speech recognizer (Whisper). `config` is a models.whisper.WhisperConfig;
    `tokenizer_path` the model's tokenizer.json (the front end's vocabulary and special tokens);
    `trims`: whether encode() takes windows shorter than 30 s (the encoder's work in proportion to the
    audio); runners that do not get whole windows."""

    config: Any
    tokenizer_path: Path
    trims: bool = False

    @abstractmethod
    def encode(self, mel: torch.Tensor, stop=None, frames: list[int] | None = None) -> Any:
        """mel [B, n_mels, T] float32 (T = 3000, or with `trims` any even T up to it) -> encoder output
        (opaque to the caller). `frames` [B]: the mel frames of each row that hold its audio (the rest
        is padding its encoding must not depend on); None: all T. `stop()`, if given, may be asked
        during the pass; when it returns True the pass is abandoned and None returned."""

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
        (the next decode_step writes at `length`): a checked draft's rejected tail. ValueError if the
        state holds fewer than `length` positions."""

    @abstractmethod
    def reorder(self, state: Any, index: torch.Tensor) -> Any:
        """Keep rows `index` [N'] of the state (beam reordering, or dropping finished rows)."""

    def warm_graphs(self) -> None:
        """Capture ahead what the runner would otherwise capture in a server's first loaded seconds (the
        triton runner's prompt graphs); the warm-up calls it after its batches. Default: nothing."""

    # word timestamps read cross-attention weights: the torch-built runners expose them, the onnxruntime one
    # computes them with the source model's torch decoder
    WORD_TIMING_BACKENDS = ("torch", "triton", "onnxruntime")
    word_timing: bool = False  # whether cross_attention is implemented
    alignment_heads: tuple[tuple[int, int], ...] = ()  # (decoder layer, head) pairs that track timing

    def cross_attention(self, encoded: Any, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One uncached decoder pass over tokens [B, T] (row b against row b of `encoded`) -> logits
        [B, T, vocab] float32 and the cross-attention logits q.k/sqrt(Dh) of `alignment_heads`
        [B, len(alignment_heads), T, S] float32 (before the softmax; S encoder positions). The decoder
        states of earlier calls are not touched. Runners that cannot expose them raise UserError."""
        raise UserError(
            f"word timestamps need the decoder's cross-attention weights, which the {self.info.backend} "
            f"backend does not expose; use one of the backends {', '.join(self.WORD_TIMING_BACKENDS)} "
            "(e.g. --backend torch)"
        )


class LMRunner(Runner):
    """Decoder-only language model with a preallocated, slot-addressed KV cache.

    `config` has at least `vocab_size` and `max_seq_len`; `tokenizer` is the model's
    models.lm_text.LMTokenizer and `chat_template` its Jinja chat template (or None). The cache object
    is the runner's own, exposing `max_batch` and `max_seq`; each slot holds one sequence, so a scheduler
    can add and drop sequences between steps (continuous batching).
    """

    config: Any
    tokenizer: Any
    chat_template: str | None

    @abstractmethod
    def new_cache(self, max_batch: int, max_seq: int) -> Any:
        """Preallocate the KV cache for `max_batch` sequence slots of up to `max_seq` tokens."""

    @abstractmethod
    def prefill(self, cache: Any, slot: int, tokens: torch.Tensor, start: int = 0) -> torch.Tensor:
        """Run tokens [T] into `slot` at positions start..start+T-1 -> logits [vocab] float32 of the last.
        start=0 (re)starts the slot; start=n keeps the first n positions the slot holds (n at most what
        it holds; any later ones are forgotten) and continues from there."""

    def prefill_many(self, cache: Any, jobs: list[tuple[int, torch.Tensor, int]]) -> list[torch.Tensor | Exception]:
        """Several prompts at once, `(slot, tokens, start)` each as for `prefill` -> each one's logits, or
        the exception its prompt raised (the others still run). Here one by one; a runner that can run
        them as one batch overrides this."""
        out: list[torch.Tensor | Exception] = []
        for slot, tokens, start in jobs:
            try:
                out.append(self.prefill(cache, slot, tokens, start))
            except Exception as e:  # noqa: BLE001 - reported to that prompt's caller alone
                out.append(e)
        return out

    @abstractmethod
    def decode_step(self, cache: Any, slots: list[int] | torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """One token [N] for each of `slots` [N] (distinct slots holding sequences of different lengths;
        a host list of ints lets the step be planned without waiting on the device) -> logits [N, vocab]
        float32. Each slot's sequence grows by one position."""

    def prepare(self, cache: Any, slot: int) -> None:
        """Whatever the first requests would otherwise pay for on this cache (captured graphs), done ahead
        through the free `slot`, which it may overwrite; nothing here."""

    def release(self, cache: Any, slot: int) -> None:
        """Free `slot` for a new sequence (what it holds may simply be overwritten later): every runner's cache
        counts each slot's positions in `lengths`."""
        cache.lengths[slot] = 0


def check_cache_size(max_batch: int, max_seq: int) -> None:
    """A cache of `max_batch` slots of `max_seq` positions can exist, or a UserError says why not."""
    if max_batch < 1 or max_seq < 1:
        raise UserError(f"cache needs max_batch >= 1 and max_seq >= 1, got {max_batch}, {max_seq}")


def check_prefill(cache: Any, slot: int, T: int, start: int) -> None:
    """A prompt of T tokens into `slot` from position `start` fits a cache with `max_batch`, `max_seq` and
    `lengths` (every LMRunner's), or a ValueError says why not."""
    if not 0 <= slot < cache.max_batch:
        raise ValueError(f"slot {slot} out of range; the cache has {cache.max_batch} slots")
    if not 0 <= start <= cache.lengths[slot]:
        raise ValueError(
            f"slot {slot} holds {cache.lengths[slot]} positions; prefill must start within them "
            f"(0..{cache.lengths[slot]})"
        )
    if T < 1:
        raise ValueError("prefill needs at least one token")
    if start + T > cache.max_seq:
        raise ValueError(f"sequence of {start + T} tokens does not fit the cache ({cache.max_seq} positions per slot)")


@dataclass
class Latent:
    """A sentence's vocoder input.

    z [1, C, F] float32: F latent frames, `hop_length` samples each. Only frames [0, ready) may be
    computed when the latent is returned (None: all of z is); background work completes the others in
    `pieces`, in frame order: (frames [0, end) are done when it completes, its Future). `vocoder_inputs`
    are what the runner's vocoder reads besides z (the speaker embedding, masks), in the runner's own
    form: callers pass the Latent back unchanged."""

    z: torch.Tensor
    vocoder_inputs: Any = None
    ready: int | None = None
    pieces: list[tuple[int, Future]] = field(default_factory=list)

    @property
    def frames(self) -> int:
        return self.z.shape[-1]

    def wait_for(self, end: int) -> None:
        """Block until frames [0, end) of z are computed."""
        if self.ready is None or end <= self.ready:
            return
        for done, f in self.pieces:
            f.result()
            if done >= end:
                return


class TTSRunner(Runner):
    """Text-to-speech acoustic model + vocoder (VITS), split where streaming needs it: `latent` runs the
    text encoder, durations, prior and flow for a whole sentence; `vocode` turns any window of that latent
    into audio. The streaming (context, crossfade) is written once, in the TTS pipeline; the first-audio windows
    it streams are the runner's plan (plan_windows, backends/tts_plan.py), which a runner's background flow follows."""

    sample_rate: int
    hop_length: int  # audio samples per latent frame
    context_frames: int  # latent frames each side of a window that the vocoder's output inside it depends on
    voice: Any  # models.piper_loader.VoiceConfig
    parallel: int = 1  # vocode calls that may usefully run at once (see vocode_async)
    # a latent with background pieces: their flow's work per frame over the generator's (tts_plan.windows())
    flow_cost: float = 0.0

    @abstractmethod
    def latent(self, phoneme_ids: list[int], options: Any) -> Latent:
        """Phoneme ids of one sentence -> its Latent. `options` is a models.piper_loader.SynthesisOptions."""

    @abstractmethod
    def vocode(self, latent: Latent, start: int, end: int) -> torch.Tensor:
        """Frames [start, end) of `latent` -> float32 audio [(end - start) * hop_length] (CPU tensor).
        Windows shorter than the whole latent see zero padding at their edges: callers add context."""

    def vocode_async(self, latent: Latent, start: int, end: int) -> Future:
        """vocode() as a Future. Runners that can run several windows at once (parallel > 1) override it;
        the default runs synchronously."""
        f: Future = Future()
        f.set_result(self.vocode(latent, start, end))
        return f

    def plan_windows(self, frames: int, options: Any, background: bool) -> list[tuple[int, int]]:
        """The windows a sentence of `frames` latent frames is vocoded in (tts_plan.windows()): the pipeline streams
        them, and a runner that computes the flow in the background (`background`) plans its pieces on them."""
        return windows(
            frames,
            options.first_chunk_frames,
            options.max_chunk_frames,
            max(1, self.parallel),
            self.flow_cost if background else 0.0,
            0 if background else self.context_frames,
        )

    def head_frames(self, frames: int, options: Any) -> int:
        """How many of a sentence's `frames` latent frames to compute before returning its Latent: those
        the first two windows read (windows), context included, so that both can be vocoded at
        once; a runner that can compute the rest in the background does so beside them (the flow's
        receptive field is finite, so the pieces equal the whole)."""
        return min(frames, (1 + WINDOW_GROWTH) * options.first_chunk_frames + self.context_frames)


class FamilyNotSupported(UserError, NotImplementedError):
    """A backend asked for a model family it does not run; the message names the backends that do."""

    def __init__(self, backend: str, family: str):
        from .registry import available

        what = {"asr": "speech recognition", "lm": "language", "tts": "speech synthesis"}[family]
        super().__init__(
            f"backend {backend!r} does not run {what} models; backends that do here: "
            f"{', '.join(available(family)) or 'none'}"
        )


class Backend(ABC):
    """A way to run models: builds one runner per model family from a resolved model.

    `step_threads`: CPU threads for the small ops of one step and of the caller's loop around it
    (None: all; 1: no thread barriers, robust when other work shares the cores). Backends that do not
    run on the CPU's threads ignore it."""

    name: str
    families: tuple[str, ...] = ()  # the model families it runs: asr, lm, tts

    def asr(self, model, device: str = "cpu", dtype: str | None = None, step_threads: int | None = None) -> ASRRunner:
        raise FamilyNotSupported(self.name, "asr")

    def lm(self, model, device: str = "cpu", dtype: str | None = None, step_threads: int | None = None) -> LMRunner:
        raise FamilyNotSupported(self.name, "lm")

    def tts(self, model, device: str = "cpu", dtype: str | None = None, step_threads: int | None = None) -> TTSRunner:
        raise FamilyNotSupported(self.name, "tts")
