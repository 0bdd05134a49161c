"""The options of a Whisper transcription (TranscribeOptions), checked when made: the decoding strategy and
its fallback ladder, the guards against silence and hallucination, trimmed windows, VAD, word times."""

from __future__ import annotations

from dataclasses import dataclass, fields

from speechrt.errors import UserError
from speechrt.models.audio import CHUNK_LENGTH

from .speech_regions import VadOptions

# annotation -> the Python types a value of it may have (bool is an int to isinstance: it is allowed only where named)
SCALAR_TYPES = {
    "bool": (bool,),
    "int": (int,),
    "float": (int, float),
    "str": (str,),
    "str | None": (str, type(None)),
    "int | None": (int, type(None)),
    "float | None": (int, float, type(None)),
    "bool | None": (bool, type(None)),
}


@dataclass(frozen=True)
class TranscribeOptions:
    beam_size: int = 1  # 1 = greedy (at temperature 0)
    patience: float = 1.0
    length_penalty: float | None = None
    temperatures: tuple[float, ...] = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)  # fallback ladder
    best_of: int = 5  # candidates sampled at temperature > 0
    compression_ratio_threshold: float | None = 2.4
    logprob_threshold: float | None = -1.0
    no_speech_threshold: float | None = 0.6
    condition_on_previous_text: bool = True
    initial_prompt: str | None = None
    without_timestamps: bool = False
    max_initial_timestamp: float = 1.0
    suppress_blank: bool = True
    suppress_tokens: tuple[int, ...] = (-1,)
    language: str | None = None  # None: English for .en models, detected for multilingual ones
    task: str = "transcribe"
    sample_len: int | None = None  # max tokens per window; default n_text_ctx // 2
    # encode only the frames that hold the audio, plus trim_margin seconds of the padding after it, instead of
    # the whole 30 s window Whisper was trained on (the encoder's work in proportion to the audio; whisper.cpp's
    # audio_ctx). True: every utterance of a batch, and every long-form window with less than 30 s of audio;
    # None (the default): long-form's windows after a recording's first (its last, which holds what is left);
    # False: never (faster-whisper's windows exactly). The default and its 5-s margin are measured
    # (benchmarks.trim_study, docs/onnx-runtime.md): on 19 recordings of 34-65 s the WER of whole windows
    # (int8 3.08 -> 2.93 %, float32 3.26 -> 3.23 %); on ONNX Runtime int8 5-16 % faster over three runs,
    # float32 between 2 % slower and 14 % faster (torch 2 % faster); 1-3 s margins lose words or loop.
    # The server passes its own: 1 s for live transcripts, 3 s for finals (streaming.asr_options.asr_options).
    trim_context: bool | None = None
    trim_margin: float = 5.0
    # batches of utterances: a row whose text ends with one span repeated this many times stops there,
    # keeping one copy (a greedy loop, "Turn off the lights... Turn off the lights..."); and (transcribe_batch)
    # a whole text of two or more copies said faster than anyone speaks keeps one; 0: off
    stop_repeats: int = 0
    seed: int = 0
    # long-form: each segment's words with their start/end (cross-attention alignment, see whisper_timing)
    word_timestamps: bool = False
    # with word_timestamps: a likely hallucination (improbable, too short or too long words) after more than
    # this many seconds of silence is skipped (faster-whisper's); None: off
    hallucination_silence_threshold: float | None = None
    # silence gate: a 30-s window (or an utterance) whose loudest 10 ms hop is quieter than this (dBFS) is
    # silence and is not decoded (Whisper invents "you" over digital silence); None: off
    silence_level_db: float | None = -60.0
    # transcribe(): decode only the speech regions Silero VAD finds (vad_parameters: VadOptions or a dict
    # of its fields), times mapped back to the recording
    vad_filter: bool = False
    vad_parameters: VadOptions | dict | None = None

    def __post_init__(self):
        def bad(msg):
            raise UserError(f"invalid transcription option: {msg}")

        for f in fields(self):  # the scalar fields' types first: the checks below compare them
            v, kinds = getattr(self, f.name), SCALAR_TYPES.get(f.type)
            if kinds is not None and (not isinstance(v, kinds) or (isinstance(v, bool) and bool not in kinds)):
                bad(f"{f.name} must be {f.type.replace(' | None', ' or None')}, got {v!r}")
        if self.beam_size < 1:
            bad(f"beam_size must be >= 1, got {self.beam_size}")
        if self.best_of < 1:
            bad(f"best_of must be >= 1, got {self.best_of}")
        if self.patience <= 0:
            bad(f"patience must be > 0, got {self.patience}")
        if not self.temperatures or any(not (0 <= t <= 2) for t in self.temperatures):
            bad(f"temperatures must be a non-empty list of values in [0, 2], got {self.temperatures}")
        if self.task not in ("transcribe", "translate"):
            bad(f"task must be 'transcribe' or 'translate', got {self.task!r}")
        if self.sample_len is not None and self.sample_len < 1:
            bad(f"sample_len must be >= 1, got {self.sample_len}")
        if self.stop_repeats < 0 or self.stop_repeats == 1:
            bad(f"stop_repeats must be 0 (off) or >= 2, got {self.stop_repeats}")
        if not 0 <= self.trim_margin <= CHUNK_LENGTH:
            bad(f"trim_margin must be in [0, {CHUNK_LENGTH}] seconds, got {self.trim_margin}")
        if self.hallucination_silence_threshold is not None and (
            not self.word_timestamps or self.hallucination_silence_threshold < 0
        ):
            bad(
                f"hallucination_silence_threshold ({self.hallucination_silence_threshold}) must be >= 0 seconds "
                "and needs word_timestamps=True (it judges words)"
            )
        if self.silence_level_db is not None and not -200 <= self.silence_level_db <= 0:
            bad(f"silence_level_db must be None (off) or in [-200, 0] dBFS, got {self.silence_level_db}")
        object.__setattr__(
            self,
            "vad_parameters",
            VadOptions.parse(self.vad_parameters) if self.vad_filter or self.vad_parameters is not None else None,
        )


OPTION_NAMES = frozenset(f.name for f in fields(TranscribeOptions))


def options_from_keywords(**options) -> TranscribeOptions:
    """TranscribeOptions from keywords (one number for `temperatures` is a ladder of one), with an error that
    names the valid ones."""
    unknown = set(options) - OPTION_NAMES
    if unknown:
        raise UserError(
            f"unknown transcription option(s) {', '.join(sorted(unknown))}; valid: {', '.join(sorted(OPTION_NAMES))}"
        )
    if "temperatures" in options and isinstance(options["temperatures"], (int, float)):
        options["temperatures"] = (float(options["temperatures"]),)
    return TranscribeOptions(**options)
