"""The engine's queue of transcription work. Final transcripts (of finished turns) are served first, in
order, batched across sessions; live transcripts (of turns still being spoken) are kept newest-only per
key (a session), and a final one stops a running live one. All methods are called with the engine's lock
held; futures are resolved by the caller on their event loops."""
from __future__ import annotations

import asyncio
import collections
from dataclasses import dataclass

import numpy as np

from speechrt.pipelines.asr import TranscribeOptions


@dataclass(eq=False)
class TranscriptJob:
    audio: np.ndarray  # float32 at 16 kHz
    options: TranscribeOptions
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    submitted: float
    key: object = None  # live transcripts: one pending job per key (a newer one replaces it)
    draft: list[int] | None = None  # a guess of the tokens (an earlier transcript of the same speech)
    cancelled: bool = False  # a running live transcript that a final one asked to stop
    promoted: bool = False  # a live transcript whose result a final waits for: finals do not stop it

    def resolve(self, value, error: Exception | None = None) -> None:
        """Deliver the result (or the error) to the waiting session, from any thread."""
        self.loop.call_soon_threadsafe(_settle, self.future, value, error)


def _settle(fut: asyncio.Future, value, error):
    if not fut.done():
        if error is not None:
            fut.set_exception(error)
        else:
            fut.set_result(value)


class TranscriptQueue:
    def __init__(self):
        self.finals: collections.deque[TranscriptJob] = collections.deque()
        self.partials: collections.OrderedDict[object, TranscriptJob] = collections.OrderedDict()
        self.running: list[TranscriptJob] = []  # the live transcripts being computed

    def __len__(self) -> int:
        return len(self.finals) + len(self.partials)

    def submit(self, job: TranscriptJob, partial: bool, supersede: bool = False) -> TranscriptJob | None:
        """Queue `job` -> the pending live job of its key that it replaces (to be resolved with None)."""
        old = self.partials.pop(job.key, None) if job.key is not None else None
        if partial:
            self.partials[job.key] = job
            if supersede:  # the running live transcript of this key covers less audio: stop it
                for run in self.running:
                    if run.key == job.key and not run.promoted:
                        run.cancelled = True
        else:
            # a final transcript never waits for a live one: the running one stops at its next step
            # (after its encoder pass at worst) and its session asks again later
            for run in self.running:
                run.cancelled = run.cancelled or not run.promoted
            self.finals.append(job)
        return old

    def promote(self, key) -> bool:
        """The live transcript of `key` is now needed as a final one: a pending one moves to the final
        queue, a running one is no longer stopped by finals. False if there is none."""
        job = self.partials.pop(key, None)
        if job is not None:
            self.finals.append(job)
            return True
        for run in self.running:
            if run.key == key and not run.cancelled:
                run.promoted = True
                return True
        return False

    def take_finals(self, max_batch: int) -> list[TranscriptJob]:
        return [self.finals.popleft() for _ in range(min(max_batch, len(self.finals)))]

    def take_partials(self, max_batch: int) -> list[TranscriptJob]:
        """The oldest pending live transcripts, now running (until `done()`)."""
        jobs = []
        while self.partials and len(jobs) < max_batch:
            jobs.append(self.partials.popitem(last=False)[1])
        self.running = jobs
        return jobs

    def done(self) -> None:
        self.running = []
