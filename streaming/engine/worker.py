"""The engine's worker threads, one per model family (speech recognition, language model, voice): each warms its
model up, then takes its family's pending work in priority order (see streaming/engine/scheduler.py) and runs it one
bounded step at a time, on its own CUDA stream where the model is on a GPU, so that no family waits behind
another's step."""

from __future__ import annotations

import contextlib
import logging
import threading
import time

from .counters import count
from .faults import FaultPlan, InjectedFault
from .load import LoadedMargins, RecentLoad
from .transcripts import run_batch, step_long
from .work import Pending

log = logging.getLogger(__name__)


class FamilyWorker:
    """The thread of one family's model steps. `step_started`: when it began the step it is in (None: idle);
    `ready` is set once its warm-up has run; `load`: its recent busy share; `steps`: (start, end) of its last
    steps, newest last (for tests of what overlapped)."""

    family = ""

    def __init__(self, pending: Pending, pipeline, metrics, faults: FaultPlan):
        self.pending, self.pipeline, self.metrics, self.faults = pending, pipeline, metrics, faults
        self.ready = threading.Event()
        self.step_started: float | None = None
        self.load = RecentLoad()
        self.steps: list[tuple[float, float]] = []
        self.thread = threading.Thread(target=self.run, name=f"speechrt-engine-{self.family}", daemon=True)

    def run(self):
        with device_stream(self.pipeline):
            try:
                self.warm_up()
            except Exception:  # noqa: BLE001 - a failed warm-up only costs the first request time
                log.exception("%s warm-up failed", self.family)
            self.ready.set()
            while (step := self.take()) is not None:
                self.step_started = start = time.monotonic()
                live = self.step(step)
                end = time.monotonic()
                self.load.add(start, end, live=live)
                self.steps = [*self.steps[-63:], (start, end)]
                self.metrics.family_seconds[self.family] += end - start  # (this thread's key only)
                count(self.metrics, "engine_seconds", end - start)
                self.step_started = None

    def take(self):
        """Wait for this family's work -> the next step, in priority order; None once the engine stops."""
        p = self.pending
        with p.cv:
            while not (p.stopping or self.has_work()):
                p.cv.wait()
            return None if p.stopping else self.next_step()

    def warm_up(self) -> None:
        """Run the model once on this thread (its thread pool, kernel choices and allocations are made here)."""

    def has_work(self) -> bool:  # (with the lock held)
        raise NotImplementedError

    def next_step(self):  # (with the lock held)
        raise NotImplementedError

    def step(self, step) -> bool:
        """Run `step` -> whether it was live work (live transcripts: they fill spare time)."""
        raise NotImplementedError

    def step_tasks(self, tasks) -> None:
        """One round of streaming tasks: one step each, round-robin (every response keeps moving)."""
        p = self.pending
        for t in tasks:
            try:
                self.faults.check(self.family)
                alive = t.step()
            except InjectedFault as e:
                t.emit(e)
                alive = False
                count(self.metrics, "step_failures")
            count(self.metrics, "stream_steps")
            if not alive:
                with p.cv:
                    with contextlib.suppress(ValueError):
                        p.tasks[self.family].remove(t)
            if self.interrupted():
                break

    def interrupted(self) -> bool:
        """More urgent work of this family came: the round of tasks stops for it."""
        return False


class AsrWorker(FamilyWorker):
    """Speech recognition: finals first (batched), long turns' windows taking turns with streaming tasks (REST
    transcripts, word timings), then streaming tasks, then live transcripts in small batches."""

    family = "asr"

    def __init__(self, pending, asr, max_batch: int, margins: LoadedMargins, metrics, faults):
        super().__init__(pending, asr, metrics, faults)
        self.max_batch = max_batch
        self.partial_batch = 1  # a final that arrives while a partial runs waits for one utterance only
        self.margins = margins
        self.margins.load = self.load  # finals' margin follows this thread's load
        self.long_last = False  # the last step was a long turn's window (the next goes to streaming work)

    def warm_up(self):
        self.pipeline.warm_up(self.max_batch)

    def has_work(self):
        p = self.pending
        return bool(p.transcripts or p.tasks["asr"])

    def next_step(self):
        p = self.pending
        streaming = bool(p.tasks["asr"])
        if p.transcripts.finals:
            return "final", p.transcripts.take_finals(self.max_batch)
        if p.transcripts.long and not (streaming and self.long_last):
            return "long", [p.transcripts.take_long()]
        if streaming:
            return "stream", list(p.tasks["asr"])
        # small partial batches: a final that arrives meanwhile waits for at most this much
        return "partial", p.transcripts.take_partials(self.partial_batch)

    def step(self, step) -> bool:
        kind, jobs = step
        p = self.pending
        self.long_last = kind == "long"
        if kind in ("final", "partial"):  # (partial batches hold the early transcripts that may become final)
            self.margins.apply(jobs, self.metrics)
        if kind == "long":
            if step_long(self.pipeline, jobs[0], self.faults, self.metrics):
                with p.cv:
                    p.transcripts.finish_long(jobs[0])
        elif kind == "stream":
            self.step_tasks(jobs)
        else:
            yielded = run_batch(self.pipeline, jobs, kind, self.faults, self.metrics, p.transcripts.urgent)
            with p.cv:
                p.transcripts.done()
                unwanted = [j for j in yielded if not p.transcripts.requeue(j)]
            for j in unwanted:
                j.resolve(None)
        return kind == "partial"

    def interrupted(self) -> bool:
        return bool(self.pending.transcripts.finals)  # a finished turn waits: serve it before the next task


class LmWorker(FamilyWorker):
    """The language model: one step of its continuous batch (every conversation's next token) at a time."""

    family = "lm"

    def warm_up(self):
        if self.pipeline is not None:
            self.pipeline.warm_up(self.pending.batcher)

    def has_work(self):
        return self.pending.lm_work()

    def next_step(self):
        return "lm"

    def step(self, step) -> bool:
        batcher = self.pending.batcher
        try:  # submit() appends to a deque and cancel() sets a flag: both safe while the step runs
            self.faults.check("lm")
            batcher.step()
            count(self.metrics, "stream_steps")
        except Exception as e:  # noqa: BLE001 - fail every request in the batch, keep serving
            log.exception("language model step failed")
            count(self.metrics, "step_failures")
            with self.pending.cv:
                batcher.fail(e)
        return False


class TtsWorker(FamilyWorker):
    """The voice: rounds of synthesis tasks (a window of audio each), round-robin, so first audio is soon."""

    family = "tts"

    def warm_up(self):
        if self.pipeline is not None:
            for _ in self.pipeline.synthesize("Hello there."):
                pass

    def has_work(self):
        return bool(self.pending.tasks["tts"])

    def next_step(self):
        return list(self.pending.tasks["tts"])

    def step(self, step) -> bool:
        self.step_tasks(step)
        return False


@contextlib.contextmanager
def device_stream(pipeline):
    """Run the block on a CUDA stream of its own when `pipeline`'s model is on a CUDA device (families then overlap
    on the GPU instead of queueing on its default stream); elsewhere (CPU, no model) as it is."""
    device = getattr(getattr(pipeline, "runner", None), "device", None)
    if getattr(device, "type", None) != "cuda":
        yield None
        return
    import torch  # (only with a model on a CUDA device, so torch is there)

    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.default_stream(device))  # what loading queued (weights, caches' zeros) comes first
    with torch.cuda.stream(stream):
        yield stream
