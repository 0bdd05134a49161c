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


# semantic_vad: silence (ms) that ends a turn, by eagerness, when the turn's transcript reads as finished
# and when it does not (or is not known yet). The second is also the longest a pause can last.
EAGERNESS = {"low": (400, 4000), "medium": (100, 2000), "high": (0, 800)}
EAGERNESS["auto"] = EAGERNESS["medium"]
# a last word after which a sentence goes on, whatever punctuation the recognizer put after it
_CONTINUATIONS = frozenset("""a an the and or but so because if then than that which who to of for with in on at from by
as about into like my your our their his her its um uh er erm hmm""".split())


def transcript_finished(text: str) -> bool:
    """Whether a (speculative) turn transcript reads as a finished utterance: it ends a sentence
    (. ? !, Whisper's punctuation follows the prosody) and its last word is not one that a sentence
    continues after ("and", "the", "um", ...), nor trails off ("...")."""
    t = text.strip()
    if not t or t[-1] not in ".?!" or t.endswith("..."):
        return False
    last = "".join(c for c in t.split()[-1].lower() if c.isalnum() or c == "'")
    return last not in _CONTINUATIONS


@dataclass(frozen=True)
class ServerVadConfig:
    """Turn detection: `server_vad` (a fixed pause ends the turn) or `semantic_vad` (the pause needed
    depends on whether the words so far read as finished, see EAGERNESS)."""
    threshold: float = 0.5
    prefix_padding_ms: int = 300
    silence_duration_ms: int = 500
    create_response: bool = True
    interrupt_response: bool = True
    type: str = "server_vad"
    eagerness: str = "auto"

    @property
    def semantic(self) -> bool:
        return self.type == "semantic_vad"

    def pause_needed_ms(self, finished: bool | None) -> int:
        """The silence that ends a turn; `finished`: what the transcript says (None: not known yet)."""
        if not self.semantic:
            return self.silence_duration_ms
        done, open_ = EAGERNESS[self.eagerness]
        return done if finished else open_

    def to_api(self) -> dict:
        if self.semantic:
            return {"type": "semantic_vad", "eagerness": self.eagerness, "create_response": self.create_response,
                    "interrupt_response": self.interrupt_response}
        return {"type": "server_vad", "threshold": self.threshold, "prefix_padding_ms": self.prefix_padding_ms,
                "silence_duration_ms": self.silence_duration_ms, "create_response": self.create_response,
                "interrupt_response": self.interrupt_response}


class TurnDetector:
    """Frame probabilities -> speech start/stop times (ms from the start of the stream).

    Speech starts at the first frame at or above `threshold`; it stops once frames stay below
    threshold - 0.15 (Silero's hysteresis) for the pause the config needs (`silence_duration_ms`, or
    for semantic_vad what `finish_pause` says). `pause_ms` reports the start of a pause still in
    progress, so callers can begin transcribing before the turn is confirmed over."""

    def __init__(self, cfg: ServerVadConfig):
        self.cfg = cfg
        self.frames = 0
        self.speaking = False
        self.silence_frames = 0
        self.start_ms = 0
        self.need_ms = cfg.pause_needed_ms(None)  # for the pause in progress

    @property
    def pause_ms(self) -> int | None:
        if self.speaking and self.silence_frames:
            return (self.frames - self.silence_frames) * FRAME_MS
        return None

    def finish_pause(self, finished: bool) -> list[tuple[str, int]]:
        """semantic_vad: the transcript of the turn up to the pause in progress is known; set the pause
        this turn needs, and end the turn now if the silence so far is enough."""
        if self.pause_ms is None:
            return []
        self.need_ms = self.cfg.pause_needed_ms(finished)
        if self.silence_frames * FRAME_MS >= self.need_ms:
            return [self._stop()]
        return []

    def _stop(self) -> tuple[str, int]:
        end = (self.frames - self.silence_frames) * FRAME_MS
        self.speaking, self.silence_frames = False, 0
        return ("stop", end)

    def reset(self):
        """Forget the turn in progress (the buffer was committed or cleared by the client)."""
        self.speaking, self.silence_frames = False, 0

    def feed(self, probs) -> list[tuple[str, int]]:
        events = []
        low = max(self.cfg.threshold - 0.15, 0.01)
        for p in probs:
            t = self.frames * FRAME_MS
            self.frames += 1
            if not self.speaking:
                if p >= self.cfg.threshold:
                    self.speaking, self.silence_frames, self.start_ms = True, 0, t
                    events.append(("start", t))
            elif p < low:
                if not self.silence_frames:  # a new pause: its length is not known yet
                    self.need_ms = self.cfg.pause_needed_ms(None)
                self.silence_frames += 1
                if self.silence_frames * FRAME_MS >= max(self.need_ms, 1):
                    events.append(self._stop())
            elif p >= self.cfg.threshold:
                self.silence_frames = 0
        return events
