"""The speech recognition pipeline: an ASR runner, its front end (log-mel, Whisper tokenizer) and the
decoding loops (whisper_decoding). `speechrt.load_asr(...)` returns one; so does the server's engine use it.

    asr = speechrt.load_asr()                          # the embedded Whisper tiny.en on the CPU, backend auto
    asr.transcribe("talk.wav").text                    # any length (long-form)
    asr.detect_language("talk.wav", k=3)               # [('de', 0.97), ...] (multilingual models)
    asr.transcribe_batch([a, b], drafts=[None, prev])  # short utterances of several streams in one batch
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from speechrt import backends
from speechrt.backends.cuda_graphs import rows_bucket
from speechrt.errors import UserError
from speechrt.models.audio import (
    CHUNK_LENGTH,
    HOP_LENGTH,
    N_FRAMES,
    SAMPLE_RATE,
    is_encoded_audio,
    load_audio,
    trimmed_frames,
    utterance_mel,
    utterance_mels,
)
from speechrt.models.registry import resolve
from speechrt.models.whisper_tokenizer import WhisperTokenizer

from .speech_regions import VadOptions, hop_levels_db, is_quiet
from .transcribe_options import TranscribeOptions, options_from_keywords
from .whisper_decoding import WindowDecoder, WindowResult, decode_utterances
from .whisper_long_form import Transcript, recording_steps, timed_segments
from .whisper_loops import cut_repeat_said_too_fast
from .whisper_search import TranscriptionCancelled
from .whisper_timing import Word, alignment_steps

MULTILINGUAL = (
    "a multilingual Whisper model (a Hugging Face or CTranslate2 directory, or an openai-whisper .pt, of "
    "tiny, base, small, medium or large: not the .en ones)"
)
MAX_UTTERANCE_SAMPLES = N_FRAMES * HOP_LENGTH  # one 30-second window
SAMPLE_SPEECH = Path(__file__).resolve().parent.parent / "data" / "sample.wav"  # 7.4 s of the embedded voice

__all__ = [
    "ASRPipeline",
    "load_asr",
    "TranscribeOptions",
    "Transcript",
    "WindowResult",
    "TranscriptionCancelled",
    "Word",
    "VadOptions",
    "SAMPLE_RATE",
    "MAX_UTTERANCE_SAMPLES",
    "segment_windows",
]


class ASRPipeline:
    """A Whisper model on one backend and device. Thread-compatible, not thread-safe."""

    sample_rate = SAMPLE_RATE  # what transcribe_batch takes: float32 mono at 16 kHz

    def __init__(self, runner, name: str = ""):
        self.runner = runner
        self.name = name or runner.info.model
        cfg = runner.config
        self.tokenizer = WhisperTokenizer(runner.tokenizer_path, cfg.is_multilingual, cfg.num_languages)
        self.decoder = WindowDecoder(runner, self.tokenizer)

    @property
    def info(self):
        return self.runner.info

    # -- options ----------------------------------------------------------------------------------
    def languages(self) -> list[str]:
        """Language codes this model recognizes (['en'] for English-only models)."""
        return list(self.tokenizer.languages) if self.tokenizer.multilingual else ["en"]

    def check_language(self, language: str | None) -> str | None:
        """`language` if this model recognizes it (None: detect, or English for English-only models)."""
        if language is None or language in self.languages():
            return language
        valid = self.languages()
        shown = ", ".join(valid[:12]) + (", ..." if len(valid) > 12 else "")
        only = f" (an English-only model); for other languages use {MULTILINGUAL}" if valid == ["en"] else ""
        raise UserError(f"language {language!r} is not recognized by {self.name}; valid: {shown}{only}")

    def options(self, **options) -> TranscribeOptions:
        """TranscribeOptions from keywords, with errors that name the valid ones."""
        opts = options_from_keywords(**options)
        self.check_language(opts.language)
        if opts.word_timestamps and not self.runner.word_timing:
            raise UserError(
                f"word timestamps are not available on the {self.info.backend} backend (it does not expose "
                f"the decoder's cross-attention); use one of: {', '.join(self.runner.WORD_TIMING_BACKENDS)}"
            )
        if opts.task == "translate" and not self.tokenizer.multilingual:
            raise UserError(f"{self.name} is an English-only model: it cannot translate; use {MULTILINGUAL}")
        return opts

    def detect_language(self, audio, k: int = 5, sample_rate: int | None = None) -> list[tuple[str, float]]:
        """The `k` most likely languages of the audio's first 30 seconds (a file path, or an array as
        transcribe() takes) with their probabilities, most likely first: [('de', 0.97), ('nl', 0.01), ...].
        An English-only model answers [('en', 1.0)]."""
        if k < 1:
            raise UserError(f"k must be >= 1, got {k}")
        if not self.tokenizer.multilingual:
            return [("en", 1.0)]
        pcm = self._pcm(audio, sample_rate)[:MAX_UTTERANCE_SAMPLES]
        with torch.inference_mode(), self.runner.loop():
            mel = utterance_mel(pcm, self.runner.config.n_mels, self.runner.device)[None]
            return self.decoder.language_probabilities(self.runner.encode(mel), 1, k)[0]

    @staticmethod
    def _pcm(audio, sample_rate: int | None) -> np.ndarray:
        if isinstance(audio, (str, Path)) or is_encoded_audio(audio):  # a file, its bytes, a file object
            return load_audio(audio)
        return load_audio(np.asarray(audio), source_rate=SAMPLE_RATE if sample_rate is None else sample_rate)

    # -- transcription ----------------------------------------------------------------------------
    def transcribe(self, audio, sample_rate: int | None = None, on_segment=None, **options) -> Transcript:
        """Transcribe a file path (WAV/FLAC/OGG/MP3, any rate and channel count) or an array (float32 in
        [-1, 1] or int16, with `sample_rate`), of any length. Options are TranscribeOptions fields
        (beam_size, language, temperatures, initial_prompt, without_timestamps, ...); `on_segment(seg)` is
        called as each segment is decoded."""
        return run_steps(self.transcribe_steps(self._pcm(audio, sample_rate), self.options(**options), on_segment))

    def transcribe_steps(self, audio: np.ndarray, opts: TranscribeOptions, on_segment=None):
        """transcribe() of float32 audio at 16 kHz as a generator of steps, one 30-s window each (yielding
        the seconds done), that returns the Transcript: a scheduler runs one step at a time between other
        work (see whisper_long_form.long_form_steps). `on_segment(seg)`: called as each segment is decoded."""
        self.check_language(opts.language)
        return (yield from recording_steps(self.decoder, audio, opts, on_segment))

    def transcribe_batch(
        self,
        audios: list[np.ndarray],
        opts: TranscribeOptions | None = None,
        drafts: list[list[int] | None] | None = None,
        stop=None,
    ) -> list[WindowResult]:
        """Greedy transcripts of several short utterances (float32 at 16 kHz, each at most 30 s) in one
        batch — the step a scheduler runs for the turns of several sessions (see decode_utterances).
        `drafts`: per utterance, the tokens of an earlier transcript of (the start of) the same speech,
        checked in one pass. `stop()`: asked between steps and encoder blocks; True abandons the work
        with TranscriptionCancelled."""
        opts = opts or TranscribeOptions(without_timestamps=True)
        self.check_language(opts.language)
        if not audios:
            return []
        if any(len(a) > MAX_UTTERANCE_SAMPLES for a in audios):
            raise ValueError("transcribe_batch takes utterances of at most 30 seconds; use transcribe() for long audio")
        # the silence gate: quiet utterances are not decoded (no text, no-speech probability 1)
        loud = [i for i, a in enumerate(audios) if not is_quiet(hop_levels_db(a), opts)]
        if len(loud) < len(audios):
            out = [WindowResult([], "", 0.0, 1.0, 0.0, 0.0) for _ in audios]
            if loud:
                got = self.transcribe_batch(
                    [audios[i] for i in loud], opts, None if drafts is None else [drafts[i] for i in loud], stop
                )
                for i, r in zip(loud, got):
                    out[i] = r
            return out
        with torch.inference_mode(), self.runner.loop():
            # as in transcribe(): the content frames, zero-padded to a full window (openai/whisper pads in
            # the log-mel domain), or to as much of one as the longest utterance needs; all in one pass
            frames, length = None, N_FRAMES
            if opts.trim_context and self.runner.trims and audios:
                frames, length = trimmed_frames([len(a) // HOP_LENGTH for a in audios], opts.trim_margin)
            mels = utterance_mels(audios, self.runner.config.n_mels, self.runner.device, length)
            out = decode_utterances(self.decoder, mels, opts, drafts, stop, frames)
        if opts.stop_repeats:
            for res, a in zip(out, audios):
                cut_repeat_said_too_fast(res, self.tokenizer, len(a) / SAMPLE_RATE)
        return out

    def closed_segments(self, result: WindowResult, tokens: bool = False) -> list[tuple]:
        """The segments of a transcript made with timestamps that two consecutive timestamps close:
        (start s, end s, text) from the audio's start, and their token ids if `tokens`; not the open one at
        its end."""
        tok = self.tokenizer
        prec = CHUNK_LENGTH / self.runner.config.n_audio_ctx
        return [
            (a, b, tok.decode(part)) + ((part,) if tokens else ())
            for a, b, part in timed_segments(result.tokens, tok.timestamp_begin, prec)
        ]

    def align(
        self,
        audio: np.ndarray,
        tokens: list[int],
        language: str | None = None,
        task: str = "transcribe",
        trim_margin: float | None = None,
    ) -> tuple[list[Word], list[tuple[int, bytes, float]]]:
        """Word times and token log probabilities of `tokens`, a transcript of `audio` (float32 at 16 kHz, at
        most 30 s; e.g. a transcribe_batch result's tokens) -> (words with start/end in seconds from the
        audio's start, [(token, its bytes, log probability among the text tokens)]). One encoder pass and
        one decoder pass over the tokens (the server runs it only for sessions that ask, and where a long turn's
        rounds agree on words but on no segment). `trim_margin`: the encoder reads the audio and this many
        seconds of padding, not a whole window (as transcribe_batch's trim_context; on runners that trim)."""
        return run_steps(self.align_steps(audio, tokens, language, task, trim_margin))

    def align_steps(self, audio: np.ndarray, tokens: list[int], language=None, task="transcribe", trim_margin=None):
        """align() as a generator of two steps, the encoder pass, then the decoder pass and the word times
        (yielding None between them), that returns align's result: a scheduler runs other work in between."""
        if len(audio) > MAX_UTTERANCE_SAMPLES:
            raise ValueError("align takes audio of at most 30 seconds")
        if not self.runner.word_timing:
            raise UserError(
                f"word timestamps are not available on the {self.info.backend} backend; use one of: "
                f"{', '.join(self.runner.WORD_TIMING_BACKENDS)}"
            )
        tok = self.tokenizer
        text = [t for t in tokens if t < tok.eot]
        if not text:
            return [], []
        language = self.check_language(language) or (None if tok.multilingual else "en")
        frames = trimmed_frames([len(audio) // HOP_LENGTH], trim_margin)[1] if trim_margin is not None else None
        return (yield from alignment_steps(self.runner, self.decoder, tok, audio, text, language, task, frames))

    def warm_up(self, max_batch: int = 1) -> None:
        """Run the model once on this thread: the first call in a thread pays for its thread pool, kernel
        choices and allocations. On a GPU, also a batch of each batch-size bucket up to `max_batch`
        (warm_batches)."""
        noise = np.random.default_rng(0).standard_normal(SAMPLE_RATE).astype(np.float32) * 1e-3
        # faint noise, decoded anyway, over the trimmed window the server's transcripts use (a whole 30-s window
        # twice took 1.6 s on the torch runner: a server's first turns waited behind it)
        opts = TranscribeOptions(without_timestamps=True, silence_level_db=None, trim_context=True, trim_margin=1.0)
        first = self.transcribe_batch([noise], opts)[0]
        self.transcribe_batch([noise], opts, drafts=[first.tokens or [0]])
        if self.runner.device.type != "cpu":
            self.warm_batches(max_batch)

    def warm_batches(self, max_batch: int) -> None:
        """Transcribe one batch of real speech of each batch-size bucket up to `max_batch` (2, 4, 8, ..., and
        `max_batch` itself) as a server does: with a final's margin, then a live round's, drafted with the
        final's words. On a GPU each batch compiles the Triton kernels of its shapes and captures its bucket's
        decode graph (backends.triton.asr): work a server would otherwise do in its first loaded seconds (on
        an H200 at 64 streams, 59 % of the engine's busy time in them, final p95 3.9 s; docs/gpu.md)."""
        speech = load_audio(SAMPLE_SPEECH)
        final, live = (
            TranscribeOptions(without_timestamps=True, trim_context=True, trim_margin=m, stop_repeats=3)
            for m in (10.0, 1.0)
        )
        sizes = sorted({min(rows_bucket(n), max_batch) for n in range(2, max_batch + 1)})
        for n in sizes:
            # utterances of 1.5 to 7 s, each its own length (the encoder's rows differ as a server's do)
            clips = [speech[: int(SAMPLE_RATE * (1.5 + (i * 1.7) % 5.5))] for i in range(n)]
            done = self.transcribe_batch(clips, final)
            self.transcribe_batch(clips, live, drafts=[r.tokens for r in done])
        self.runner.warm_graphs()


def run_steps(steps):
    """A generator of steps (transcribe_steps, align_steps) run to its end at once -> what it returns."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value


def load_asr(
    model: str | Path | None = None,
    backend: str = "auto",
    device: str = "cpu",
    dtype: str | None = None,
    step_threads: int | None = None,
) -> ASRPipeline:
    """A registered name or a path (CTranslate2 / Hugging Face directory, openai-whisper .pt; None: the
    embedded Whisper tiny.en). `step_threads`: CPU threads of the decoding loop's small ops (1: robust
    when other work shares the cores; None: all)."""
    m = resolve(model, "asr")
    return ASRPipeline(backends.get(backend).asr(m, device=device, dtype=dtype, step_threads=step_threads), m.name)


ALIGN_LEAD = SAMPLE_RATE // 2  # audio before a group of segments' start that its alignment sees


def segment_windows(segments, samples: int) -> list[tuple[int, int, list[int]]]:
    """Consecutive segments grouped into spans of at most 30 s (the audio a lead of ALIGN_LEAD before them) ->
    [(first sample, end sample, the group's tokens)]; a recording of one window is one group, all of it."""
    if samples <= MAX_UTTERANCE_SAMPLES:
        return [(0, samples, [t for seg in segments for t in seg.tokens])]
    groups: list[tuple[int, int, list[int]]] = []
    for seg in segments:
        a = min(samples, max(0, round(seg.start * SAMPLE_RATE) - ALIGN_LEAD))
        b = min(samples, round(seg.end * SAMPLE_RATE) + ALIGN_LEAD // 5)
        if groups and b - groups[-1][0] <= MAX_UTTERANCE_SAMPLES:
            start, _, tokens = groups[-1]
            groups[-1] = (start, max(b, groups[-1][1]), tokens + list(seg.tokens))
        else:
            groups.append((a, min(b, a + MAX_UTTERANCE_SAMPLES), list(seg.tokens)))
    return groups
