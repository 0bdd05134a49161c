"""The scheduler shared by all sessions on one device.

All model compute runs on one worker thread, so the event loop never blocks on it. Sessions submit work
and await futures (or async queues for streams). The worker takes work in priority order:

1. final transcripts of finished turns, batched across sessions (one encoder call, decode steps over all
   rows together);
2. steps of streaming tasks that produce audio or tokens for someone waiting (TTS chunks, language
   model tokens), round-robin, one step each, so every response keeps moving and first audio is soon;
3. partial transcripts of turns still being spoken, batched, newest request per stream only.
"""
from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from speechrt.models.asr_decoding import TranscribeOptions, TranscriptionCancelled, WindowResult, transcribe_batch

log = logging.getLogger(__name__)

MAX_TURN_SAMPLES = 30 * 16000


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


@dataclass
class _AsrJob:
    audio: np.ndarray
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    submitted: float
    key: object = None  # partials: one pending job per key (a newer one replaces it)
    draft: list[int] | None = None  # a guess of the tokens (an earlier transcript of the same speech)
    cancelled: bool = False  # a running partial that a final transcript asked to stop
    promoted: bool = False  # a partial whose result a final waits for: finals do not stop it


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
    def __init__(self, asr, lm=None, max_batch: int = 8, lm_threads: int | None = 1, tts=None):
        self.asr, self.tts = asr, tts
        self.lm_threads = lm_threads  # CPU threads for language model steps (None: all)
        self.max_batch = max_batch
        self.partial_batch = 1  # a final that arrives while a partial runs waits for one utterance only
        self.lm = None
        if lm is not None:
            from .lm_batcher import ContinuousBatcher

            self.lm = ContinuousBatcher(lm, max_batch=max_batch)
        self.metrics = Metrics()
        self._cv = threading.Condition()
        self._finals: collections.deque[_AsrJob] = collections.deque()
        self._partials: collections.OrderedDict = collections.OrderedDict()
        self._tasks: collections.deque[StreamTask] = collections.deque()
        self._running_partials: list[_AsrJob] = []
        self._stop = False
        self._warming = True  # until _warm_up has run
        self._thread = threading.Thread(target=self._run, name="speechrt-engine", daemon=True)
        self._final_opts = TranscribeOptions(without_timestamps=True)

    # -- submission (event loop side) -------------------------------------------------------------
    def start(self):
        self._thread.start()

    def stop(self):
        with self._cv:
            self._stop = True
            self._cv.notify()
        self._thread.join(timeout=10)

    def queue_depth(self) -> int:
        lm = len(self.lm.pending) + len(self.lm.active) if self.lm else 0
        return len(self._finals) + len(self._partials) + len(self._tasks) + lm

    def generate(self, ids: list[int], options, key=None) -> tuple[object, asyncio.Queue]:
        """Join the continuous LM batch; the queue receives (text, None) per piece, then
        (text, finish_reason) once. Cancel with engine.cancel_generation(request). `key` names the
        conversation: its next request reuses the positions of this one that its prompt repeats."""
        from .lm_batcher import LMRequest

        loop = asyncio.get_running_loop()
        q: asyncio.Queue = asyncio.Queue()
        req = LMRequest(list(ids), options, lambda item: loop.call_soon_threadsafe(q.put_nowait, item), key=key)
        with self._cv:
            self.lm.submit(req)
            self._cv.notify()
        return req, q

    def cancel_generation(self, req):
        with self._cv:
            req.cancelled = True
            self._cv.notify()

    async def transcribe(self, audio: np.ndarray, partial: bool = False, key=None,
                         draft: list[int] | None = None, supersede: bool = False) -> WindowResult:
        """Transcript of one utterance (16 kHz float32). Partials with the same key coalesce: only the
        newest pending one runs, older ones resolve to None. A final drops its key's pending partial
        (made useless) and stops any running partial (a final never waits for a live transcript); both
        resolve to None. `draft`: the tokens of an earlier transcript of (the start of) the same speech;
        decoding checks them in one pass instead of producing them one step at a time (see
        transcribe_batch) — same transcript, fewer steps. `supersede` (partials): the running partial of
        the same key stops too (this one covers its audio and more)."""
        loop = asyncio.get_running_loop()
        job = _AsrJob(audio, loop.create_future(), loop, time.perf_counter(), key, draft)
        with self._cv:
            old = self._partials.pop(key, None) if key is not None else None
            if old is not None:
                loop.call_soon(self._resolve, old.future, None)
            if partial:
                self._partials[key] = job
                if supersede:
                    for running in self._running_partials:
                        if running.key == key and not running.promoted:
                            running.cancelled = True
            else:
                # a final transcript never waits for a live one: the running partial stops at its next
                # step (after its encoder pass at worst) and its session asks again later
                for running in self._running_partials:
                    running.cancelled = running.cancelled or not running.promoted
                self._finals.append(job)
            self._cv.notify()
        return await job.future

    def has_spare_time(self) -> bool:
        """Nothing waits but what is running: no final transcript, live transcript, streaming task or
        language model work queued. Sessions start speculative work only then."""
        with self._cv:
            return not self._queued()

    def _queued(self) -> bool:
        """Work waits for the worker (call with the lock held)."""
        return bool(self._finals or self._partials or self._tasks or self._lm_work())

    def promote(self, key) -> bool:
        """The live (partial) transcript of `key` is now needed as a final one: a pending one moves to
        the final queue, a running one is no longer stopped by finals. False if there is none (it
        finished, or a final transcript stopped it: its result is then None)."""
        with self._cv:
            job = self._partials.pop(key, None)
            if job is not None:
                self._finals.append(job)
                self._cv.notify()
                return True
            for running in self._running_partials:
                if running.key == key and not running.cancelled:
                    running.promoted = True
                    return True
        return False

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

    @staticmethod
    def _resolve(fut, value, exc=None):
        if not fut.done():
            if exc is not None:
                fut.set_exception(exc)
            else:
                fut.set_result(value)

    # -- worker ----------------------------------------------------------------------------------
    def _warm_up(self):
        """Run each model once on this thread before the first request: the first call of a model in a
        thread pays for its thread pool, kernel selection and allocations (~0.1-0.3 s each), which would
        otherwise land on the first user's latency."""
        t0 = time.perf_counter()
        try:
            noise = np.random.default_rng(0).standard_normal(16000).astype(np.float32) * 1e-3
            first = transcribe_batch(self.asr.decoder, [noise], self._final_opts)[0]
            transcribe_batch(self.asr.decoder, [noise], self._final_opts, [first.tokens or [0]])
            if self.lm is not None:
                runner = self.lm.runner
                with torch.inference_mode(), self._lm_thread_count():
                    slot = self.lm.free[0]
                    runner.prefill(self.lm.cache, slot, torch.tensor(self.lm.lm.encode_chat(
                        [{"role": "user", "content": "Hello."}]), dtype=torch.long), 0)
                    runner.decode_step(self.lm.cache, [slot], torch.tensor([0]))
            if self.tts is not None:
                for _ in self.tts.synthesize("Hello there."):
                    pass
        except Exception:  # noqa: BLE001 - a failed warm-up only costs the first request time
            log.exception("engine warm-up failed")
        self._warming = False
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
                if self._finals:
                    jobs = [self._finals.popleft() for _ in range(min(self.max_batch, len(self._finals)))]
                    kind = "final"
                elif self._tasks or lm_work:
                    jobs, kind = [], "stream"
                else:
                    # small partial batches: a final that arrives meanwhile waits for at most this much
                    jobs = []
                    while self._partials and len(jobs) < self.partial_batch:
                        jobs.append(self._partials.popitem(last=False)[1])
                    self._running_partials = jobs
                    kind = "partial"
            if kind == "stream":
                if self._tasks:
                    self._step_tasks()
                if lm_work:
                    self._step_lm()
            else:
                self._run_asr(jobs, kind)
                with self._cv:
                    self._running_partials = []

    def _lm_work(self) -> bool:
        return self.lm is not None and self.lm.has_work()

    def _lm_thread_count(self):
        """Context for language model work on this thread: `lm_threads` CPU threads (1: no thread
        barriers, see cpu_threads); nothing to set on GPUs."""
        from speechrt.backends.torch_backend import cpu_threads

        device = getattr(self.lm.runner, "device", None)
        return cpu_threads(self.lm_threads if device is not None and device.type == "cpu" else None)

    def _step_lm(self):
        try:  # submit() appends to a deque and cancel() sets a flag: both safe while the step runs
            with self._lm_thread_count():
                self.lm.step()
            self.metrics.stream_steps += 1
        except Exception as e:  # noqa: BLE001 - fail every request in the batch, keep serving
            log.exception("language model step failed")
            for req in list(self.lm.active.values()) + list(self.lm.pending):
                req.emit(e)
            self.lm.active.clear()
            self.lm.pending.clear()
            self.lm.free = list(range(self.lm.cache.max_batch))
            self.lm.retained.clear()

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
            if self._finals:  # a finished turn waits: serve it before the next round
                break

    def _run_asr(self, jobs: list[_AsrJob], kind: str):
        t0 = time.perf_counter()
        short = [j for j in jobs if len(j.audio) <= MAX_TURN_SAMPLES]
        long_ = [j for j in jobs if len(j.audio) > MAX_TURN_SAMPLES]
        results: list[tuple[_AsrJob, object, Exception | None]] = []
        # partials: stop once a final transcript has made every one of them useless
        stop = (lambda: all(j.cancelled for j in jobs)) if kind == "partial" else None
        try:
            if short:
                out = transcribe_batch(self.asr.decoder, [j.audio for j in short], self._final_opts,
                                       [j.draft for j in short], stop)
                results += [(j, r, None) for j, r in zip(short, out)]
        except TranscriptionCancelled:
            results += [(j, None, None) for j in short]
            self.metrics.asr_cancelled += len(short)
        except Exception as e:  # noqa: BLE001 - reported to every waiting session
            log.exception("batched transcription failed")
            results += [(j, None, e) for j in short]
        for j in long_:
            try:
                tr = self.asr.decoder.transcribe(j.audio, TranscribeOptions())
                results.append((j, WindowResult([], tr.text, 0.0, 0.0, 0.0, 0.0), None))
            except Exception as e:  # noqa: BLE001
                results.append((j, None, e))
        now = time.perf_counter()
        m = self.metrics
        m.asr_batches += 1
        m.asr_items += len(jobs)
        m.asr_seconds += now - t0
        m.asr_audio_seconds += sum(len(j.audio) for j in jobs) / 16000
        for j, r, e in results:
            if r is not None:
                (m.final_latency if kind == "final" else m.partial_latency).append(now - j.submitted)
            j.loop.call_soon_threadsafe(self._resolve, j.future, r, e)
