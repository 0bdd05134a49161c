"""The engine: the scheduler shared by all sessions on one device (Engine), where work is submitted and awaited.

Model compute runs on three worker threads, one per model family (worker.py: speech recognition, the language
model, the voice), each on its own CUDA stream where its model is on a GPU, so that a voice chunk or a language
model step never waits behind a transcription batch, and the event loop never blocks on any of them. Sessions
submit work and await futures (or async queues for streams). Each worker takes its family's work in priority order:

speech recognition (worker.AsrWorker):
1. final transcripts of finished turns, batched across sessions (one encoder call, decode steps over all
   rows together), at most one queued per turn (the turn up to a later pause replaces the one before); a
   turn with over 30 s not committed (realtime/long_turn.py commits long turns' stable parts as they
   are spoken) is transcribed one 30-s window per step, long turns taking turns with each other and, when there
   is any, with a round of the family's streaming steps (so a minute-long monologue delays no one by more than a
   window); while the worker has been busy (90 % of the last 2 s, 30 % on other work than live transcripts, which
   fill any spare time), finals (and the early transcripts that may become final) read less padding after their
   turn (load.LoadedMargins: 3 s, not 10);
2. steps of streaming tasks (REST transcripts one window per step, word timings), round-robin;
3. partial transcripts of turns still being spoken, newest request per stream only: first those that open a
   turn's text (its first words: short audio, tens of ms), then the others, oldest first.

the language model (worker.LmWorker): one step of the continuous batch of every conversation at a time;
the voice (worker.TtsWorker): rounds of synthesis steps, round-robin, one window each, so first audio is soon.

The kinds of transcript are transcripts.Work; the queues the workers take from are work.Pending.

It calls the pipelines only (speechrt.pipelines): ASR transcribe_batch, the LM's continuous batcher,
TTS synthesis; how they use the device and the CPU's threads was chosen when they were loaded.
"""

from __future__ import annotations

import asyncio
import time

import numpy as np

from speechrt.pipelines.asr import TranscribeOptions

from ..asr_options import LIVE
from .counters import Metrics
from .faults import EngineStalled, FaultPlan
from .load import LoadedMargins
from .transcripts import TranscriptJob, Work
from .work import FAMILIES, TASK_FAMILIES, Pending, StreamTask
from .worker import AsrWorker, LmWorker, TtsWorker

MAX_LIVE_STRETCH = 4.0


class Engine:
    """`asr`, `lm`, `tts`: the pipelines (speechrt.pipelines); lm and tts may be None (transcription only)."""

    def __init__(self, asr, lm=None, max_batch: int = 8, tts=None, loaded_margin: float | None = None):
        self.asr, self.lm, self.tts = asr, lm, tts
        self.max_batch = max_batch
        self.batcher = lm.batcher(max_batch=max_batch) if lm is not None else None  # one for all conversations
        self.metrics = Metrics()
        self.faults = FaultPlan()  # injected by tests (the server's /debug/fault)
        self.pending = Pending(self.batcher)
        p, m, f = self.pending, self.metrics, self.faults
        # one worker thread per family (finals' margin under load: load.LoadedMargins); one without a model idles
        self.workers = {
            "asr": AsrWorker(p, asr, max_batch, LoadedMargins(loaded_margin), m, f),
            "lm": LmWorker(p, lm, m, f),
            "tts": TtsWorker(p, tts, m, f),
        }
        m.family_seconds.update(dict.fromkeys(self.workers, 0.0))  # (each family on /metrics from the start)

    # -- lifecycle --------------------------------------------------------------------------------
    def start(self):
        for w in self.workers.values():
            w.thread.start()

    def stop(self):
        """Stop every worker thread (each ends the step it is in) and wait for them."""
        with self.pending.cv:
            self.pending.stopping = True
            self.pending.wake()
        deadline = time.monotonic() + 10
        for w in self.workers.values():
            w.thread.join(timeout=max(0.0, deadline - time.monotonic()))

    def wait_warm(self, timeout: float) -> bool:
        """Block until every worker has warmed its model up (True), or `timeout` seconds passed (False)."""
        deadline = time.monotonic() + timeout
        return all(w.ready.wait(max(0.0, deadline - time.monotonic())) for w in self.workers.values())

    # -- transcripts ------------------------------------------------------------------------------
    async def transcribe(
        self,
        audio: np.ndarray,
        work: Work = Work.FINAL,
        *,
        key=None,
        options: TranscribeOptions = LIVE,
        draft: list[int] | None = None,
        turn=None,
        fresh=None,
    ):
        """Transcript (a WindowResult) of one utterance (16 kHz float32), or None; `work`: its kind (Work: what it
        waits behind and what it stops). Live kinds with the same key coalesce: only the newest pending one runs,
        older ones resolve to None. A final drops its key's pending live transcript (made useless) and stops any
        running one but an OPENING one (a final waits for no live transcript but a short one); both resolve to None.
        `draft`: the tokens of an earlier transcript of (the start of) the same speech; decoding checks them in one
        pass instead of producing them one step at a time — same transcript, fewer steps. `options`: language and
        prompt of the session. `turn` (finals): a final of the same key and turn still queued is replaced (resolves
        to None): one per turn waits. `fresh` (live kinds): called on the worker as the job begins -> the newest
        audio of its turn, or None to keep `audio`."""
        loop = asyncio.get_running_loop()
        job = TranscriptJob(
            audio,
            options,
            loop.create_future(),
            loop,
            time.perf_counter(),
            work,
            key,
            None if work.live else turn,
            draft,
            fresh=fresh if work.live else None,
        )
        with self.pending.cv:
            old = self.pending.transcripts.submit(job)
            self.pending.wake()
        for j in old:
            j.resolve(None)
        self.metrics.finals_superseded += sum(j.turn is not None for j in old)
        return await job.future

    def running_keys(self) -> list:
        """Keys of the live transcripts being computed now."""
        with self.pending.cv:
            return [j.key for j in self.pending.transcripts.running]

    def forget(self, key) -> None:
        """A session closed: its queued transcripts are dropped (resolving to None) and its running live
        transcript stops."""
        with self.pending.cv:
            dropped = self.pending.transcripts.forget(key)
        for job in dropped:
            job.resolve(None)

    def promote(self, key) -> bool:
        """The live transcript of `key` is now needed as a final one (see TranscriptQueue.promote)."""
        with self.pending.cv:
            promoted = self.pending.transcripts.promote(key)
            self.pending.wake()
        return promoted

    def live_interval(self, base: float) -> float:
        """The wait before a session's next live transcript: `base`, stretched (up to 4x) while transcripts
        queue, so that live text degrades before final transcripts wait."""
        with self.pending.cv:
            stretch = min(MAX_LIVE_STRETCH, max(1.0, len(self.pending.transcripts) / 2))
        self.metrics.live_stretch = stretch
        return base * stretch

    # -- language model and streams ---------------------------------------------------------------
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
        with self.pending.cv:
            self.batcher.submit(req)
            self.pending.wake()
        return req, q

    def prompt_room(self, max_tokens: int) -> int:
        """The longest prompt that leaves room in the cache for an answer of `max_tokens` (at least half
        of the cache is the prompt's: a longer answer stops when the context is full)."""
        return max(self.batcher.max_seq // 2, self.batcher.max_seq - max_tokens)

    def cancel_generation(self, req):
        with self.pending.cv:
            req.cancelled = True
            self.pending.wake()

    def stream(self, gen, family: str = "tts") -> tuple[StreamTask, asyncio.Queue]:
        """Run generator `gen` on the worker of `family` (asr: it runs the recognizer; tts: the voice), one item per
        step; returns (task, queue) where the queue receives each item, then StopAsyncIteration (or the exception
        that ended it). Set task.cancelled to stop it."""
        if family not in TASK_FAMILIES:
            raise ValueError(f"stream tasks run on the worker of {' or '.join(TASK_FAMILIES)}, got {family!r}")
        loop = asyncio.get_running_loop()
        q: asyncio.Queue = asyncio.Queue()
        task = StreamTask(loop, q, gen)
        with self.pending.cv:
            self.pending.tasks[family].append(task)
            self.pending.wake()
        return task, q

    # -- load -------------------------------------------------------------------------------------
    def queue_depth(self) -> int:
        with self.pending.cv:
            return self.pending.depth()

    def figures(self) -> Metrics:
        """The metrics, with each family's busy share (of the last LOAD_WINDOW_S) and queue depth read now."""
        m = self.metrics
        with self.pending.cv:
            m.family_depth.update(self.pending.depths())
        m.family_busy = {f: round(w.load.busy(), 3) for f, w in self.workers.items()}
        return m

    def has_spare_time(self, lm: bool = True, live: bool = True) -> bool:
        """Nothing waits but what is running: no final transcript, streaming task, live transcript (unless not
        `live`: they come after language model work anyway) or language model work (unless not `lm`: a sequence
        more joins its batch) queued. Speculative work starts only then."""
        with self.pending.cv:
            return not self.pending.queued(lm, live)

    def stalled_for(self, family: str | None = None) -> float:
        """Seconds the worker of `family` (None: the longest of them) has spent in its current step (0 while it
        waits for work). A step is one transcription batch, one language model step or one round of synthesis
        steps: far under a second normally, one 30-s window of a long turn at most."""
        now = time.monotonic()
        started = [w.step_started for f, w in self.workers.items() if family in (None, f)]
        return max([0.0] + [now - s for s in started if s is not None])

    async def wait(self, awaitable, stall_timeout: float, family: str | None = None):
        """Await engine work of `family` (asr, lm, tts; None: any); EngineStalled if its worker (None: any worker)
        spends more than `stall_timeout` in one step meanwhile (a hang: the work may never come). Waiting behind
        other work that moves is not a stall, nor another family's hang."""
        if family is not None and family not in FAMILIES:
            raise ValueError(f"family must be one of {', '.join(FAMILIES)}, got {family!r}")
        task = asyncio.ensure_future(awaitable)
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=min(1.0, stall_timeout / 4))
                if done:
                    return task.result()
                if self.stalled_for(family) > stall_timeout:
                    raise EngineStalled(f"the engine has been stuck in one step for more than {stall_timeout:g} s")
        finally:
            if not task.done():
                task.cancel()
