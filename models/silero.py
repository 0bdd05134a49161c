"""Silero VAD (the ONNX model shipped in the `silero-vad` wheel): the model runner, per stream state, and
speech probabilities of a whole recording. Streaming turn detection (streaming/vad.py) and the offline
speech-region finder (speechrt/pipelines/speech_regions.py) both run it through these names."""
from __future__ import annotations

import functools

import numpy as np

from .audio import SAMPLE_RATE as RATE  # Silero runs at 16 kHz here

FRAME = 512  # samples per Silero frame at 16 kHz (32 ms)
CONTEXT = 64  # samples of the previous frame the model sees


class SileroVAD:
    """One shared ONNX Runtime session (its `run` is thread-safe); each audio stream has its own state."""

    def __init__(self, path=None):
        import onnxruntime as ort

        from .registry import resolve

        path = path or resolve("silero-vad", "vad").path
        so = ort.SessionOptions()
        so.intra_op_num_threads = 1
        so.inter_op_num_threads = 1
        self.session = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])

    def stream(self) -> "VadStream":
        return VadStream(self)

    def speech_probs(self, audio16k: np.ndarray) -> np.ndarray:
        """Speech probability of each 32 ms frame of a whole recording (the last frame zero-padded)."""
        audio16k = np.asarray(audio16k, np.float32)
        pad = -len(audio16k) % FRAME
        return self.stream().process(np.pad(audio16k, (0, pad)) if pad else audio16k)


@functools.lru_cache(maxsize=1)
def shared_vad() -> SileroVAD:
    """One Silero session per process (the model is 2 MB; its state lives in each VadStream)."""
    return SileroVAD()


class VadStream:
    def __init__(self, vad: SileroVAD):
        self.vad = vad
        self.state = np.zeros((2, 1, 128), np.float32)
        self.context = np.zeros(CONTEXT, np.float32)
        self.pending = np.zeros(0, np.float32)
        self._sr = np.array(RATE, np.int64)

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
