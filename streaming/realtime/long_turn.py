"""Long turns: a live round of a turn with over commit_after (then recommit_after) of audio not committed
commits what two rounds agree on (local agreement), so its transcripts start where the committed text ends. (A
turn that ends with over 30 s not committed is transcribed long-form by the engine, one window per engine step:
streaming/engine/transcripts.py.)"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import TYPE_CHECKING

import numpy as np

from speechrt.pipelines.asr import MAX_UTTERANCE_SAMPLES
from speechrt.pipelines.asr import SAMPLE_RATE as RATE

from ..engine import Work
from .agreement import agreed, agreed_words, shared_words
from .extras import aligned
from .turn import Turn

if TYPE_CHECKING:
    from .turn_transcripts import TurnTranscripts

MIN_WORDS = 4  # a commit by words takes at least this many (an alignment pass is not worth fewer)
HOP = RATE // 100  # the commit point between two words: the quietest 10-ms hop around their boundary
CLAUSE_ENDS = (".", ",", "?", "!", ";", ":")
SEAM_SPAN = 4 * RATE  # the cut: at the quietest boundary between agreed words that end this near the last one


async def commit_stable(live: TurnTranscripts, turn: Turn, first: int, audio: np.ndarray) -> int:
    """A live round of a long turn with local agreement (whisper_streaming's LocalAgreement-2 and buffer
    trimming): its audio not yet committed (`audio`, from sample `first`; the first 30 s of it) is transcribed
    with timestamps, the text goes out as the round's hypothesis, and the leading segments that the previous
    round also had and that end the policy's commit_margin or more before the end are committed: their text is
    the turn's for good, and its transcripts from then on start where they end, so a turn's cost grows with its
    length, not with its square. Where no segment agrees (fast speech without pauses: Whisper may make one
    segment of all of it, its end moving each round, and the final would transcribe all of it, long-form past
    30 s), the leading words both rounds have are committed, cut at the quietest seam near a boundary between
    them that the round's word times (one alignment pass) give: stable_words. -> the samples committed (0: none).
    The round's text is the draft of the turn's next transcript (the final one checks it in one pass)."""
    s = live.session
    opts = turn.prompted(dataclasses.replace(s.live_options, without_timestamps=False))
    held = min(len(audio), MAX_UTTERANCE_SAMPLES)
    r = await live.engine.transcribe(audio[:held], Work.LIVE, key=s.id, options=opts)
    if r is None:
        return 0
    await live.hypothesis(turn, r.text)
    segs = live.engine.asr.closed_segments(r, tokens=True)
    before, turn.closed = turn.closed, (first, segs, r.text.split())
    if not before or before[0] != first:
        before = (first, [], [])
    if segs := agreed(before[1], segs, held, s.policy.commit_margin):
        end = round(segs[-1][1] * RATE)
        text = " ".join(text.strip() for _, _, text, _ in segs)
        tokens = [t for *_, part in segs for t in part]
    elif (got := await stable_words(live, r, before[2], audio[:held])) is not None:
        end, text = got
        tokens = live.engine.asr.tokenizer.encode(" " + text)
    else:
        turn.draft = [t for t in r.tokens if t < live.engine.asr.tokenizer.eot]  # the final checks them in one pass
        return 0
    if s.cfg.logprobs or s.cfg.word_timestamps:  # the committed part's, aligned now: its audio is dropped below
        turn.extras.append((turn.committed_s, asyncio.ensure_future(aligned(s, live.engine, audio[:end], tokens))))
    turn.commit(text, first + end, end / RATE)
    if rest := r.text.split()[len(text.split()) :]:  # the rest's draft: its final checks it in one pass
        turn.draft = live.engine.asr.tokenizer.encode(" " + " ".join(rest))
    live.turns.buf.drop_until(turn.base)
    live.engine.metrics.turn_commits += 1
    return end


async def stable_words(live: TurnTranscripts, r, before: list[str], audio: np.ndarray) -> tuple[int, str] | None:
    """Local agreement by words: the round's transcript `r` of `audio` and the previous round's words `before`
    -> (the sample to cut at, the text before it: words both begin with, ending commit_margin or more before the
    end of `audio`, up to the quietest seam among their last ones), or None (fewer than MIN_WORDS; or word times
    unavailable on this backend). The round's tokens are aligned to `audio` (one encoder and one decoder pass on
    the engine) only where the two rounds' texts begin with MIN_WORDS words alike."""
    margin = live.policy.commit_margin
    if shared_words(before, r.text.split()) < MIN_WORDS or not live.engine.asr.runner.word_timing:
        return None
    got = await aligned(live.session, live.engine, audio, r.tokens, live.policy.live_margin)
    if not got or not got[0]:
        return None
    timed = got[0]
    n = agreed_words(before, timed, len(audio), margin)
    if n < MIN_WORDS:
        return None
    k, end = seam(audio, timed, n)
    return end, "".join(w.word for w in timed[:k]).strip()


def seam(audio: np.ndarray, words: list, n: int) -> tuple[int, int]:
    """Where to cut after some of the first `n` of `words` (aligned to `audio`, times in s) -> (how many words
    before the cut, its sample): of the boundaries between two words in the last SEAM_SPAN of them (at least
    MIN_WORDS in), the quietest of those after a clause's end (a word ending in . , ? ! ; :, where speakers pause
    most), else the quietest of all; the cut in its quietest 10-ms hop, from 50 ms before the first word's end to 50 ms
    after the next one's start. Word times are ~20-ms steps of attention, not exact, and fast speech leaves no
    silence between words: a cut at the quietest seam near a boundary splits no word, one at a boundary's time
    may leave a word's first sound to the next transcript ("its beam" -> "its" + "been")."""
    best = None
    for k in range(n, MIN_WORDS - 1, -1):
        a = round(words[k - 1].end * RATE)
        if k < n and a < round(words[n - 1].end * RATE) - SEAM_SPAN:
            break
        b = round(words[k].start * RATE) if k < len(words) else a
        hi = min(len(audio), max(a, b) + RATE // 20)
        lo = max(0, min(min(a, b) - RATE // 20, hi - HOP))
        hops = max(1, (hi - lo) // HOP)
        rms = np.sqrt((audio[lo : lo + hops * HOP].reshape(hops, -1) ** 2).mean(1))
        at = int(np.argmin(rms))
        rank = (not words[k - 1].word.rstrip().endswith(CLAUSE_ENDS), rms[at])  # a clause's end first
        if best is None or rank < best[0]:
            best = (rank, k, min(len(audio), lo + at * HOP + HOP // 2))
    return best[1], best[2]
