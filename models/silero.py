"""Silero VAD (the ONNX models shipped in the `silero-vad` wheel): the model runner, per stream state, and
speech probabilities of a whole recording. Streaming turn detection (streaming/realtime/vad.py) and the offline
speech-region finder (speechrt/pipelines/speech_regions.py) both run it through these names.

A frame's speech probability depends on the frames before it only through the model's LSTM state, so the
frames of a chunk of audio (about three in the 100 ms a client sends) run in one call of the wheel's
sequence graph (`silero_vad_16k_sequence.onnx`, silero-vad >= 6.2.3: the same weights, the convolutions over
all the frames at once and the LSTM over them in turn) rather than one call of `silero_vad.onnx` per frame: the
same probabilities (a test), at 0.6x the time for three frames and 0.5x for thirty on a Zen 4. Where the
installed wheel has no sequence graph, the frames run one call each.

A server runs the many streams' chunks of a tick in one batched call instead (BatchedSilero, models/silero_batch.py:
the wheel's safetensors weights in torch, on the server's device); SileroVAD.run_batch is its per-stream peer."""

from __future__ import annotations

import functools
import logging
from pathlib import Path

import numpy as np

from .audio import SAMPLE_RATE as RATE  # Silero runs at 16 kHz here

log = logging.getLogger("speechrt.vad")

FRAME = 512  # samples per Silero frame at 16 kHz (32 ms)
CONTEXT = 64  # samples of the previous frame the model sees
WINDOW = CONTEXT + FRAME  # one model input: a frame after the previous frame's last CONTEXT samples
SEQUENCE_GRAPH = "silero_vad_16k_sequence.onnx"  # beside silero_vad.onnx in the wheel
MAX_SEQUENCE = 1024  # frames per call of the sequence graph (33 s; a long recording runs in several)
# SileroVAD.run_batch batches a tick of at least this many streams; fewer run a sequence-graph call each. A tick of
# 100 ms chunks (Xeon, one thread, `python -m benchmarks.vad_tick`): 1 stream 0.51 ms batched / 0.22 per stream,
# 8 streams 1.73 / 1.79, 32 5.7 / 7.2, 64 10.9 / 14.1. (On the CPU the convolutions, linear in the frames, cost the
# most: batching saves the calls' overhead, not compute.)
BATCH_MIN = 8


class SileroVAD:
    """One shared ONNX Runtime session (its `run` is thread-safe); each audio stream has its own state.
    `sequence`: whether it is the sequence graph's (a call per chunk) or silero_vad.onnx's (a call per frame;
    only one is loaded: the latter takes ~0.1 s to load here, the former ~5 ms)."""

    def __init__(self, path=None, sequence: bool = True):
        from .registry import resolve

        path = Path(path or resolve("silero-vad", "vad").path)
        seq = path.with_name(SEQUENCE_GRAPH)
        self.sequence = sequence and seq.is_file()
        if sequence and not self.sequence:
            log.info(
                "%s is not in the installed silero-vad (>= 6.2.3 has it): voice activity detection runs "
                "one model call per 32 ms frame",
                SEQUENCE_GRAPH,
            )
        self.path = path
        self.session = _session(seq if self.sequence else path)
        self._step = None if self.sequence else self.session  # silero_vad.onnx, for run_batch
        self._sr = np.array(RATE, np.int64)

    def run(self, windows: np.ndarray, state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Consecutive frames of one stream: windows [T, WINDOW] and its state [2, 1, 128] (the LSTM's h and c)
        -> (speech probabilities [T], the state after the last frame)."""
        probs = np.empty(len(windows), np.float32)
        if not self.sequence:
            for i, w in enumerate(windows):
                out, state = self.session.run(None, {"input": w[None], "state": state, "sr": self._sr})
                probs[i] = out[0, 0]
            return probs, state
        for i in range(0, len(windows), MAX_SEQUENCE):
            p, h, c = self.session.run(None, {"input": windows[i : i + MAX_SEQUENCE], "h": state[:1], "c": state[1:]})
            probs[i : i + len(p)] = p
            state = np.concatenate([h, c])
        return probs, state

    def run_batch(self, windows: list[np.ndarray], states: list) -> tuple[list[np.ndarray], list]:
        """Several streams' consecutive frames windows[i] [T_i, WINDOW] (T_i may be 0) from states[i] -> each
        stream's probabilities [T_i] and its state after its last frame: silero_vad.onnx with the streams as its
        batch, one call per frame position k over the streams that have a k-th frame (BatchLayout); under
        BATCH_MIN streams with frames, a call of `run` each."""
        lay = BatchLayout([len(w) for w in windows])
        if not lay.steps:
            return lay.split(np.zeros(0, np.float32)), list(states)
        if lay.live < BATCH_MIN and self.sequence:  # (cheaper so: see BATCH_MIN)
            out = [self.run(w, s) if len(w) else (np.zeros(0, np.float32), s) for w, s in zip(windows, states)]
            return [p for p, _ in out], [s for _, s in out]
        if self._step is None:  # (loaded on first use: ~0.1 s)
            self._step = _session(self.path)
        x = lay.rows(windows)
        state = np.concatenate([states[i] for i in lay.order[: lay.live]], axis=1)  # [2, live, 128]
        probs = np.empty(len(x), np.float32)
        for k in range(lay.steps):
            b, o = int(lay.width[k]), int(lay.offsets[k])
            out, new = self._step.run(None, {"input": x[o : o + b], "state": state[:, :b], "sr": self._sr})
            probs[o : o + b] = out[:, 0]
            state = np.concatenate([new, state[:, b:]], axis=1) if b < lay.live else new
        return lay.split(probs), lay.scatter([state[:, j : j + 1] for j in range(lay.live)], states)

    def stream(self) -> VadStream:
        return VadStream(self)

    def speech_probs(self, audio16k: np.ndarray) -> np.ndarray:
        """Speech probability of each 32 ms frame of a whole recording (the last frame zero-padded)."""
        audio16k = np.asarray(audio16k, np.float32)
        pad = -len(audio16k) % FRAME
        return self.stream().process(np.pad(audio16k, (0, pad)) if pad else audio16k)


class BatchLayout:
    """Several streams' frames as a batch, in step-major order: frame k of every stream that has one, then frame
    k + 1, ... with the streams sorted by frame count, longest first (`order`), so that the streams with a k-th
    frame are always a prefix (`width[k]` of them; `live`: the streams with any frame). A recurrent model steps
    once per k over rows offsets[k]:offsets[k + 1]."""

    def __init__(self, counts):
        self.counts = np.asarray(counts, np.int64)
        self.order = np.argsort(-self.counts, kind="stable")
        by_count = self.counts[self.order]
        self.steps = int(by_count[0]) if len(by_count) else 0
        self.width = (by_count[None, :] > np.arange(self.steps)[:, None]).sum(1)
        self.offsets = np.concatenate([[0], np.cumsum(self.width)])
        self.live = int(self.width[0]) if self.steps else 0

    def rows(self, windows: list[np.ndarray]) -> np.ndarray:
        """The streams' windows [N, WINDOW] in step-major order."""
        by_count = self.counts[self.order[: self.live]]
        stacked = np.concatenate([windows[i] for i in self.order[: self.live]]).astype(np.float32, copy=False)
        first = np.concatenate([[0], np.cumsum(by_count)])[:-1]  # each sorted stream's first row in `stacked`
        return stacked[np.concatenate([first[:w] + k for k, w in enumerate(self.width)])]

    def split(self, probs: np.ndarray) -> list[np.ndarray]:
        """Step-major probabilities [N] -> each stream's [T_i], in the callers' order."""
        out = [np.zeros(0, np.float32)] * len(self.counts)
        for j, i in enumerate(self.order[: self.live]):
            out[i] = probs[self.offsets[: self.counts[i]] + j]
        return out

    def scatter(self, live_states: list, states: list) -> list:
        """The states after the batch: the live streams' (in sorted order) in place of theirs, the others' as were."""
        out = list(states)
        for j, i in enumerate(self.order[: self.live]):
            out[i] = live_states[j]
        return out


def _session(path: Path):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.log_severity_level = 3  # (the sequence graph carries unused initializers ONNX Runtime warns about)
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


@functools.lru_cache(maxsize=1)
def shared_vad() -> SileroVAD:
    """One Silero session per process (the model is 2 MB; its state lives in each VadStream)."""
    return SileroVAD()


class VadStream:
    """One audio stream's place in Silero: its recurrent state, the last samples of its previous frame and the
    samples that do not fill a frame yet."""

    def __init__(self, vad, state=None):
        self.vad = vad  # its runner: SileroVAD or BatchedSilero (whose `state` is a row of its own kind)
        self.state = np.zeros((2, 1, 128), np.float32) if state is None else state
        self.context = np.zeros(CONTEXT, np.float32)
        self.pending = np.zeros(0, np.float32)

    def take_frames(self, audio16k: np.ndarray) -> np.ndarray:
        """The model inputs [n, WINDOW] of the n complete frames in the audio so far (the remainder waits), each
        after its previous frame's last CONTEXT samples; the stream moves past them (its state does not: the
        caller runs them)."""
        x = np.concatenate([self.context, self.pending, audio16k.astype(np.float32, copy=False)])
        n = (len(x) - CONTEXT) // FRAME
        windows = x[np.arange(n)[:, None] * FRAME + np.arange(WINDOW)]
        self.context = x[n * FRAME : n * FRAME + CONTEXT]
        self.pending = x[n * FRAME + CONTEXT :]
        return windows

    def process(self, audio16k: np.ndarray) -> np.ndarray:
        """Speech probabilities of each complete 32 ms frame in the audio so far (the remainder waits)."""
        windows = self.take_frames(audio16k)
        if not len(windows):
            return np.zeros(0, np.float32)
        probs, self.state = self.vad.run(windows, self.state)
        return probs
