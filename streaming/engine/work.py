"""The work that waits for the engine's workers, under one lock: transcript jobs (transcripts.TranscriptQueue),
streaming tasks per family (StreamTask: TTS chunks, REST steps) and the language model's continuous batch."""

from __future__ import annotations

import asyncio
import collections
import logging
import threading

from .transcripts import TranscriptQueue

log = logging.getLogger(__name__)


# the model families, each served by its own worker thread (worker.py); streaming tasks run on asr's or tts's
FAMILIES = ("asr", "lm", "tts")
TASK_FAMILIES = ("asr", "tts")


class StreamTask:
    """A unit of streaming work: `step()` does one bounded piece of compute on its family's worker thread and
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


class Pending:
    """What waits for the workers: `transcripts`, streaming `tasks` per family (asr: REST transcripts and word
    timings; tts: synthesis) and the language model's `batcher` (None: transcription only). `cv` guards them all
    and wakes the workers (notify_all: each waits for its own family's work); `stopping` ends them."""

    def __init__(self, batcher=None):
        self.cv = threading.Condition()
        self.transcripts = TranscriptQueue()
        self.tasks: dict[str, collections.deque[StreamTask]] = {f: collections.deque() for f in TASK_FAMILIES}
        self.batcher = batcher
        self.stopping = False

    def wake(self) -> None:
        """Wake the workers (call with the lock held): each looks for its family's work."""
        self.cv.notify_all()

    def lm_work(self) -> bool:
        return self.batcher is not None and self.batcher.has_work()

    def queued(self, lm: bool = True, live: bool = True) -> bool:
        """Work waits for the worker (language model work only if `lm`, live transcripts only if `live`; call
        with the lock held)."""
        t = self.transcripts
        tasks = any(self.tasks.values())
        return bool(t.finals or t.long or (live and t.partials) or tasks or (lm and self.lm_work()))

    def depths(self) -> dict[str, int]:
        """Work items waiting per family (call with the lock held)."""
        return {
            "asr": len(self.transcripts) + len(self.tasks["asr"]),
            "lm": self.batcher.size() if self.batcher else 0,
            "tts": len(self.tasks["tts"]),
        }

    def depth(self) -> int:
        """Work items waiting, all families (call with the lock held)."""
        return sum(self.depths().values())
