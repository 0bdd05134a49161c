"""Per-call speech synthesis controls (SynthesisOptions): checked when made, their defaults taken from a Piper
voice's config (models/piper_loader.py VoiceConfig) when resolved against it."""

from __future__ import annotations

from dataclasses import dataclass, replace

from speechrt.errors import UserError


@dataclass(frozen=True)
class SynthesisOptions:
    """Synthesis controls. None means the voice's default (from its .onnx.json)."""

    length_scale: float | None = None  # > 1 speaks slower; speaking rate r is length_scale = default / r
    noise_scale: float | None = None  # prior sampling noise (voice quality variation); 0 = deterministic
    noise_w: float | None = None  # duration noise (rhythm variation); 0 = deterministic
    speaker_id: int | None = None  # multi-speaker voices only
    seed: int | None = None  # torch backend: reproducible noise
    first_chunk_frames: int = 16  # latent frames of the first window: 16 * 256 / 22050 = 0.19 s of audio
    max_chunk_frames: int = 400  # windows grow up to this size (pipelines.tts.windows)
    crossfade: int = 256  # samples blended at each window border
    sentence_silence: float = 0.0  # seconds of silence after each sentence

    def __post_init__(self):
        for name, lo, hi in (("length_scale", 0.05, 20.0), ("noise_scale", 0.0, 2.0), ("noise_w", 0.0, 2.0)):
            v = getattr(self, name)
            if v is not None and not (lo <= v <= hi):
                raise UserError(f"{name} must be in [{lo}, {hi}], got {v}")
        if self.speaker_id is not None and (not isinstance(self.speaker_id, int) or self.speaker_id < 0):
            raise UserError(f"speaker_id must be a non-negative integer, got {self.speaker_id!r}")
        if not (1 <= self.first_chunk_frames <= self.max_chunk_frames):
            raise UserError(
                f"need 1 <= first_chunk_frames <= max_chunk_frames, got "
                f"{self.first_chunk_frames}, {self.max_chunk_frames}"
            )
        if self.crossfade < 0:
            raise UserError(f"crossfade must be >= 0 samples, got {self.crossfade}")
        if not (0.0 <= self.sentence_silence <= 10.0):
            raise UserError(f"sentence_silence must be in [0, 10] seconds, got {self.sentence_silence}")

    def resolved(self, voice) -> SynthesisOptions:
        """Defaults filled from the voice; speaker id checked against it."""
        sid = self.speaker_id
        if voice.num_speakers <= 1:
            if sid not in (None, 0):
                raise UserError(f"voice {voice.name!r} has a single speaker; speaker_id {sid} is not valid")
            sid = None
        elif sid is not None and sid >= voice.num_speakers:
            raise UserError(
                f"speaker_id {sid} out of range: voice {voice.name!r} has speakers 0..{voice.num_speakers - 1}"
            )
        return replace(
            self,
            speaker_id=sid,
            length_scale=voice.length_scale if self.length_scale is None else self.length_scale,
            noise_scale=voice.noise_scale if self.noise_scale is None else self.noise_scale,
            noise_w=voice.noise_w if self.noise_w is None else self.noise_w,
        )
