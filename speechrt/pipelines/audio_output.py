"""Synthesized audio out: chunks encoded as they are made (float32, pcm16, WAV; MP3, Opus, AAC and FLAC through
audio_codecs), and audio files written from the chunks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from speechrt.errors import UserError
from speechrt.models.audio import StreamResampler

from .audio_codecs import CODECS, StreamEncoder, av_module

FORMATS = ("wav", "pcm16", "f32")  # streamed as synthesized
# compressed formats, encoded with PyAV (audio_codecs.CODECS: name -> container, encoder, rates, bit rate, media type)
ENCODINGS = CODECS


class AudioEncoder:
    """Float32 chunks at `in_rate` -> chunks at `out_rate` as float32 ('f32'), int16 bytes ('pcm16'); 'wav' is
    pcm16 with a header (see wav_header). Resampling is streamed (soxr), so chunk borders stay seamless."""

    def __init__(self, in_rate: int, out_rate: int | None = None, format: str = "f32"):
        if format not in FORMATS:
            raise UserError(f"unknown audio format {format!r}; valid: {', '.join(FORMATS)}")
        out_rate = in_rate if out_rate is None else out_rate
        if not (4000 <= out_rate <= 192000):
            raise UserError(f"output sample rate must be in [4000, 192000] Hz, got {out_rate}")
        self.in_rate, self.out_rate, self.format = in_rate, out_rate, format
        self._rs = StreamResampler(in_rate, out_rate)

    def _out(self, x: np.ndarray):
        if self.format == "f32":
            return x.astype(np.float32, copy=False)
        return (np.clip(x, -1.0, 1.0) * 32767.0).round().astype("<i2").tobytes()

    def feed(self, chunk) -> np.ndarray | bytes:
        return self._out(self._rs(chunk.numpy() if isinstance(chunk, torch.Tensor) else chunk))

    def flush(self) -> np.ndarray | bytes:
        return self._out(self._rs(np.zeros(0, np.float32), last=True))


def check_encoding(fmt: str) -> None:
    """UserError if `fmt` (ENCODINGS) cannot be encoded here: PyAV is missing."""
    av_module()


def wav_header(sample_rate: int, n_samples: int | None) -> bytes:
    """44-byte PCM16 mono WAV header; n_samples None writes the 'unknown length' sizes used for streams."""
    import struct

    data = 0xFFFFFFFF - 36 if n_samples is None else n_samples * 2
    return (
        b"RIFF"
        + struct.pack("<I", min(0xFFFFFFFF, 36 + data))
        + b"WAVEfmt "
        + struct.pack("<IHHIIHH", 16, 1, 1, sample_rate, sample_rate * 2, 2, 16)
        + b"data"
        + struct.pack("<I", data)
    )


def check_file_format(fmt: str) -> None:
    """UserError unless `fmt` is a format files are written in (FORMATS, ENCODINGS) that can be encoded here."""
    if fmt not in FORMATS and fmt not in ENCODINGS:
        raise UserError(f"unknown audio format {fmt!r}; valid: {', '.join(FORMATS + tuple(ENCODINGS))}")
    if fmt in ENCODINGS:
        check_encoding(fmt)


def format_for_path(path) -> str:
    """The format of a file by its suffix (.wav, .raw/.pcm/.s16 = pcm16, .f32, .flac, .mp3, .opus/.ogg, .aac); stdout
    and file objects: wav."""
    if path == "-" or hasattr(path, "write"):
        return "wav"
    suf = Path(path).suffix.lower()
    by_suffix = {
        ".wav": "wav",
        ".raw": "pcm16",
        ".pcm": "pcm16",
        ".s16": "pcm16",
        ".f32": "f32",
        ".flac": "flac",
        ".mp3": "mp3",
        ".opus": "opus",
        ".ogg": "opus",
        ".aac": "aac",
    }
    if suf and suf not in by_suffix:  # (no file is opened: the path is left as it was)
        raise UserError(
            f"cannot write {suf!r} audio files: valid suffixes are {', '.join(by_suffix)} (.raw, .pcm and "
            ".s16 are 16-bit PCM, .f32 float32 samples, .ogg Ogg Opus, .aac AAC in ADTS), or name the format "
            "(format=..., --format)"
        )
    return by_suffix.get(suf, "wav")


def write_audio(gen, path, fmt: str, rate: int) -> None:
    """Write the chunks of `gen` (float32 arrays or bytes, at `rate`) to `path` ('-' = stdout; a binary file
    object works too) as `fmt`: 'wav' (its header's sizes set at the end where the file can seek), 'pcm16' or
    'f32' as they come, or a format of ENCODINGS encoded as they come."""
    import sys

    close = False
    if path == "-":
        f = sys.stdout.buffer
    elif hasattr(path, "write"):
        f = path
    else:
        f, close = open(Path(path), "wb"), True
    try:
        n = 0
        seekable = f.seekable() if hasattr(f, "seekable") else False
        if fmt == "wav":
            f.write(wav_header(rate, None))
        if fmt in ENCODINGS:  # encoded as the chunks come (StreamEncoder): into the file where it can seek
            gen = _encoded(gen, StreamEncoder(fmt, rate, f if seekable else None))
        for chunk in gen:
            b = chunk if isinstance(chunk, bytes) else np.asarray(chunk, np.float32).tobytes()
            f.write(b)
            f.flush() if path == "-" else None
            n += len(b)
        if fmt == "wav" and seekable:
            f.seek(0)
            f.write(wav_header(rate, n // 2))
    finally:
        if close:
            f.close()


def _encoded(gen, enc):
    for chunk in gen:
        yield enc.feed(chunk)
    yield enc.flush()
