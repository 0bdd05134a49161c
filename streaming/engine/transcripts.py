"""Transcript jobs, their kinds (Work) and the engine's queue of them. Final transcripts (of finished turns) are
served first, in order, batched across sessions; those of turns over 30 s run long-form one window per engine step,
taking turns with each other and with other work (step_long); live transcripts (of turns still being spoken)
are kept newest-only per key (a session), and a final one stops a running live one. All methods are
called with the engine's lock held; futures are resolved by the caller on their event loops. The transcripts run on
the engine's ASR worker (worker.AsrWorker)."""

from __future__ import annotations

import asyncio
import collections
import enum
import itertools
import logging
import time
from dataclasses import dataclass

import numpy as np

from speechrt.pipelines.asr import (
    MAX_UTTERANCE_SAMPLES,
    SAMPLE_RATE,
    TranscribeOptions,
    TranscriptionCancelled,
    WindowResult,
)

from ..asr_options import long_options
from .counters import count

log = logging.getLogger(__name__)

# a final over this much audio is not batched with shorter ones (TranscriptQueue.take_finals): a turn's final is
# at most a few seconds with the final margin, a long turn's rest (after what it committed) up to 30 s
LONE_FINAL = 8 * SAMPLE_RATE
# a lone final (or a promoted early transcript over LONE_FINAL) stops for short finals queued meanwhile (a
# neighbour's turn), at most this many times, and goes on after them from the tokens it had (its draft)
MAX_YIELDS = 3
YIELDED = object()  # run_jobs' result for such a job: it goes back to the queue (TranscriptQueue.requeue)


class Work(enum.Enum):
    """The kind of transcript asked of the engine (Engine.transcribe): where it waits and what it stops."""

    # a finished turn's (or an audio item's): served first, batched across sessions; it drops its key's pending live
    # transcript and stops the running ones (but an OPENING one, or one a final waits for); with a `turn`, it
    # replaces the final of the same key and turn still queued (one per turn waits)
    FINAL = "final"
    # a turn still being spoken: after streaming work, newest per key only (an older pending one resolves to None)
    LIVE = "live"
    # LIVE, of a turn's first words (short audio): it runs before other live transcripts, and finals do not stop it
    # (finishing it costs a final tens of ms; stopping it, a round)
    OPENING = "opening"
    # LIVE, over the audio of its key's running live transcript and more (the turn up to where the input went
    # quiet): that one stops too; Engine.promote may make it the turn's final
    EARLY = "early"

    @property
    def live(self) -> bool:
        """Live priority (a turn still being spoken): every kind but FINAL."""
        return self is not Work.FINAL


@dataclass(eq=False)
class TranscriptJob:
    audio: np.ndarray  # float32 at 16 kHz
    options: TranscribeOptions
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    submitted: float
    work: Work = Work.FINAL
    key: object = None  # live transcripts: one pending job per key (a newer one replaces it)
    turn: object = None  # finals: one queued job per (key, turn); a newer one (a later pause) replaces it
    draft: list[int] | None = None  # a guess of the tokens (an earlier transcript of the same speech)
    cancelled: bool = False  # a running live transcript that a final one asked to stop
    passed: bool = False  # a final over LONE_FINAL that shorter ones went ahead of (take_finals)
    yields: int = 0  # times it stopped for short finals queued meanwhile (MAX_YIELDS)
    promoted: bool = False  # a live transcript whose result a final waits for: finals do not stop it
    steps: object = None  # a long turn's long-form transcription, one window per next() (once begun)
    # live transcripts: called on the worker as the job begins -> the newest audio of its turn (which grew while
    # the job waited), or None to keep `audio`
    fresh: object = None

    @property
    def opening(self) -> bool:
        """A turn's first live words (Work.OPENING)."""
        return self.work is Work.OPENING

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
        self.long: collections.deque[TranscriptJob] = collections.deque()  # finals over 30 s, begun or not
        self.partials: collections.OrderedDict[object, TranscriptJob] = collections.OrderedDict()
        self.running: list[TranscriptJob] = []  # the live transcripts being computed

    def __len__(self) -> int:
        return len(self.finals) + len(self.long) + len(self.partials)

    def submit(self, job: TranscriptJob) -> list[TranscriptJob]:
        """Queue `job` -> the jobs it replaces (to be resolved with None): the pending live job of its key and,
        for a final one of a turn, that turn's final queued before it (the turn up to an earlier pause,
        which the turn's speech made useless when it went on)."""
        old = [self.partials.pop(job.key)] if job.key is not None and job.key in self.partials else []
        if job.work.live:
            self.partials[job.key] = job
            if job.work is Work.EARLY:  # the running live transcript of this key covers less audio: stop it
                for run in self.running:
                    if run.key == job.key and not run.promoted:
                        run.cancelled = True
        else:
            # a final transcript never waits for a live one: the running one stops at its next step
            # (after its encoder pass at worst) and its session asks again later
            for run in self.running:
                run.cancelled = run.cancelled or not (run.promoted or run.opening)
            if job.turn is not None:
                old += [j for j in self.finals if (j.key, j.turn) == (job.key, job.turn)]
                self.finals = collections.deque(j for j in self.finals if j not in old)
            self._final(job)
        return old

    def _final(self, job: TranscriptJob) -> None:
        (self.long if len(job.audio) > MAX_UTTERANCE_SAMPLES else self.finals).append(job)

    def promote(self, key) -> bool:
        """The live transcript of `key` is now needed as a final one: a pending one moves to the final
        queue, a running one is no longer stopped by finals. False if there is none."""
        job = self.partials.pop(key, None)
        if job is not None:
            self._final(job)
            return True
        for run in self.running:
            if run.key == key and not run.cancelled:
                run.promoted = True
                return True
        return False

    def forget(self, key) -> list[TranscriptJob]:
        """Drop every queued job of `key` (returned, to be resolved with None); its running live transcript
        stops at its next step."""
        dropped = [j for j in (*self.finals, *self.long) if j.key == key]
        self.finals = collections.deque(j for j in self.finals if j.key != key)
        self.long = collections.deque(j for j in self.long if j.key != key)
        if key in self.partials:
            dropped.append(self.partials.pop(key))
        for run in self.running:
            if run.key == key:
                run.cancelled, run.promoted = True, False
        return dropped

    def take_finals(self, max_batch: int) -> list[TranscriptJob]:
        """The next batch of finals: those of at most LONE_FINAL of audio, in order; one over it (a long turn's
        rest: its decode takes many steps, and a batch is done when its longest row is) runs alone, after the
        shorter ones queued with it, but once they have gone ahead of it, before any others."""
        lone = [j for j in self.finals if len(j.audio) > LONE_FINAL]
        short = [] if lone and lone[0].passed else [j for j in self.finals if len(j.audio) <= LONE_FINAL]
        take = short[:max_batch] or lone[:1]
        for j in lone:
            j.passed = j.passed or bool(short)
        self.finals = collections.deque(j for j in self.finals if j not in take)
        return take

    def take_long(self) -> TranscriptJob:
        """The long turn whose window is next; it goes to the back of the line (round-robin)."""
        job = self.long.popleft()
        self.long.append(job)
        return job

    def finish_long(self, job: TranscriptJob) -> None:
        if job in self.long:
            self.long.remove(job)

    def take_partials(self, max_batch: int) -> list[TranscriptJob]:
        """The pending live transcripts that open a turn's text, then the others, oldest first; now running
        (until `done()`)."""
        order = sorted(self.partials.values(), key=lambda j: (not j.opening, j.submitted))[:max_batch]
        jobs = [self.partials.pop(j.key) for j in order]
        for j in jobs:
            try:
                newest = j.fresh() if j.fresh is not None else None
            except Exception:  # noqa: BLE001 - the worker goes on; the round keeps the audio it was asked with
                log.exception("reading a live transcript's newest audio failed")
                newest = None
            if newest is not None and len(newest) > len(j.audio):
                j.audio = newest
        self.running = jobs
        return jobs

    def done(self) -> None:
        self.running = []

    def urgent(self) -> bool:
        """Short finals wait (a neighbour's finished turn): a lone final that runs yields to them."""
        return any(len(j.audio) <= LONE_FINAL for j in self.finals)

    def requeue(self, job: TranscriptJob) -> bool:
        """A lone final that yielded to short finals: back to the front of the queue, after them (take_finals) ->
        False where it is no longer wanted (a later final of its turn came meanwhile: resolve it with None)."""
        if job.turn is not None and any((j.key, j.turn) == (job.key, job.turn) for j in self.finals):
            return False
        job.passed, job.yields = False, job.yields + 1
        self.finals.appendleft(job)
        return True


def run_jobs(asr, jobs: list[TranscriptJob], partial: bool, faults, metrics, urgent=None) -> list[tuple]:
    """Transcribe `jobs` (utterances of at most 30 s, on the engine's worker) -> (job, WindowResult, YIELDED or
    None, error or None) each, as one batch per set of options (a session's language and prompt). Live
    transcripts (`partial`) stop once a final transcript made every one of them useless. A job alone over
    LONE_FINAL that a final waits for (a final, or a promoted early transcript) stops when `urgent()` (short finals
    queued: a long decode would hold them) and it has yielded fewer than MAX_YIELDS times: YIELDED, its tokens so
    far its draft (its next run checks them in one pass)."""
    results: list[tuple[TranscriptJob, object, Exception | None]] = []
    stop = (lambda: all(j.cancelled for j in jobs)) if partial else None
    lone = jobs[0] if len(jobs) == 1 and len(jobs[0].audio) > LONE_FINAL else None
    if lone is not None and urgent is not None and lone.yields < MAX_YIELDS:
        live_stop = stop

        def stop():
            if live_stop is not None and live_stop():
                return True
            return (not partial or lone.promoted) and urgent()

    short = [j for j in jobs if len(j.audio) <= MAX_UTTERANCE_SAMPLES]
    # a live transcript of a turn over 30 s (an early one: live ones take the last 30 s) is not worth a
    # long-form pass at live priority: none, and the turn's final transcript is made when it ends
    results += [(j, None, None) for j in jobs if len(j.audio) > MAX_UTTERANCE_SAMPLES]
    for opts, group in itertools.groupby(sorted(short, key=lambda j: repr(j.options)), key=lambda j: j.options):
        group = list(group)
        try:
            faults.check("asr")
            out = asr.transcribe_batch([j.audio for j in group], opts, [j.draft for j in group], stop)
            results += [(j, r, None) for j, r in zip(group, out)]
        except TranscriptionCancelled as e:
            if group == [lone] and not lone.cancelled and (not partial or lone.promoted):
                if e.tokens and len(e.tokens[0]) > len(lone.draft or []):
                    lone.draft = list(e.tokens[0])
                results.append((lone, YIELDED, None))
                continue
            results += [(j, None, None) for j in group]
            metrics.asr_cancelled += len(group)
        except Exception as e:  # noqa: BLE001 - reported to every waiting session
            log.exception("batched transcription failed")
            count(metrics, "step_failures")
            results += [(j, None, e) for j in group]
    return results


def run_batch(asr, jobs: list[TranscriptJob], kind: str, faults, metrics, urgent=None) -> list[TranscriptJob]:
    """Transcribe one batch of `kind` (final or partial) on the engine's worker (run_jobs), count it and resolve
    each job -> the jobs that yielded to short finals (`urgent`, see run_jobs), to be queued again."""
    t0 = time.perf_counter()
    results = run_jobs(asr, jobs, kind == "partial", faults, metrics, urgent)
    yielded = [j for j, r, _ in results if r is YIELDED]
    results = [x for x in results if x[1] is not YIELDED]
    now = time.perf_counter()
    m = metrics
    m.asr_batches += 1
    m.kind_seconds[kind] += now - t0
    m.kind_items[kind] += len(results)
    m.asr_audio_seconds += sum(len(j.audio) for j, _, _ in results) / SAMPLE_RATE
    m.finals_yielded += len(yielded)
    for j, r, e in results:
        if r is not None:
            (m.final_latency if kind == "final" else m.partial_latency).append(now - j.submitted)
        j.resolve(r, e)
    return yielded


def step_long(asr, job: TranscriptJob, faults, metrics) -> bool:
    """One window of a long turn's transcript (on the engine's worker) -> True when the job is over (its
    transcript or its error delivered)."""
    try:
        faults.check("asr")
        if job.steps is None:
            job.steps = asr.transcribe_steps(job.audio, long_options(job.options))
        t0 = time.perf_counter()
        try:
            next(job.steps)
            metrics.long_steps += 1
            return False
        except StopIteration as end:
            metrics.long_steps += 1
            tr = end.value
        finally:
            metrics.kind_seconds["long"] += time.perf_counter() - t0
    except Exception as e:  # noqa: BLE001 - reported to the waiting session
        log.exception("long-form transcription failed")
        count(metrics, "step_failures")
        job.resolve(None, e)
        return True
    metrics.kind_items["long"] += 1
    metrics.asr_audio_seconds += len(job.audio) / SAMPLE_RATE
    metrics.final_latency.append(time.perf_counter() - job.submitted)
    job.resolve(WindowResult([], tr.text, 0.0, 0.0, 0.0, 0.0, segments=tr.segments))
    return True
