"""The engine's worker thread: it warms the models up, then takes the pending work in priority order (see
streaming/engine/scheduler.py) and runs it one bounded step at a time."""

from __future__ import annotations

import logging
import threading
import time

from .faults import FaultPlan, InjectedFault
from .load import LoadedMargins
from .transcripts import run_batch, step_long
from .work import Pending

log = logging.getLogger(__name__)


class Worker:
    """Runs every model step of one engine on its own thread. `step_started`: when it began the step it is in
    (None: idle); `ready` is set once the warm-up has run."""

    def __init__(
        self, pending: Pending, pipelines: tuple, max_batch: int, margins: LoadedMargins, metrics, faults: FaultPlan
    ):
        self.pending = pending
        self.asr, self.lm, self.tts = pipelines
        self.max_batch = max_batch
        self.partial_batch = 1  # a final that arrives while a partial runs waits for one utterance only
        self.margins, self.metrics, self.faults = margins, metrics, faults
        self.ready = threading.Event()
        self.step_started: float | None = None
        self.long_last = False  # the last step was a long turn's window (the next goes to streaming work)
        self.thread = threading.Thread(target=self.run, name="speechrt-engine", daemon=True)

    def run(self):
        warm_up(self.asr, self.lm, self.pending.batcher, self.tts, self.max_batch)
        self.ready.set()
        while (step := self.take()) is not None:
            self.step(*step)

    def take(self) -> tuple[str, list, bool] | None:
        """Wait for work -> the next step (its kind, its transcript jobs, whether the language model has work), in
        priority order; None once the engine stops."""
        p = self.pending
        with p.cv:
            while not (p.stopping or p.queued()):
                p.cv.wait()
            if p.stopping:
                return None
            lm_work = p.lm_work()
            streaming = bool(p.tasks or lm_work)
            if p.transcripts.finals:
                return "final", p.transcripts.take_finals(self.max_batch), lm_work
            if p.transcripts.long and not (streaming and self.long_last):
                return "long", [p.transcripts.take_long()], lm_work
            if streaming:
                return "stream", [], lm_work
            # small partial batches: a final that arrives meanwhile waits for at most this much
            return "partial", p.transcripts.take_partials(self.partial_batch), lm_work

    def step(self, kind: str, jobs: list, lm_work: bool):
        p = self.pending
        self.step_started = time.monotonic()
        self.long_last = kind == "long"
        if kind in ("final", "partial"):  # (partial batches hold the early transcripts that may become final)
            self.margins.apply(jobs, self.metrics)
        if kind == "long":
            if step_long(self.asr, jobs[0], self.faults, self.metrics):
                with p.cv:
                    p.transcripts.finish_long(jobs[0])
        elif kind == "stream":
            if p.tasks:
                self.step_tasks()
            if lm_work:
                self.step_lm()
        else:
            run_batch(self.asr, jobs, kind, self.faults, self.metrics)
            with p.cv:
                p.transcripts.done()
        end = time.monotonic()
        self.margins.load.add(self.step_started, end, live=kind == "partial")
        self.metrics.engine_seconds += end - self.step_started
        self.step_started = None

    def step_lm(self):
        batcher = self.pending.batcher
        try:  # submit() appends to a deque and cancel() sets a flag: both safe while the step runs
            self.faults.check("lm")
            batcher.step()
            self.metrics.stream_steps += 1
        except Exception as e:  # noqa: BLE001 - fail every request in the batch, keep serving
            log.exception("language model step failed")
            self.metrics.step_failures += 1
            with self.pending.cv:
                batcher.fail(e)

    def step_tasks(self):
        p = self.pending
        with p.cv:
            tasks = list(p.tasks)
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
                with p.cv:
                    try:
                        p.tasks.remove(t)
                    except ValueError:
                        pass
            if p.transcripts.finals:  # a finished turn waits: serve it before the next round
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
