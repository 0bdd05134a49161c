"""Voice activity detection with Silero VAD (the ONNX model shipped in the `silero-vad` wheel) and the
Realtime API's `server_vad` turn detection on top of it."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

FRAME = 512  # samples per Silero frame at 16 kHz (32 ms)
CONTEXT = 64  # samples of the previous frame the model sees
FRAME_MS = 32


class SileroVAD:
    """One shared ONNX Runtime session (its `run` is thread-safe); each audio stream has its own state."""

    def __init__(self, path=None):
        import onnxruntime as ort

        from speechrt.models.registry import resolve

        path = path or resolve("silero-vad", "vad").path
        so = ort.SessionOptions()
        so.intra_op_num_threads = 1
        so.inter_op_num_threads = 1
        self.session = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])

    def stream(self) -> "VadStream":
        return VadStream(self)


class VadStream:
    def __init__(self, vad: SileroVAD):
        self.vad = vad
        self.state = np.zeros((2, 1, 128), np.float32)
        self.context = np.zeros(CONTEXT, np.float32)
        self.pending = np.zeros(0, np.float32)
        self._sr = np.array(16000, np.int64)

    def process(self, audio16k: np.ndarray) -> np.ndarray:
        """Speech probabilities of each complete 32 ms frame in the audio so far (the remainder waits)."""
        x = np.concatenate([self.pending, audio16k.astype(np.float32, copy=False)])
        n = len(x) // FRAME
        probs = np.empty(n, np.float32)
        for i in range(n):
            frame = x[i * FRAME: (i + 1) * FRAME]
            inp = np.concatenate([self.context, frame])[None]
            out, self.state = self.vad.session.run(None, {"input": inp, "state": self.state, "sr": self._sr})
            probs[i] = out[0, 0]
            self.context = frame[-CONTEXT:]
        self.pending = x[n * FRAME:]
        return probs


@dataclass(frozen=True)
class ServerVadConfig:
    threshold: float = 0.5
    prefix_padding_ms: int = 300
    silence_duration_ms: int = 500
    create_response: bool = True
    interrupt_response: bool = True

    def to_api(self) -> dict:
        return {"type": "server_vad", "threshold": self.threshold, "prefix_padding_ms": self.prefix_padding_ms,
                "silence_duration_ms": self.silence_duration_ms, "create_response": self.create_response,
                "interrupt_response": self.interrupt_response}


class TurnDetector:
    """Frame probabilities -> speech start/stop times (ms from the start of the stream).

    Speech starts at the first frame at or above `threshold`; it stops once frames stay below
    threshold - 0.15 (Silero's hysteresis) for `silence_duration_ms`. `pause_ms` reports the start of
    a pause still in progress, so callers can begin transcribing before the turn is confirmed over."""

    def __init__(self, cfg: ServerVadConfig):
        self.cfg = cfg
        self.frames = 0
        self.speaking = False
        self.silence_frames = 0
        self.start_ms = 0

    @property
    def pause_ms(self) -> int | None:
        if self.speaking and self.silence_frames:
            return (self.frames - self.silence_frames) * FRAME_MS
        return None

    def feed(self, probs) -> list[tuple[str, int]]:
        events = []
        low = max(self.cfg.threshold - 0.15, 0.01)
        need = max(1, -(-self.cfg.silence_duration_ms // FRAME_MS))
        for p in probs:
            t = self.frames * FRAME_MS
            self.frames += 1
            if not self.speaking:
                if p >= self.cfg.threshold:
                    self.speaking, self.silence_frames, self.start_ms = True, 0, t
                    events.append(("start", t))
            elif p < low:
                self.silence_frames += 1
                if self.silence_frames >= need:
                    end = (self.frames - self.silence_frames) * FRAME_MS
                    self.speaking, self.silence_frames = False, 0
                    events.append(("stop", end))
            elif p >= self.cfg.threshold:
                self.silence_frames = 0
        return events
