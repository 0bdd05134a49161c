"""The counters and latency samples the engine keeps (sessions add theirs to the same object); the /metrics page
shows them (streaming/http/metrics.py)."""

from __future__ import annotations

import collections
import threading
from dataclasses import dataclass, field

_LOCK = threading.Lock()


def count(metrics, name: str, n: float = 1) -> None:
    """Add `n` to counter `name` of `metrics`: counters that several of the engine's threads add to (an unlocked
    += between threads may lose an addition)."""
    with _LOCK:
        setattr(metrics, name, getattr(metrics, name) + n)


def _samples() -> collections.deque:
    return collections.deque(maxlen=1000)


@dataclass
class Metrics:
    """The engine's counters and latency samples."""

    engine_seconds: float = 0.0  # the engine's workers in model steps of any kind, since start (all families summed)
    asr_batches: int = 0
    asr_audio_seconds: float = 0.0
    asr_cancelled: int = 0  # live transcripts stopped because a final transcript was asked for
    early_finals: int = 0  # final transcripts begun when the input went quiet (counted by sessions)
    finals_superseded: int = 0  # queued transcripts of a turn up to a pause, replaced by one up to a later pause
    replies_speculated: int = 0  # replies begun during a pause, before turn detection ended the turn
    replies_speculation_used: int = 0  # of those, the ones the turn's response took over
    prompts_primed: int = 0  # reply prompts read up to a turn's live words while it was spoken
    prompt_tokens_reused: int = 0  # replies' prompt positions found in the language model's cache, not read again
    prompt_tokens: int = 0  # replies' prompt tokens, reused or read
    turn_commits: int = 0  # stable parts of long turns committed while they were spoken (local agreement)
    long_final_rest_s: float = 0.0  # audio not committed (s) that the last final of a turn that committed transcribed
    stream_steps: int = 0
    step_failures: int = 0  # model steps that raised (their requests got an error)
    long_steps: int = 0  # windows of long turns' transcripts (one engine step each)
    live_stretch: float = 1.0  # live transcripts' interval over --partial-interval, as last set by the queue
    busy_fraction: float = 0.0  # share of the last LOAD_WINDOW_S the engine's ASR worker spent on model work
    firm_fraction: float = 0.0  # the same, on work other than live transcripts (finals, long turns, REST steps)
    # long finals (a long turn's rest) that stopped for short ones queued meanwhile and went on after them
    finals_yielded: int = 0
    finals_loaded_margin: int = 0  # final (and early) transcripts encoded with the loaded margin (the engine loaded)
    # engine seconds and transcripts per kind of transcription work: final, partial (live and early), long
    kind_seconds: collections.Counter = field(default_factory=collections.Counter)
    kind_items: collections.Counter = field(default_factory=collections.Counter)
    # per model family (asr, lm, tts: one worker thread each): seconds in model steps since start; and, as of the
    # last read of /metrics (Engine.figures), the busy share of the last LOAD_WINDOW_S and the work items waiting
    family_seconds: collections.Counter = field(default_factory=collections.Counter)
    family_busy: dict = field(default_factory=dict)
    family_depth: collections.Counter = field(default_factory=collections.Counter)
    final_latency: collections.deque = field(default_factory=_samples)
    partial_latency: collections.deque = field(default_factory=_samples)
    first_audio_latency: collections.deque = field(default_factory=_samples)

    @property
    def asr_items(self) -> int:
        """Utterances transcribed, of every kind."""
        return sum(self.kind_items.values())

    @property
    def asr_seconds(self) -> float:
        """Engine seconds spent on transcription, of every kind."""
        return sum(self.kind_seconds.values())
