"""The scheduler shared by all sessions on one device.

All model compute runs on one worker thread, so the event loop never blocks on it. Sessions submit work
and await futures (or async queues for streams). The worker takes work in priority order:

1. final transcripts of finished turns, batched across sessions (one encoder call, decode steps over all
   rows together), at most one queued per turn (the turn up to a later pause replaces the one before); a
   turn with over 30 s not committed (streaming/realtime/long_turn.py commits long turns' stable parts as they are
   spoken) is transcribed one 30-s window per step, long turns taking turns with each other and, when there
   is any, with a round of streaming steps (so a minute-long monologue delays no one by more than a window);
   while the worker has been busy (90 % of the last 2 s, 30 % on other work than live transcripts, which fill
   any spare time), finals (and the early transcripts that may become final) read less padding after their turn
   (transcripts.LoadedMargins: 3 s, not 10);
2. steps of streaming tasks that produce audio or tokens for someone waiting (TTS chunks, language
   model tokens), round-robin, one step each, so every response keeps moving and first audio is soon;
3. partial transcripts of turns still being spoken, newest request per stream only: first those that open a
   turn's text (its first words: short audio, tens of ms), then the others, oldest first.

It calls the pipelines only (speechrt.pipelines): ASR transcribe_batch, the LM's continuous batcher,
TTS synthesis; how they use the device and the CPU's threads was chosen when they were loaded.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
from dataclasses import dataclass

import numpy as np

from speechrt.pipelines.asr import TranscribeOptions

from .asr_options import LIVE
from .metrics import Metrics
from .transcripts import LoadedMargins, TranscriptJob, TranscriptQueue, run_batch, step_long

log = logging.getLogger(__name__)
MAX_LIVE_STRETCH = 4.0


@dataclass
class Fault:
    """A fault to inject into the next `count` steps of a stage (asr, lm, tts): each raises InjectedFault, or,
    with `stall_s`, sleeps that long first (a worker that hangs). For tests of what sessions are told."""

    stage: str
    count: int = 1
    stall_s: float = 0.0

    def __post_init__(self):
        if self.stage not in ("asr", "lm", "tts"):
            raise ValueError(f"fault stage must be asr, lm or tts, got {self.stage!r}")
        if self.count < 1 or not 0 <= self.stall_s <= 600:
            raise ValueError("fault count must be >= 1 and stall_s in [0, 600]")


class InjectedFault(RuntimeError):
    pass


class EngineStalled(RuntimeError):
    """The engine's worker spent longer than the stall timeout in one step."""


class FaultPlan:
    """The faults injected and not yet spent; checked by the worker before each step."""

    def __init__(self):
        self.lock = threading.Lock()
        self.faults: list[Fault] = []

    def add(self, fault: Fault) -> None:
        with self.lock:
            self.faults.append(fault)

    def check(self, stage: str) -> None:
        """Before a step of `stage`: apply a pending fault of that stage, if any."""
        with self.lock:
            fault = next((f for f in self.faults if f.stage == stage), None)
            if fault is None:
                return
            fault.count -= 1
            if fault.count <= 0:
                self.faults.remove(fault)
        if fault.stall_s:
            time.sleep(fault.stall_s)
        else:
            raise InjectedFault(f"injected fault in a {stage} step")


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

    def __init__(self, asr, lm=None, max_batch: int = 8, tts=None, loaded_margin: float | None = None):
        self.asr, self.lm, self.tts = asr, lm, tts
        self.margins = LoadedMargins(loaded_margin)  # finals' margin under load (transcripts.LoadedMargins)
        self.max_batch = max_batch
        self.partial_batch = 1  # a final that arrives while a partial runs waits for one utterance only
        self.batcher = lm.batcher(max_batch=max_batch) if lm is not None else None  # one for all conversations
        self.metrics = Metrics()
        self._cv = threading.Condition()
        self._transcripts = TranscriptQueue()
        self._tasks: collections.deque[StreamTask] = collections.deque()
        self.faults = FaultPlan()  # injected by tests (the server's /debug/fault)
        self._stop = False
        self._ready = threading.Event()  # set once the warm-up has run
        self._step_started: float | None = None  # when the worker began the step it is in (None: idle)
        self._long_last = False  # the last step was a long turn's window (the next goes to streaming work)
        self._thread = threading.Thread(target=self._run, name="speechrt-engine", daemon=True)

    # -- submission (event loop side) -------------------------------------------------------------
    def start(self):
        self._thread.start()

    def stop(self):
        with self._cv:
            self._stop = True
            self._cv.notify()
        self._thread.join(timeout=10)

    def wait_warm(self, timeout: float) -> bool:
        """Block until the worker has warmed the models up (True), or `timeout` seconds passed (False)."""
        return self._ready.wait(timeout)

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
        longer than prompt_room() keeps its end (callers trim whole turns first: LMPipeline.encode_chat_within)."""
        from speechrt.pipelines.lm_batching import LMRequest

        loop = asyncio.get_running_loop()
        q: asyncio.Queue = asyncio.Queue()

        def emit(piece):
            if isinstance(piece, Exception) or piece.text or piece.finish_reason or piece.logprob is not None:
                loop.call_soon_threadsafe(q.put_nowait, piece)

        req = LMRequest(list(ids[-self.prompt_room(options.max_tokens) :]), options, emit, key=key)
        with self._cv:
            self.batcher.submit(req)
            self._cv.notify()
        return req, q

    def prompt_room(self, max_tokens: int) -> int:
        """The longest prompt that leaves room in the cache for an answer of `max_tokens` (at least half
        of the cache is the prompt's: a longer answer stops when the context is full)."""
        return max(self.batcher.max_seq // 2, self.batcher.max_seq - max_tokens)

    def cancel_generation(self, req):
        with self._cv:
            req.cancelled = True
            self._cv.notify()

    async def transcribe(
        self,
        audio: np.ndarray,
        partial: bool = False,
        key=None,
        draft: list[int] | None = None,
        supersede: bool = False,
        options: TranscribeOptions = LIVE,
        turn=None,
        opening: bool = False,
        fresh=None,
    ):
        """Transcript (a WindowResult) of one utterance (16 kHz float32), or None. Partials with the same
        key coalesce: only the newest pending one runs, older ones resolve to None. A final drops its key's
        pending partial (made useless) and stops any running partial but one that opens a turn's text (a final
        waits for no live transcript but a short one); both resolve to None. `draft`: the tokens of an earlier
        transcript of (the start of) the same speech; decoding checks them in one pass instead of producing them
        one step at a time — same transcript, fewer steps. `supersede` (partials): the running partial of the same
        key stops too (this one covers its audio and more). `options`: language and prompt of the session. `turn`
        (finals): a final of the same key and turn still queued is replaced (resolves to None): one per turn waits.
        `opening` (partials): a turn's first words are sought; it runs before other live transcripts."""
        loop = asyncio.get_running_loop()
        job = TranscriptJob(
            audio,
            options,
            loop.create_future(),
            loop,
            time.perf_counter(),
            key,
            None if partial else turn,
            draft,
            opening=partial and opening,
            fresh=fresh if partial else None,
        )
        with self._cv:
            old = self._transcripts.submit(job, partial, supersede)
            self._cv.notify()
        for j in old:
            j.resolve(None)
        self.metrics.finals_superseded += sum(j.turn is not None for j in old)
        return await job.future

    def forget(self, key) -> None:
        """A session closed: its queued transcripts are dropped (resolving to None) and its running live
        transcript stops."""
        with self._cv:
            dropped = self._transcripts.forget(key)
        for job in dropped:
            job.resolve(None)

    def stalled_for(self) -> float:
        """Seconds the worker has spent in its current step (0 while it waits for work). A step is one
        transcription batch, one language model step or one round of synthesis steps: far under a
        second normally, one 30-s window of a long turn at most."""
        started = self._step_started
        return 0.0 if started is None else time.monotonic() - started

    async def wait(self, awaitable, stall_timeout: float):
        """Await engine work; EngineStalled if the worker spends more than `stall_timeout` in one step
        meanwhile (a hang: the work may never come). Waiting behind other work that moves is not a stall."""
        task = asyncio.ensure_future(awaitable)
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=min(1.0, stall_timeout / 4))
                if done:
                    return task.result()
                if self.stalled_for() > stall_timeout:
                    raise EngineStalled(f"the engine has been stuck in one step for more than {stall_timeout:g} s")
        finally:
            if not task.done():
                task.cancel()

    def live_interval(self, base: float) -> float:
        """The wait before a session's next live transcript: `base`, stretched (up to 4x) while transcripts
        queue, so that live text degrades before final transcripts wait."""
        with self._cv:
            stretch = min(MAX_LIVE_STRETCH, max(1.0, len(self._transcripts) / 2))
        self.metrics.live_stretch = stretch
        return base * stretch

    def has_spare_time(self, lm: bool = True, live: bool = True) -> bool:
        """Nothing waits but what is running: no final transcript, streaming task, live transcript (unless not
        `live`: they come after language model work anyway) or language model work (unless not `lm`: a sequence
        more joins its batch) queued. Speculative work starts only then."""
        with self._cv:
            return not self._queued(lm, live)

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
    def _queued(self, lm: bool = True, live: bool = True) -> bool:
        """Work waits for the worker (language model work only if `lm`, live transcripts only if `live`; call
        with the lock held)."""
        t = self._transcripts
        return bool(t.finals or t.long or (live and t.partials) or self._tasks or (lm and self._lm_work()))

    def _lm_work(self) -> bool:
        return self.batcher is not None and self.batcher.has_work()

    def _run(self):
        warm_up(self.asr, self.lm, self.batcher, self.tts, self.max_batch)
        self._ready.set()
        while True:
            with self._cv:
                while not (self._stop or self._queued()):
                    self._cv.wait()
                if self._stop:
                    return
                lm_work = self._lm_work()
                streaming = bool(self._tasks or lm_work)
                if self._transcripts.finals:
                    jobs, kind = self._transcripts.take_finals(self.max_batch), "final"
                elif self._transcripts.long and not (streaming and self._long_last):
                    jobs, kind = [self._transcripts.take_long()], "long"
                elif streaming:
                    jobs, kind = [], "stream"
                else:  # small partial batches: a final that arrives meanwhile waits for at most this much
                    jobs, kind = self._transcripts.take_partials(self.partial_batch), "partial"
            self._step_started = time.monotonic()
            self._long_last = kind == "long"
            if kind in ("final", "partial"):  # (partial batches hold the early transcripts that may become final)
                self.margins.apply(jobs, self.metrics)
            if kind == "long":
                if step_long(self.asr, jobs[0], self.faults, self.metrics):
                    with self._cv:
                        self._transcripts.finish_long(jobs[0])
            elif kind == "stream":
                if self._tasks:
                    self._step_tasks()
                if lm_work:
                    self._step_lm()
            else:
                run_batch(self.asr, jobs, kind, self.faults, self.metrics)
                with self._cv:
                    self._transcripts.done()
            end = time.monotonic()
            self.margins.load.add(self._step_started, end, live=kind == "partial")
            self.metrics.engine_seconds += end - self._step_started
            self._step_started = None

    def _step_lm(self):
        try:  # submit() appends to a deque and cancel() sets a flag: both safe while the step runs
            self.faults.check("lm")
            self.batcher.step()
            self.metrics.stream_steps += 1
        except Exception as e:  # noqa: BLE001 - fail every request in the batch, keep serving
            log.exception("language model step failed")
            self.metrics.step_failures += 1
            with self._cv:
                self.batcher.fail(e)

    def _step_tasks(self):
        with self._cv:
            tasks = list(self._tasks)
        for t in tasks:
            try:
                self.faults.check("tts")
                alive = t.step()
            except InjectedFault as e:
                t.emit(e)
                alive = False
                self.metrics.step_failures += 1
            self.metrics.stream_steps += 1
            if not alive:
                with self._cv:
                    try:
                        self._tasks.remove(t)
                    except ValueError:
                        pass
            if self._transcripts.finals:  # a finished turn waits: serve it before the next round
                break


def warm_up(asr, lm, batcher, tts, max_batch: int = 1):
    """Run each model once on the engine's thread before the first request: the first call of a model in a
    thread pays for its thread pool, kernel selection and allocations (~0.1-0.3 s each), which would
    otherwise land on the first user's latency. On a GPU the recognizer also runs a batch of each size
    bucket up to `max_batch` (ASRPipeline.warm_batches: kernels compiled, decode graphs captured)."""
    t0 = time.perf_counter()
    try:
        asr.warm_up(max_batch)
        if lm is not None:
            lm.warm_up(batcher)
        if tts is not None:
            for _ in tts.synthesize("Hello there."):
                pass
    except Exception:  # noqa: BLE001 - a failed warm-up only costs the first request time
        log.exception("engine warm-up failed")
    log.info("engine warmed up in %.2f s", time.perf_counter() - t0)
