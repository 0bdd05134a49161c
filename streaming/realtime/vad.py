"""Voice activity and turn detection: Silero VAD (the ONNX model shipped in the `silero-vad` wheel) on one
worker thread for the server's streams, and the Realtime API's `server_vad` / `semantic_vad` turn detection on
top of it."""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from dataclasses import dataclass

import numpy as np
import torch

from speechrt.models.silero import FRAME, SileroVAD, VadStream  # noqa: F401 - the runner, re-exported here
from speechrt.models.silero_batch import BatchedSilero
from speechrt.pipelines.asr import SAMPLE_RATE as RATE  # Silero runs at the recognizer's 16 kHz

log = logging.getLogger("speechrt.vad")

FRAME_MS = 32
# the input going quiet (QuietTracker) at most this long before Silero's pause begins is where that pause
# began: Silero lags the last sound by 60-130 ms
QUIET_LEAD_MS = 300


def quiet_began_pause(quiet_ms: int | None, pause_ms: int, lead_ms: int = QUIET_LEAD_MS) -> bool:
    """Whether the input going quiet at `quiet_ms` is where the pause Silero saw begin at `pause_ms` began (at most
    `lead_ms` before it: the policy's quiet_lead_ms)."""
    return quiet_ms is not None and pause_ms - lead_ms <= quiet_ms <= pause_ms


class QuietTracker:
    """An early sign that speech has ended, from the signal's energy.

    Silero's probability stays high for 60-130 ms after the last sound of an utterance (its window needs
    context to be sure), while the energy falls at once. This tracks the RMS of 10 ms hops against the
    recent loudness peak (decaying 6 dB per second): a hop 30 dB or more below it, or below -80 dBFS,
    is quiet. `quiet_since` is the absolute sample index where the current run of quiet hops began
    (None while the latest hop is loud). In noise louder than peak - 30 dB no hop is quiet and
    nothing is reported: Silero alone decides."""

    HOP = 160  # samples at 16 kHz

    def __init__(self, drop_db: float = 30.0, floor: float = 1e-4, decay_db_per_s: float = 6.0):
        self.ratio = 10 ** (-drop_db / 20)
        self.floor = floor
        self.decay = 10 ** (-decay_db_per_s * self.HOP / RATE / 20)
        self.peak = 0.0
        self.pending = np.zeros(0, np.float32)
        self.pos = 0  # absolute index of the first sample not yet in a complete hop
        self.quiet_since: int | None = None

    def feed(self, audio16k: np.ndarray, start: int):
        """Audio that begins at absolute sample `start` (a gap or overlap with what came before
        restarts the hop grid there)."""
        if start != self.pos + len(self.pending):
            self.pending, self.pos = np.zeros(0, np.float32), start
        x = np.concatenate([self.pending, audio16k.astype(np.float32, copy=False)])
        n = len(x) // self.HOP
        if n:
            rms = np.sqrt(np.mean(np.square(x[: n * self.HOP].reshape(n, self.HOP), dtype=np.float64), axis=1))
            for i, r in enumerate(rms):
                self.peak = max(float(r), self.peak * self.decay)
                if r < max(self.peak * self.ratio, self.floor):
                    if self.quiet_since is None:
                        self.quiet_since = self.pos + i * self.HOP
                else:
                    self.quiet_since = None
        self.pending = x[n * self.HOP :]
        self.pos += n * self.HOP


# semantic_vad: silence (ms) that ends a turn, by eagerness, when the turn's transcript reads as finished
# and when it does not (or is not known yet). The second is also the longest a pause can last.
EAGERNESS = {"low": (400, 4000), "medium": (100, 2000), "high": (0, 800)}
EAGERNESS["auto"] = EAGERNESS["medium"]
# a last word after which a sentence goes on, whatever punctuation the recognizer put after it
_CONTINUATIONS = frozenset(
    """a an the and or but so because if then than that which who to of for with in on at from by
as about into like my your our their his her its um uh er erm hmm""".split()
)


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
            return {
                "type": "semantic_vad",
                "eagerness": self.eagerness,
                "create_response": self.create_response,
                "interrupt_response": self.interrupt_response,
            }
        return {
            "type": "server_vad",
            "threshold": self.threshold,
            "prefix_padding_ms": self.prefix_padding_ms,
            "silence_duration_ms": self.silence_duration_ms,
            "create_response": self.create_response,
            "interrupt_response": self.interrupt_response,
        }


class TurnDetector:
    """Frame probabilities -> speech start/stop times (ms from the start of the stream).

    Speech starts at the first frame at or above `threshold`; it stops once frames stay below
    threshold - 0.15 (Silero's hysteresis) for the pause the config needs (`silence_duration_ms`, or
    for semantic_vad what `finish_pause` says). The pause is timed from where the input went quiet
    (`quiet_ms`, from a QuietTracker) when that was at most `quiet_lead_ms` (QUIET_LEAD_MS) before Silero's
    first silent frame, else from that frame. `pause_ms` reports the start of a pause still in progress
    (Silero's), so callers can begin transcribing before the turn is confirmed over."""

    def __init__(self, cfg: ServerVadConfig, quiet_lead_ms: int = QUIET_LEAD_MS):
        self.cfg = cfg
        self.quiet_lead_ms = quiet_lead_ms
        self.frames = 0
        self.speaking = False
        self.silence_frames = 0
        self.start_ms = 0
        self.need_ms = cfg.pause_needed_ms(None)  # for the pause in progress
        self.quiet_ms: int | None = None  # where the input went quiet, if it is quiet now

    def _silence_ms(self) -> int:
        """How long the pause in progress has lasted."""
        now = self.frames * FRAME_MS
        start = now - self.silence_frames * FRAME_MS
        if quiet_began_pause(self.quiet_ms, start, self.quiet_lead_ms):
            start = self.quiet_ms
        return now - start

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
        if self._silence_ms() >= self.need_ms:
            return [self._stop()]
        return []

    def _stop(self) -> tuple[str, int]:
        end = (self.frames - self.silence_frames) * FRAME_MS
        self.speaking, self.silence_frames = False, 0
        return ("stop", end)

    def reset(self):
        """Forget the turn in progress (the buffer was committed or cleared by the client)."""
        self.speaking, self.silence_frames = False, 0

    def feed(self, probs, quiet_ms: int | None = None) -> list[tuple[str, int]]:
        """Silero's probabilities of the next frames; `quiet_ms`: where the input went quiet, if it is
        quiet at the end of these frames (QuietTracker.quiet_since, in ms)."""
        self.quiet_ms = quiet_ms
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
                if self._silence_ms() >= max(self.need_ms, 1):
                    events.append(self._stop())
            elif p >= self.cfg.threshold:
                self.silence_frames = 0
        return events


class VadWorker:
    """Silero for every stream of a server, on one thread, in ticks: whatever queued while it ran is the next tick,
    every stream's frames of the tick in ONE batched call (`run_batch`: the streams as the batch, each stream's
    state a row; a stream with several chunks queued runs them in order in its row), and handed back to the event
    loop in one wake-up. The runner: SileroVAD on the CPU (ONNX Runtime), BatchedSilero on a GPU (`silero_for`).
    `frames` and `seconds` (the thread's CPU time) count the work, `ticks` the batched calls (/metrics)."""

    def __init__(self, vad: SileroVAD | BatchedSilero, tick_s: float | None = None):
        """`tick_s`: the least time from one tick's start to the next's (the chunks that come meanwhile wait and
        join the next); default the runner's `tick_s` (see silero_for), else 0: a tick whenever one is queued."""
        self.vad = vad
        self.tick_s = getattr(vad, "tick_s", 0.0) if tick_s is None else tick_s
        self.frames = 0
        self.ticks = 0
        self.seconds = 0.0
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._closed = False
        self._lock = threading.Lock()  # (nothing is queued after the close's sentinel)
        self._thread = threading.Thread(target=self._run, name="speechrt-vad", daemon=True)
        self._thread.start()

    def stream(self) -> VadStream:
        return self.vad.stream()

    async def process(self, stream: VadStream, audio16k: np.ndarray) -> np.ndarray:
        """What `stream.process(audio16k)` returns, run on the worker's thread."""
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        with self._lock:
            if self._closed:
                raise RuntimeError("voice activity detection stopped: the server is closing")
            self._queue.put((stream, audio16k, loop, done))
        return await done

    def close(self, wait: float = 0.0):
        """The thread ends once the audio queued so far has run (waited for up to `wait` seconds); audio sent
        later gets a RuntimeError."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._queue.put(None)
        if wait:
            self._thread.join(wait)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def _run(self):
        last = 0.0
        while True:
            items = [self._queue.get()]
            if (wait := last + self.tick_s - time.monotonic()) > 0:
                time.sleep(wait)  # the streams' chunks gather into this tick
            last = time.monotonic()
            while True:
                try:
                    items.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            t0 = time.thread_time()
            results = self._tick([item for item in items if item is not None])
            self.seconds += time.thread_time() - t0
            _settle(results)
            if None in items:
                return

    def _tick(self, items: list) -> list:
        """The queued chunks (stream, audio16k, loop, future) -> (item, probabilities or None, error or None) each,
        the frames of all of them in one run_batch."""
        results, taken, rows = [], [], {}  # rows: each stream's (row in the batch, its chunks' windows)
        for item in items:
            try:
                windows = item[0].take_frames(item[1])
            except Exception as e:  # (audio that is not a 1-D float array): its caller gets the error
                results.append((item, None, e))
                continue
            row = rows.setdefault(id(item[0]), (len(rows), item[0], []))
            row[2].append(windows)
            taken.append((item, row[0], len(windows)))
        if not taken:
            return results
        streams = [s for _, s, _ in rows.values()]
        try:
            probs, states = self.vad.run_batch(
                [np.concatenate(w) if len(w) > 1 else w[0] for _, _, w in rows.values()], [s.state for s in streams]
            )
        except Exception as e:  # the tick's sessions get the error; the thread goes on
            log.exception("voice activity detection failed")
            return results + [(item, None, e) for item, _, _ in taken]
        self.ticks += 1
        for stream, state in zip(streams, states):
            stream.state = state
        used = [0] * len(streams)
        for item, row, n in taken:  # each chunk's share of its stream's probabilities, in order
            results.append((item, probs[row][used[row] : used[row] + n], None))
            used[row] += n
            self.frames += n
        return results


# a GPU's ticks at least this far apart: each costs ~40 kernel launches and a wait for the result whatever the
# batch, so the chunks of ~20 ms (a tenth of the 100 ms chunks a client sends) share one; a chunk's probabilities
# come at most this much later. (Not yet measured on a GPU: the batched model is checked on the CPU.)
GPU_TICK_S = 0.02


def silero_for(device) -> SileroVAD | BatchedSilero:
    """The Silero runner of a server whose models run on `device`: on a GPU, BatchedSilero there, ticking every
    GPU_TICK_S; on the CPU, SileroVAD (ONNX Runtime on one thread: torch's would share the engine's intra-op threads
    and cannot be held to one without changing theirs), a tick whenever a chunk is queued."""
    device = torch.device(device)
    if device.type == "cpu":
        return SileroVAD()
    runner = BatchedSilero(device)
    runner.tick_s = GPU_TICK_S  # (this runner's, on this device)
    return runner


def _settle(results):
    """Hand the worker's results (or errors) to the event loops that await them, one wake-up per loop."""
    by_loop: dict = {}
    for item, result, error in results:
        by_loop.setdefault(item[2], []).append((item[3], result, error))

    def settle(done_list):
        for done, result, error in done_list:
            if not done.done():  # (its session may have gone and cancelled it)
                done.set_exception(error) if error is not None else done.set_result(result)

    for loop, done_list in by_loop.items():
        try:
            loop.call_soon_threadsafe(settle, done_list)
        except RuntimeError:  # that loop is closed: nobody awaits it any more
            pass
