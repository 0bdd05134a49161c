"""Speech recognition API: `load_asr(...)` -> SpeechRecognizer with `.transcribe(audio)`."""
from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import numpy as np

from speechrt.backends import get as get_backend
from speechrt.errors import UserError
from speechrt.models.asr_decoding import TranscribeOptions, Transcript, WhisperDecoder
from speechrt.models.audio import SAMPLE_RATE, load_audio
from speechrt.models.registry import resolve
from speechrt.models.whisper_tokenizer import WhisperTokenizer

_OPTION_NAMES = {f.name for f in fields(TranscribeOptions)}


class SpeechRecognizer:
    """A Whisper model on one backend and device. Thread-compatible, not thread-safe."""

    def __init__(self, model: str | Path | None = None, backend: str = "torch", device: str = "cpu",
                 dtype: str | None = None, loop_threads: int | None = None):
        self.model = resolve(model, "asr")
        # loop_threads: see TorchASRRunner (1 = robust when other work shares the CPU cores)
        self.runner = get_backend(backend).asr(self.model, device=device, dtype=dtype, loop_threads=loop_threads)
        w = getattr(self.runner, "weights_info", None)
        tok_path = w.tokenizer_path if w is not None else self.model.path / "tokenizer.json"
        cfg = self.runner.config
        self.tokenizer = WhisperTokenizer(tok_path, cfg.is_multilingual, cfg.num_languages)
        self.decoder = WhisperDecoder(self.runner, self.tokenizer)

    def transcribe(self, audio, sample_rate: int | None = None, on_segment=None, **options) -> Transcript:
        """Transcribe a file path (WAV/FLAC/OGG/MP3, any rate and channel count) or an array (float32 in
        [-1, 1] or int16, with `sample_rate`). Options are TranscribeOptions fields (beam_size, language,
        temperatures, initial_prompt, without_timestamps, ...)."""
        unknown = set(options) - _OPTION_NAMES
        if unknown:
            raise UserError(f"unknown transcription option(s) {', '.join(sorted(unknown))}; valid: {', '.join(sorted(_OPTION_NAMES))}")
        if "temperatures" in options and isinstance(options["temperatures"], (int, float)):
            options["temperatures"] = (float(options["temperatures"]),)
        opts = TranscribeOptions(**options)
        if isinstance(audio, (str, Path)):
            pcm = load_audio(audio)
        else:
            pcm = load_audio(np.asarray(audio), source_rate=sample_rate or SAMPLE_RATE)
        return self.decoder.transcribe(pcm, opts, on_segment=on_segment)


def load_asr(model: str | Path | None = None, backend: str = "torch", device: str = "cpu",
             dtype: str | None = None, loop_threads: int | None = None) -> SpeechRecognizer:
    return SpeechRecognizer(model, backend, device, dtype, loop_threads)
