"""Wire audio formats of the Realtime API: pcm16 little-endian (24 kHz by default, other rates as an
extension), G.711 mu-law and A-law (8 kHz). Input is decoded to float32 mono at 16 kHz for the models,
with a streaming resampler so chunk borders leave no clicks; output is encoded from float32."""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass

import numpy as np

from speechrt.errors import UserError
from speechrt.models.audio import StreamResampler
from speechrt.pipelines.asr import SAMPLE_RATE as MODEL_RATE


class AudioFormatError(UserError, ValueError):
    pass


@dataclass(frozen=True)
class AudioFormat:
    type: str = "audio/pcm"  # audio/pcm | audio/pcmu | audio/pcma
    rate: int = 24000

    @property
    def bytes_per_sample(self) -> int:
        return 2 if self.type == "audio/pcm" else 1

    def to_api(self) -> dict:
        return {"type": self.type, "rate": self.rate}


VALID_FORMATS = "'audio/pcm' (pcm16, 24 kHz by default; rate 8000-48000 accepted), 'audio/pcmu', 'audio/pcma' (8 kHz)"
_BETA = {"pcm16": "audio/pcm", "g711_ulaw": "audio/pcmu", "g711_alaw": "audio/pcma"}


def parse_format(spec) -> AudioFormat:
    """A format from a session config: GA {'type': 'audio/pcm', 'rate': 24000} or beta 'pcm16'."""
    if isinstance(spec, str):
        if spec not in _BETA:
            raise AudioFormatError(
                f"unsupported audio format {spec!r}; valid: pcm16, g711_ulaw, g711_alaw, or {VALID_FORMATS}"
            )
        spec = {"type": _BETA[spec]}
    if not isinstance(spec, dict):
        raise AudioFormatError(
            f"audio format must be an object like {{'type': 'audio/pcm', 'rate': 24000}}, got {spec!r}"
        )
    t = spec.get("type", "audio/pcm")
    if t not in ("audio/pcm", "audio/pcmu", "audio/pcma"):
        raise AudioFormatError(f"unsupported audio format type {t!r}; valid: {VALID_FORMATS}")
    rate = spec.get("rate")
    if t != "audio/pcm":
        if rate not in (None, 8000):
            raise AudioFormatError(f"{t} is 8000 Hz only, got rate {rate}")
        return AudioFormat(t, 8000)
    rate = 24000 if rate is None else rate
    if not isinstance(rate, int) or not 8000 <= rate <= 48000:
        raise AudioFormatError(
            f"unsupported pcm16 rate {rate!r}; valid: an integer from 8000 to 48000 (24000 is the API default)"
        )
    return AudioFormat(t, rate)


def _ulaw_table() -> np.ndarray:
    u = ~np.arange(256, dtype=np.uint8)
    sign = u & 0x80
    exp = (u >> 4) & 0x07
    mant = u & 0x0F
    mag = ((mant.astype(np.int32) << 3) + 0x84) << exp
    val = mag - 0x84
    return np.where(sign != 0, -val, val).astype(np.float32) / 32768.0


def _alaw_table() -> np.ndarray:
    a = np.arange(256, dtype=np.uint8) ^ 0x55
    sign = a & 0x80
    exp = (a >> 4) & 0x07
    mant = (a & 0x0F).astype(np.int32)
    mag = np.where(exp == 0, (mant << 4) + 8, ((mant << 4) + 0x108) << np.maximum(exp.astype(np.int32) - 1, 0))
    return np.where(sign != 0, mag, -mag).astype(np.float32) / 32768.0


ULAW = _ulaw_table()
ALAW = _alaw_table()


def b64decode(data: str) -> bytes:
    if not isinstance(data, str):
        raise AudioFormatError("'audio' must be a base64 string")
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as e:
        raise AudioFormatError(f"'audio' is not valid base64 ({e})") from None


class InputDecoder:
    """Wire bytes -> float32 mono at 16 kHz, resampling across chunk borders."""

    def __init__(self, fmt: AudioFormat):
        self.fmt = fmt
        self._rs = StreamResampler(fmt.rate, MODEL_RATE)

    def decode(self, raw: bytes, last: bool = False) -> np.ndarray:
        """`last`: the stream ends here (the resampler's held-back samples come out too)."""
        if self.fmt.type == "audio/pcm":
            if len(raw) % 2:
                raise AudioFormatError(
                    f"pcm16 audio must have an even number of bytes, got {len(raw)} "
                    f"(the session's input format is {self.fmt.type} at {self.fmt.rate} Hz)"
                )
            x = np.frombuffer(raw, "<i2").astype(np.float32) / 32768.0
        else:
            x = (ULAW if self.fmt.type == "audio/pcmu" else ALAW)[np.frombuffer(raw, np.uint8)]
        return self._rs(x, last=last)


class OutputEncoder:
    """float32 audio at the synthesizer's rate -> wire bytes in the session's output format."""

    def __init__(self, in_rate: int, fmt: AudioFormat):
        self.fmt = fmt
        self._rs = StreamResampler(in_rate, fmt.rate)

    def encode(self, x: np.ndarray, last: bool = False) -> bytes:
        x = self._rs(x, last=last)
        if self.fmt.type == "audio/pcm":
            return (np.clip(x, -1, 1) * 32767).astype("<i2").tobytes()
        table = ULAW if self.fmt.type == "audio/pcmu" else ALAW
        # nearest code by value: search the sorted table
        order = np.argsort(table)
        idx = np.clip(np.searchsorted(table[order], x), 1, 255)
        lo, hi = table[order][idx - 1], table[order][idx]
        pick = np.where(np.abs(x - lo) <= np.abs(hi - x), idx - 1, idx)
        return order[pick].astype(np.uint8).tobytes()
