"""The scheduler shared by all sessions on one device.

All model compute runs on one worker thread, so the event loop never blocks on it. Sessions submit work
and await futures (or async queues for streams). The worker takes work in priority order:

1. final transcripts of finished turns, batched across sessions (one encoder call, decode steps over all
   rows together);
2. steps of streaming tasks that produce audio or tokens for someone waiting (TTS chunks, language
   model tokens), round-robin, one step each, so every response keeps moving and first audio is soon;
3. partial transcripts of turns still being spoken, batched, newest request per stream only.

It calls the pipelines only (speechrt.pipelines): ASR transcribe_batch, the LM's continuous batcher,
TTS synthesis; how they use the device and the CPU's threads was chosen when they were loaded.
"""
from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from speechrt.pipelines.asr import (MAX_UTTERANCE_SAMPLES, SAMPLE_RATE, TranscribeOptions, TranscriptionCancelled,
                                   WindowResult)

from .transcripts import TranscriptJob, TranscriptQueue

log = logging.getLogger(__name__)
LIVE = TranscribeOptions(without_timestamps=True)  # transcripts of turns: greedy, no timestamps


@dataclass
class Metrics:
    """Counters and latency samples for /metrics."""
    asr_batches: int = 0
    asr_items: int = 0
    asr_seconds: float = 0.0
    asr_audio_seconds: float = 0.0
    asr_cancelled: int = 0  # live transcripts stopped because a final transcript was asked for
    early_finals: int = 0  # final transcripts begun when the input went quiet (counted by sessions)
    stream_steps: int = 0
    final_latency: collections.deque = field(default_factory=lambda: collections.deque(maxlen=1000))
    partial_latency: collections.deque = field(default_factory=lambda: collections.deque(maxlen=1000))
    first_audio_latency: collections.deque = field(default_factory=lambda: collections.deque(maxlen=1000))


class StreamTask:
    """A unit of streaming work: `step()` does one bounded piece of compute on the worker thread and
    returns False when done. Results go back to the event loop through `emit` (thread-safe)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue, gen):
        self.loop, self.queue, self.gen = loop, queue, gen
        self.cancelled = False

    def emit(self, item):
        self.loop.call_soon_threadsafe(self.queue.put_nowait, item)

    def step(self) -> bool:
        if self.cancelled:
            self.gen.close()
            self.emit(StopAsyncIteration())
            return False
        try:
            self.emit(next(self.gen))
            return True
        except StopIteration:
            self.emit(StopAsyncIteration())
            return False
        except Exception as e:  # report to the awaiting session, keep the worker alive
            log.exception("stream task failed")
            self.emit(e)
            return False


class Engine:
    """`asr`, `lm`, `tts`: the pipelines (speechrt.pipelines); lm and tts may be None (transcription only)."""

    def __init__(self, asr, lm=None, max_batch: int = 8, tts=None):
        self.asr, self.lm, self.tts = asr, lm, tts
        self.max_batch = max_batch
        self.partial_batch = 1  # a final that arrives while a partial runs waits for one utterance only
        self.batcher = lm.batcher(max_batch=max_batch) if lm is not None else None  # one for all conversations
        self.metrics = Metrics()
        self._cv = threading.Condition()
        self._transcripts = TranscriptQueue()
        self._tasks: collections.deque[StreamTask] = collections.deque()
        self._stop = False
        self._ready = threading.Event()  # set once the warm-up has run
        self._thread = threading.Thread(target=self._run, name="speechrt-engine", daemon=True)

    # -- submission (event loop side) -------------------------------------------------------------
    def start(self):
        self._thread.start()

    def stop(self):
        with self._cv:
            self._stop = True
            self._cv.notify()
        self._thread.join(timeout=10)

    @property
    def warming(self) -> bool:
        return not self._ready.is_set()

    def running_keys(self) -> list:
        """Keys of the live transcripts being computed now."""
        with self._cv:
            return [j.key for j in self._transcripts.running]

    def queue_depth(self) -> int:
        with self._cv:
            return len(self._transcripts) + len(self._tasks) + (self.batcher.size() if self.batcher else 0)

    def generate(self, ids: list[int], options, key=None) -> tuple[object, asyncio.Queue]:
        """Join the continuous LM batch; the queue receives each generation.Piece with text, then the last
        one (with its finish_reason). Cancel with engine.cancel_generation(request). `key` names the
        conversation: its next request reuses the positions of this one that its prompt repeats. A prompt
        too long for the cache keeps its end (the latest turns), leaving room for the answer."""
        from speechrt.pipelines.lm_batching import LMRequest

        loop = asyncio.get_running_loop()
        q: asyncio.Queue = asyncio.Queue()

        def emit(piece):
            if isinstance(piece, Exception) or piece.text or piece.finish_reason is not None:
                loop.call_soon_threadsafe(q.put_nowait, piece)

        room = max(self.batcher.max_seq // 2, self.batcher.max_seq - options.max_tokens)
        req = LMRequest(list(ids[-room:]), options, emit, key=key)
        with self._cv:
            self.batcher.submit(req)
            self._cv.notify()
        return req, q

    def cancel_generation(self, req):
        with self._cv:
            req.cancelled = True
            self._cv.notify()

    async def transcribe(self, audio: np.ndarray, partial: bool = False, key=None, draft: list[int] | None = None,
                         supersede: bool = False, options: TranscribeOptions = LIVE):
        """Transcript (a WindowResult) of one utterance (16 kHz float32), or None. Partials with the same
        key coalesce: only the newest pending one runs, older ones resolve to None. A final drops its key's
        pending partial (made useless) and stops any running partial (a final never waits for a live
        transcript); both resolve to None. `draft`: the tokens of an earlier transcript of (the start of)
        the same speech; decoding checks them in one pass instead of producing them one step at a time —
        same transcript, fewer steps. `supersede` (partials): the running partial of the same key stops
        too (this one covers its audio and more). `options`: language and prompt of the session."""
        loop = asyncio.get_running_loop()
        job = TranscriptJob(audio, options, loop.create_future(), loop, time.perf_counter(), key, draft)
        with self._cv:
            old = self._transcripts.submit(job, partial, supersede)
            self._cv.notify()
        if old is not None:
            old.resolve(None)
        return await job.future

    def has_spare_time(self) -> bool:
        """Nothing waits but what is running: no final transcript, live transcript, streaming task or
        language model work queued. Sessions start speculative work only then."""
        with self._cv:
            return not self._queued()

    def promote(self, key) -> bool:
        """The live transcript of `key` is now needed as a final one (see TranscriptQueue.promote)."""
        with self._cv:
            promoted = self._transcripts.promote(key)
            self._cv.notify()
        return promoted

    def stream(self, gen) -> tuple[StreamTask, asyncio.Queue]:
        """Run generator `gen` on the worker, one item per step; returns (task, queue) where the queue
        receives each item, then StopAsyncIteration (or the exception that ended it). Set
        task.cancelled to stop it."""
        loop = asyncio.get_running_loop()
        q: asyncio.Queue = asyncio.Queue()
        task = StreamTask(loop, q, gen)
        with self._cv:
            self._tasks.append(task)
            self._cv.notify()
        return task, q

    # -- worker ----------------------------------------------------------------------------------
    def _queued(self) -> bool:
        """Work waits for the worker (call with the lock held)."""
        return bool(len(self._transcripts) or self._tasks or self._lm_work())

    def _lm_work(self) -> bool:
        return self.batcher is not None and self.batcher.has_work()

    def _warm_up(self):
        """Run each model once on this thread before the first request: the first call of a model in a
        thread pays for its thread pool, kernel selection and allocations (~0.1-0.3 s each), which would
        otherwise land on the first user's latency."""
        t0 = time.perf_counter()
        try:
            self.asr.warm_up()
            if self.lm is not None:
                self.lm.warm_up(self.batcher)
            if self.tts is not None:
                for _ in self.tts.synthesize("Hello there."):
                    pass
        except Exception:  # noqa: BLE001 - a failed warm-up only costs the first request time
            log.exception("engine warm-up failed")
        self._ready.set()
        log.info("engine warmed up in %.2f s", time.perf_counter() - t0)

    def _run(self):
        self._warm_up()
        while True:
            with self._cv:
                while not (self._stop or self._queued()):
                    self._cv.wait()
                if self._stop:
                    return
                lm_work = self._lm_work()
                if self._transcripts.finals:
                    jobs, kind = self._transcripts.take_finals(self.max_batch), "final"
                elif self._tasks or lm_work:
                    jobs, kind = [], "stream"
                else:  # small partial batches: a final that arrives meanwhile waits for at most this much
                    jobs, kind = self._transcripts.take_partials(self.partial_batch), "partial"
            if kind == "stream":
                if self._tasks:
                    self._step_tasks()
                if lm_work:
                    self._step_lm()
            else:
                self._run_asr(jobs, kind)
                with self._cv:
                    self._transcripts.done()

    def _step_lm(self):
        try:  # submit() appends to a deque and cancel() sets a flag: both safe while the step runs
            self.batcher.step()
            self.metrics.stream_steps += 1
        except Exception as e:  # noqa: BLE001 - fail every request in the batch, keep serving
            log.exception("language model step failed")
            with self._cv:
                self.batcher.fail(e)

    def _step_tasks(self):
        with self._cv:
            tasks = list(self._tasks)
        for t in tasks:
            alive = t.step()
            self.metrics.stream_steps += 1
            if not alive:
                with self._cv:
                    try:
                        self._tasks.remove(t)
                    except ValueError:
                        pass
            if self._transcripts.finals:  # a finished turn waits: serve it before the next round
                break

    def _run_asr(self, jobs: list[TranscriptJob], kind: str):
        t0 = time.perf_counter()
        results: list[tuple[TranscriptJob, object, Exception | None]] = []
        # partials: stop once a final transcript has made every one of them useless
        stop = (lambda: all(j.cancelled for j in jobs)) if kind == "partial" else None
        short = [j for j in jobs if len(j.audio) <= MAX_UTTERANCE_SAMPLES]
        # one batch per set of options (a session's language and prompt)
        for opts, group in itertools.groupby(sorted(short, key=lambda j: repr(j.options)), key=lambda j: j.options):
            group = list(group)
            try:
                out = self.asr.transcribe_batch([j.audio for j in group], opts, [j.draft for j in group], stop)
                results += [(j, r, None) for j, r in zip(group, out)]
            except TranscriptionCancelled:
                results += [(j, None, None) for j in group]
                self.metrics.asr_cancelled += len(group)
            except Exception as e:  # noqa: BLE001 - reported to every waiting session
                log.exception("batched transcription failed")
                results += [(j, None, e) for j in group]
        for j in jobs:
            if len(j.audio) > MAX_UTTERANCE_SAMPLES:  # long turns: long-form transcription, window by window
                try:
                    tr = self.asr.transcribe(j.audio, SAMPLE_RATE, language=j.options.language,
                                             initial_prompt=j.options.initial_prompt)
                    results.append((j, WindowResult([], tr.text, 0.0, 0.0, 0.0, 0.0), None))
                except Exception as e:  # noqa: BLE001
                    results.append((j, None, e))
        now = time.perf_counter()
        m = self.metrics
        m.asr_batches += 1
        m.asr_items += len(jobs)
        m.asr_seconds += now - t0
        m.asr_audio_seconds += sum(len(j.audio) for j in jobs) / SAMPLE_RATE
        for j, r, e in results:
            if r is not None:
                (m.final_latency if kind == "final" else m.partial_latency).append(now - j.submitted)
            j.resolve(r, e)
