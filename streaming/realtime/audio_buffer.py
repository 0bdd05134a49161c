"""The session's input audio buffer: uncommitted audio at 16 kHz by absolute sample index, read by the event loop
and the engine's worker."""

from __future__ import annotations

import threading

import numpy as np


class AudioBuffer:
    """Uncommitted input audio at 16 kHz, addressed by absolute sample index since the session began. The event
    loop writes it; `since` may be called from the engine's worker too (a live transcript takes the newest audio
    when it begins), so changes and reads hold a lock."""

    def __init__(self):
        self.chunks: list[np.ndarray] = []
        self.start = 0  # absolute index of the first buffered sample
        self.size = 0
        self._lock = threading.Lock()

    @property
    def end(self) -> int:
        return self.start + self.size

    def append(self, x: np.ndarray):
        if len(x):
            with self._lock:
                self.chunks.append(x)
                self.size += len(x)

    def slice(self, a: int, b: int) -> np.ndarray:
        with self._lock:
            return self._slice(a, b)

    def _slice(self, a: int, b: int) -> np.ndarray:
        a, b = max(a, self.start), min(b, self.end)
        if b <= a:
            return np.zeros(0, np.float32)
        if len(self.chunks) > 1:
            self.chunks = [np.concatenate(self.chunks)]
        return self.chunks[0][a - self.start : b - self.start].copy()

    def since(self, a: int) -> np.ndarray | None:
        """Samples from `a` to the end, or None if the buffer no longer holds `a` (any thread)."""
        with self._lock:
            return None if a < self.start else self._slice(a, self.start + self.size)

    def drop_until(self, idx: int):
        with self._lock:
            idx = min(max(idx, self.start), self.end)
            if idx == self.start:
                return
            rest = self._slice(idx, self.end)
            self.chunks = [rest] if len(rest) else []
            self.start, self.size = idx, len(rest)

    def clear(self):
        self.drop_until(self.end)
