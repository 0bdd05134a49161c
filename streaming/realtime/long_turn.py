"""Long turns: a live round of a turn with over commit_after of audio not committed commits what two rounds agree
on (local agreement), so its transcripts start where the committed text ends. (A turn that ends with over 30 s
not committed is transcribed long-form by the engine, one window per engine step: streaming/engine/transcripts.py.)"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import TYPE_CHECKING

import numpy as np

from speechrt.pipelines.asr import MAX_UTTERANCE_SAMPLES
from speechrt.pipelines.asr import SAMPLE_RATE as RATE

from ..engine import Work
from .agreement import agreed
from .extras import aligned
from .turn import Turn

if TYPE_CHECKING:
    from .turn_transcripts import TurnTranscripts


async def commit_stable(live: TurnTranscripts, turn: Turn, first: int, audio: np.ndarray) -> int:
    """A live round of a long turn with local agreement (whisper_streaming's LocalAgreement-2 and buffer
    trimming): its audio not yet committed (`audio`, from sample `first`; the first 30 s of it) is transcribed
    with timestamps, the text goes out as the round's hypothesis, and the leading segments that the previous
    round also had and that end the policy's commit_margin or more before the end are committed: their text is
    the turn's for good, and its transcripts from then on start where they end, so a turn's cost grows with its
    length, not with its square. -> the samples committed (0: none)."""
    s = live.session
    opts = dataclasses.replace(s.live_options, without_timestamps=False)
    r = await live.engine.transcribe(audio[:MAX_UTTERANCE_SAMPLES], Work.LIVE, key=s.id, options=opts)
    if r is None:
        return 0
    await live.hypothesis(turn, r.text)
    segs = live.engine.asr.closed_segments(r, tokens=True)
    before, turn.closed = turn.closed, (first, segs)
    held = min(len(audio), MAX_UTTERANCE_SAMPLES)
    segs = agreed(before[1] if before and before[0] == first else [], segs, held, s.policy.commit_margin)
    if not segs:
        return 0
    end = round(segs[-1][1] * RATE)
    if s.cfg.logprobs or s.cfg.word_timestamps:  # the committed part's, aligned now: its audio is dropped below
        tokens = [t for *_, part in segs for t in part]
        turn.extras.append((turn.committed_s, asyncio.ensure_future(aligned(s, live.engine, audio[:end], tokens))))
    turn.commit(" ".join(text.strip() for _, _, text, _ in segs), first + end, end / RATE)
    live.turns.buf.drop_until(turn.base)
    live.engine.metrics.turn_commits += 1
    return end
