"""Synthesized audio out: chunks encoded as they are made (float32, pcm16, WAV), whole recordings encoded at the
end (FLAC, MP3, Opus through libsndfile), and audio files written from the chunks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from speechrt.errors import UserError

FORMATS = ("wav", "pcm16", "f32")  # streamed as synthesized
# files encoded whole at their end, through libsndfile (soundfile): name -> (major format, subtype, the sample
# rates the codec takes; None: any)
ENCODINGS = {
    "flac": ("FLAC", "PCM_16", None),
    "mp3": ("MP3", "MPEG_LAYER_III", (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000)),
    "opus": ("OGG", "OPUS", (8000, 12000, 16000, 24000, 48000)),
}


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
        self._rs = None
        if out_rate != in_rate:
            import soxr

            self._rs = soxr.ResampleStream(in_rate, out_rate, 1, dtype="float32", quality="HQ")

    def _out(self, x: np.ndarray):
        if self.format == "f32":
            return x.astype(np.float32, copy=False)
        return (np.clip(x, -1.0, 1.0) * 32767.0).round().astype("<i2").tobytes()

    def feed(self, chunk) -> np.ndarray | bytes:
        x = chunk.numpy() if isinstance(chunk, torch.Tensor) else np.asarray(chunk, dtype=np.float32)
        if self._rs is not None:
            x = self._rs.resample_chunk(x.astype(np.float32, copy=False), last=False)
        return self._out(x)

    def flush(self) -> np.ndarray | bytes:
        if self._rs is None:
            return self._out(np.zeros(0, np.float32))
        return self._out(self._rs.resample_chunk(np.zeros(0, np.float32), last=True))


def check_encoding(fmt: str) -> None:
    """UserError if the libsndfile that soundfile loaded cannot write `fmt` (MP3 and Opus need libsndfile >= 1.1,
    which soundfile's wheels carry; a system library may be older)."""
    import soundfile as sf

    major, subtype, _ = ENCODINGS[fmt]
    if major not in sf.available_formats() or subtype not in sf.available_subtypes(major):
        raise UserError(
            f"this libsndfile ({sf.__libsndfile_version__}) cannot write {fmt}: install soundfile's own "
            "wheel (pip install --force-reinstall 'soundfile>=0.12', libsndfile 1.2 with MP3 and Opus), "
            "or ask for wav, pcm or flac"
        )


def encode_audio(samples: np.ndarray, rate: int, fmt: str) -> tuple[bytes, int]:
    """A whole recording (mono float32 in [-1, 1]) -> the bytes of a `fmt` file (see ENCODINGS) and its sample
    rate: a rate the codec does not take is resampled to the next one up that it does (Opus: 22050 Hz is sent
    at 24000 Hz)."""
    import io

    import soundfile as sf

    check_encoding(fmt)
    major, subtype, rates = ENCODINGS[fmt]
    out_rate = rate if rates is None or rate in rates else next((r for r in rates if r > rate), rates[-1])
    x = np.clip(np.asarray(samples, np.float32), -1.0, 1.0)
    if out_rate != rate:
        import soxr

        x = soxr.resample(x, rate, out_rate, quality="HQ").astype(np.float32, copy=False)
    buf = io.BytesIO()
    with sf.SoundFile(buf, "w", samplerate=out_rate, channels=1, format=major, subtype=subtype) as f:
        f.write(x)
    return buf.getvalue(), out_rate


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
    """UserError unless `fmt` is a format files are written in (FORMATS, ENCODINGS) that this libsndfile can write."""
    if fmt not in FORMATS and fmt not in ENCODINGS:
        raise UserError(f"unknown audio format {fmt!r}; valid: {', '.join(FORMATS + tuple(ENCODINGS))}")
    if fmt in ENCODINGS:
        check_encoding(fmt)


def format_for_path(path) -> str:
    """The format of a file by its suffix (.wav, .raw/.pcm/.s16 = pcm16, .f32, .flac, .mp3, .opus/.ogg); stdout
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
    }
    if suf and suf not in by_suffix:  # (no file is opened: the path is left as it was)
        raise UserError(
            f"cannot write {suf!r} audio files: valid suffixes are {', '.join(by_suffix)} (.raw, .pcm and "
            ".s16 are 16-bit PCM, .f32 float32 samples, .ogg Ogg Opus), or name the format (format=..., "
            "--format)"
        )
    return by_suffix.get(suf, "wav")


def write_audio(gen, path, fmt: str, rate: int) -> None:
    """Write the chunks of `gen` (float32 arrays or bytes, at `rate`) to `path` ('-' = stdout; a binary file
    object works too) as `fmt`: 'wav' (its header's sizes set at the end where the file can seek), 'pcm16' or
    'f32' as they come, or a format of ENCODINGS encoded whole at the end."""
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
        if fmt in ENCODINGS:
            chunks = list(gen)
            data, _ = encode_audio(np.concatenate(chunks) if chunks else np.zeros(0, np.float32), rate, fmt)
            gen = [data]
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
