"""How busy the engine's worker has been of late (RecentLoad), and the shorter margin of final transcripts while it
is loaded (LoadedMargins)."""

from __future__ import annotations

import collections
import dataclasses
import time

from .transcripts import TranscriptJob

# the engine counts as loaded when its worker was busy LOADED_BUSY of the last LOAD_WINDOW_S seconds, LOADED_FIRM
# of them on firm work (all but live transcripts: finals, long turns' windows, language model and voice steps). Live
# transcripts fill a fast CPU's spare time (busy 0.84-0.94 at its finals with 16 streams on a Zen 4, firm 0.10-0.26),
# so busy alone called it loaded too; a saturated one spends a share on firm work (0.35-0.59 on an emulated Zen 3)
LOAD_WINDOW_S = 2.0
LOADED_BUSY = 0.9
LOADED_FIRM = 0.3


class RecentLoad:
    """The share of the last `window` seconds the engine's worker spent in model steps (worker thread only), of
    every kind or (`live=False`) all but the batches of live transcripts (and of the early ones among them)."""

    def __init__(self, window: float = LOAD_WINDOW_S):
        self.window = window
        self.steps: collections.deque[tuple[float, float, bool]] = collections.deque()  # (start, end, live)

    def add(self, start: float, end: float, live: bool = False) -> None:
        self.steps.append((start, end, live))
        self._forget(end - self.window)  # kept bounded when nobody asks (no transcripts)

    def busy(self, now: float | None = None, live: bool = True) -> float:
        since = (time.monotonic() if now is None else now) - self.window
        self._forget(since)
        return min(1.0, sum(end - max(start, since) for start, end, lv in self.steps if live or not lv) / self.window)

    def _forget(self, before: float) -> None:
        """Drop the steps that ended by `before`."""
        while self.steps and self.steps[0][1] <= before:
            self.steps.popleft()


class LoadedMargins:
    """Final transcripts' margin under load: a batch taken while the engine's worker was busy LOADED_BUSY of the
    last LOAD_WINDOW_S seconds, LOADED_FIRM of them on other work than live transcripts (which fill any spare time),
    encodes each final transcript (and each early one, begun when the input went quiet, that may become final: it
    runs among the live ones) over its turn plus at most `margin` seconds of padding (None: each its own margin
    always; live transcripts' 1 s is less). The margin past a few seconds keeps words of some short questions
    (session.asr_options) at ~1.7x a final's cost (54 vs 90 ms a clip at 3 and 10 s on a Zen 4), which a saturated
    engine pays in live text first, then in every final's wait: on a 2-core CPU of Zen 3 speed (emulated,
    docs/onnx-runtime.md), 10-s finals kept 12 streams, this 16."""

    def __init__(self, margin: float | None):
        self.margin = margin
        self.load = RecentLoad()  # the worker's steps, added as they end

    def apply(self, jobs: list[TranscriptJob], metrics) -> None:
        busy = metrics.busy_fraction = self.load.busy()
        firm = metrics.firm_fraction = self.load.busy(live=False)
        if self.margin is None or busy < LOADED_BUSY or firm < LOADED_FIRM:
            return
        for j in jobs:
            if j.options.trim_context and j.options.trim_margin > self.margin:
                j.options = dataclasses.replace(j.options, trim_margin=self.margin)
                metrics.finals_loaded_margin += 1
