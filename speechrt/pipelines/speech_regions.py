"""Where the speech is in a recording, for the guards against text invented over silence and noise:

- `speech_timestamps`: the speech regions Silero VAD finds (faster-whisper's get_speech_timestamps:
  threshold with hysteresis, minimum speech and silence durations, padding), for `vad_filter`;
- `SpeechMap`: the regions cut out and joined, and the way back from times in the joined audio to times
  in the recording (faster-whisper's SpeechTimestampsMap);
- `hop_levels_db`: the level of each 10 ms hop, which the silence gate (`silence_level_db`) reads;
- the guards the decoding loops apply: `is_silence` (Whisper's no-speech rule), `is_quiet` (the silence
  gate), `has_words`.
"""

from __future__ import annotations

import bisect
import math
import zlib
from dataclasses import dataclass

import numpy as np

from speechrt.errors import UserError
from speechrt.models.audio import HOP_LENGTH, SAMPLE_RATE
from speechrt.models.silero import FRAME, shared_vad

__all__ = [
    "VadOptions",
    "speech_timestamps",
    "SpeechMap",
    "hop_levels_db",
    "is_silence",
    "is_quiet",
    "has_words",
    "compression_ratio",
]


@dataclass(frozen=True)
class VadOptions:
    """Silero VAD parameters of `vad_filter` (faster-whisper's VadOptions, the same defaults)."""

    threshold: float = 0.5  # a frame is speech at or above this probability
    neg_threshold: float | None = None  # ... and silence below this (None: threshold - 0.15, at least 0.01)
    min_speech_duration_ms: int = 0  # shorter speech regions are dropped
    max_speech_duration_s: float = math.inf  # longer ones are split (at a pause of 98 ms or more if any)
    min_silence_duration_ms: int = 2000  # a pause ends a region only when it lasts this long
    speech_pad_ms: int = 400  # kept on both sides of each region

    def __post_init__(self):
        def bad(msg):
            raise UserError(f"invalid VAD option: {msg}")

        if not 0 < self.threshold < 1:
            bad(f"threshold must be in (0, 1), got {self.threshold}")
        if self.neg_threshold is not None and not 0 < self.neg_threshold <= self.threshold:
            bad(f"neg_threshold must be in (0, threshold={self.threshold}], got {self.neg_threshold}")
        for name in ("min_speech_duration_ms", "min_silence_duration_ms", "speech_pad_ms"):
            if getattr(self, name) < 0:
                bad(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.max_speech_duration_s <= 0:
            bad(f"max_speech_duration_s must be > 0, got {self.max_speech_duration_s}")

    @classmethod
    def parse(cls, value) -> VadOptions:
        """A VadOptions from itself, a dict of its fields, or None (the defaults)."""
        if value is None or isinstance(value, cls):
            return value or cls()
        if isinstance(value, dict):
            valid = cls.__dataclass_fields__
            unknown = sorted(set(value) - set(valid))
            if unknown:
                raise UserError(f"unknown VAD option(s) {', '.join(unknown)}; valid: {', '.join(valid)}")
            return cls(**value)
        raise UserError(f"vad_parameters must be a dict of VAD options or VadOptions, got {type(value).__name__}")


def speech_timestamps(audio: np.ndarray, opts: VadOptions | None = None, probs: np.ndarray | None = None) -> list[dict]:
    """Speech regions of float32 audio at 16 kHz -> [{"start": sample, "end": sample}] in order
    (faster-whisper's get_speech_timestamps, the same decisions). `probs`: Silero's speech probability per
    32 ms frame, if already known."""
    opts = opts or VadOptions()
    sr, win = SAMPLE_RATE, FRAME
    if probs is None:
        probs = shared_vad().speech_probs(audio)
    threshold = opts.threshold
    neg_threshold = opts.neg_threshold if opts.neg_threshold is not None else max(threshold - 0.15, 0.01)
    min_speech = sr * opts.min_speech_duration_ms / 1000
    pad = sr * opts.speech_pad_ms / 1000
    max_speech = sr * opts.max_speech_duration_s - win - 2 * pad
    min_silence = sr * opts.min_silence_duration_ms / 1000
    min_silence_at_max = sr * 98 / 1000
    n = len(audio)
    triggered, speeches, cur = False, [], {}
    temp_end = prev_end = next_start = 0
    for i, p in enumerate(probs):
        pos = win * i
        if p >= threshold and temp_end:
            temp_end = 0
            if next_start < prev_end:
                next_start = pos
        if p >= threshold and not triggered:
            triggered, cur["start"] = True, pos
            continue
        if triggered and pos - cur["start"] > max_speech:
            if prev_end:
                cur["end"] = prev_end
                speeches.append(cur)
                cur = {}
                if next_start < prev_end:  # a pause was reached and no speech since
                    triggered = False
                else:
                    cur["start"] = next_start
                prev_end = next_start = temp_end = 0
            else:
                cur["end"] = pos
                speeches.append(cur)
                cur, triggered = {}, False
                prev_end = next_start = temp_end = 0
                continue
        if p < neg_threshold and triggered:
            if not temp_end:
                temp_end = pos
            if pos - temp_end > min_silence_at_max:
                prev_end = temp_end
            if pos - temp_end < min_silence:
                continue
            cur["end"] = temp_end
            if cur["end"] - cur["start"] > min_speech:
                speeches.append(cur)
            cur, triggered = {}, False
            prev_end = next_start = temp_end = 0
    if cur and n - cur["start"] > min_speech:
        cur["end"] = n
        speeches.append(cur)
    for i, s in enumerate(speeches):  # padding, split evenly where two regions are closer than 2 pads
        if i == 0:
            s["start"] = int(max(0, s["start"] - pad))
        if i != len(speeches) - 1:
            gap = speeches[i + 1]["start"] - s["end"]
            if gap < 2 * pad:
                s["end"] += int(gap // 2)
                speeches[i + 1]["start"] = int(max(0, speeches[i + 1]["start"] - gap // 2))
            else:
                s["end"] = int(min(n, s["end"] + pad))
                speeches[i + 1]["start"] = int(max(0, speeches[i + 1]["start"] - pad))
        else:
            s["end"] = int(min(n, s["end"] + pad))
    return speeches


class SpeechMap:
    """Speech regions of a recording joined into one shorter recording, and times in it mapped back to the
    recording's own timeline (faster-whisper's SpeechTimestampsMap)."""

    def __init__(self, regions: list[dict], sample_rate: int = SAMPLE_RATE):
        self.regions, self.sr = regions, sample_rate
        self.chunk_end: list[int] = []  # each region's end, in samples of the joined audio
        self.silence_before: list[float] = []  # seconds of the recording cut before each region
        prev_end = cut = 0
        for r in regions:
            cut += r["start"] - prev_end
            prev_end = r["end"]
            self.chunk_end.append(r["end"] - cut)
            self.silence_before.append(cut / sample_rate)

    def join(self, audio: np.ndarray) -> np.ndarray:
        if not self.regions:
            return np.zeros(0, np.float32)
        return np.concatenate([audio[r["start"] : r["end"]] for r in self.regions])

    def chunk_index(self, t: float, is_end: bool = False) -> int:
        sample = int(t * self.sr)
        if is_end and sample in self.chunk_end:
            return self.chunk_end.index(sample)
        return min(bisect.bisect(self.chunk_end, sample), len(self.chunk_end) - 1)

    def original_time(self, t: float, chunk: int | None = None, is_end: bool = False) -> float:
        chunk = self.chunk_index(t, is_end) if chunk is None else chunk
        return round(self.silence_before[chunk] + t, 2)

    def restore(self, segments) -> None:
        """Segment and word times (in the joined audio) -> times in the recording, in place. A word's start
        and end are mapped through the region its middle falls in; a segment with words spans them."""
        for seg in segments:
            if seg.words:
                for w in seg.words:
                    chunk = self.chunk_index((w.start + w.end) / 2)
                    w.start, w.end = self.original_time(w.start, chunk), self.original_time(w.end, chunk)
                seg.start, seg.end = seg.words[0].start, seg.words[-1].end
            else:
                self.restore_span(seg)

    def restore_span(self, seg, edge: float = 0.5) -> None:
        """A segment without words. An end that falls less than `edge` seconds into a later region than
        its start's (mostly that region's padding) is taken as the end of the region before; a start in
        the last `edge` seconds of an earlier region than its end's, as the start of the next region."""
        c0, c1 = self.chunk_index(seg.start), self.chunk_index(seg.end, is_end=True)
        start, end = self.original_time(seg.start, c0), self.original_time(seg.end, c1)
        if c1 > c0 and seg.end * self.sr - self.chunk_end[c1 - 1] < edge * self.sr:
            c1 -= 1
            end = self.original_time(self.chunk_end[c1] / self.sr, c1)
        if c1 > c0 and self.chunk_end[c0] - seg.start * self.sr < edge * self.sr:
            start = self.original_time(self.chunk_end[c0] / self.sr, c0 + 1)
        seg.start, seg.end = start, end


def hop_levels_db(audio: np.ndarray) -> np.ndarray:
    """RMS level (dBFS: 0 = a full-scale square wave) of each 10 ms hop of float32 audio: one value per
    log-mel frame (the last partial hop counts as a hop)."""
    n = -(-len(audio) // HOP_LENGTH)
    x = np.zeros(n * HOP_LENGTH, np.float32)
    x[: len(audio)] = audio
    ms = np.mean(np.square(x.reshape(n, HOP_LENGTH), dtype=np.float64), axis=1)
    return 10 * np.log10(np.maximum(ms, 1e-20))


def is_silence(res, opts, unsure: bool = False) -> bool:
    """Whisper's no-speech guard on a decoded window or utterance (`res`: its no_speech_prob and
    avg_logprob; `opts`: TranscribeOptions): the no-speech probability is above no_speech_threshold and the
    text is not confident — its average log probability below logprob_threshold (when that is set), or
    `unsure` (the caller knows the text is not to be trusted)."""
    return (
        opts.no_speech_threshold is not None
        and res.no_speech_prob > opts.no_speech_threshold
        and (unsure or opts.logprob_threshold is None or res.avg_logprob < opts.logprob_threshold)
    )


def is_quiet(levels, opts) -> bool:
    """The silence gate: every hop of `levels` (dBFS per 10 ms, see hop_levels_db) is quieter than
    opts.silence_level_db (False when the gate is off or no levels are given)."""
    return (
        levels is not None
        and opts.silence_level_db is not None
        and float(np.max(levels, initial=-np.inf)) < opts.silence_level_db
    )


def has_words(text: str) -> bool:
    """Whether a transcript holds any letter or digit (not only punctuation, '...', '♪')."""
    return any(c.isalnum() for c in text)


def compression_ratio(text: str) -> float:
    """gzip's compression ratio of a transcript: above 2.4 it repeats itself (a decoding loop)."""
    b = text.encode("utf-8")
    return len(b) / len(zlib.compress(b)) if b else 0.0
