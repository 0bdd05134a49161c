"""A turn's transcripts: live rounds while it is spoken (their words agreed on go out as deltas), early ones when
the input goes quiet, speculative ones when a pause begins (semantic_vad's decision, a reply begun ahead), and the
final one when it ends (with its extras), all through the shared Engine, at the times the turn policy sets."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import TYPE_CHECKING

import numpy as np

from speechrt.pipelines.asr import SAMPLE_RATE as RATE

from ..engine import EngineStalled, Work
from . import events as E
from .conversation import Item
from .extras import final_extras
from .items import failed
from .long_turn import commit_stable
from .turn import Turn
from .vad import quiet_began_pause, transcript_finished

if TYPE_CHECKING:
    from .turns import InputTurns


class TurnTranscripts:
    """The transcripts of the turns of one InputTurns (`turns`: its buffer, its turn detection and the turn in
    progress), made on the session's engine under its turn policy."""

    def __init__(self, turns: InputTurns):
        self.turns, self.session = turns, turns.session
        self.engine, self.policy = turns.engine, turns.policy

    async def _transcribe(
        self,
        turn: Turn,
        audio: np.ndarray,
        work: Work = Work.FINAL,
        live: bool = False,
        fresh=None,
    ):
        """Transcribe (part of) `turn`, drafting with its latest transcript: the speech only grew since, so most of
        its tokens are checked in one decoder pass. `live`: a live transcript's options (the encoder over the audio
        only), else a final's (see asr_options.asr_options); an OPENING one: its first opening_tokens tokens only."""
        # keyed by session: a final transcript drops the pending live one of this session (made useless)
        opts = self.session.live_options if live else self.session.asr_options
        opts = dataclasses.replace(opts, sample_len=self.policy.opening_tokens) if work is Work.OPENING else opts
        opts = turn.prompted(opts)  # a long turn's rest goes on from the words it committed
        r = await self.engine.transcribe(
            audio, work, key=self.session.id, options=opts, draft=turn.draft or None, turn=turn.item_id, fresh=fresh
        )
        if r is not None and r.tokens:
            turn.draft = r.tokens
        return r

    async def live(self, turn: Turn):
        """Live transcript of the turn being spoken: re-transcribe the growing audio every `partial_interval` s
        (longer while transcripts queue) and send the words hypotheses agree on (Turn.agree). Until its first words
        go out, rounds come opening_round intervals apart, unstretched, before other live transcripts while short
        (cheap)."""
        inp, interval, last = self.turns, self.policy.partial_interval, [0]  # [the audio of the last round]
        while True:
            opening = not turn.sent
            await asyncio.sleep(
                interval * self.policy.opening_round if opening else self.engine.live_interval(interval)
            )
            audio = inp.buf.slice(first := inp.first_sample(turn), inp.buf.end)
            # paused: the final (begun at the pause) has the engine; quiet since the early one: it is this round's
            paused = inp.detector is not None and inp.detector.pause_ms is not None
            if len(audio) - last[0] < RATE // 4 or paused or (turn.early and turn.early[0] == inp.quiet.quiet_since):
                continue
            if len(audio) > turn.commit_after:  # a long turn: this round also commits what is stable
                last[0] = len(audio) - await commit_stable(self, turn, first, audio)
                continue
            last[0], opening = len(audio), opening and len(audio) <= self.policy.opening_max  # (last: see newest_audio)
            r = await self._transcribe(
                turn,
                audio,
                Work.OPENING if opening else Work.LIVE,
                live=True,
                fresh=lambda: newest_audio(self.turns, turn, first, last),
            )
            if r is not None:
                if not opening:  # the first commit round's words to agree with (long_turn.stable_words)
                    turn.closed = (first, [], r.text.split())
                await self.hypothesis(turn, r.text)

    async def hypothesis(self, turn: Turn, text: str):
        if self.turns.turn is turn and (delta := turn.agree(text)):
            await self.session.send(E.transcription_delta(turn.item_id, delta))
            self.session.ahead.prime(" ".join(turn.sent))

    def maybe_start_early(self, turn: Turn):
        """The input went quiet during a turn, but Silero has not called a pause yet (it lags the last
        sound by 60-130 ms): if the engine has nothing else queued, transcribe the turn up to here
        already, at live-transcript priority. If Silero's pause follows, this is its transcript."""
        inp = self.turns
        q = inp.quiet.quiet_since
        if (
            q is None
            or not inp.detector.speaking
            or q <= turn.start
            or inp.buf.end - q < self.policy.early_quiet
            or (turn.early is not None and turn.early[0] == q)
            or not self.engine.has_spare_time()
        ):
            return
        audio = inp.buf.slice(inp.first_sample(turn), min(inp.buf.end, q + self.policy.tail))
        turn.early = (q, self.session.spawn(self._early(turn, audio)))

    async def _early(self, turn: Turn, audio: np.ndarray):
        # it replaces the session's live transcript, queued or running: its audio is the newest
        r = await self._transcribe(turn, audio, Work.EARLY)
        if r is not None:
            await self.hypothesis(turn, r.text)
        return r

    def early_for(self, turn: Turn, pause: int) -> asyncio.Task | None:
        """The early transcript that covers the pause Silero saw begin at `pause` ms: begun when the
        input went quiet shortly before, and quiet ever since (so the audio after it holds no speech).
        It is promoted to final priority if it is still queued or running."""
        if turn.early is None:
            return None
        q, task = turn.early
        if self.turns.quiet.quiet_since != q or not quiet_began_pause(
            q * 1000 // RATE, pause, self.policy.quiet_lead_ms
        ):
            return None
        if not task.done():
            self.engine.promote(self.session.id)
        turn.early = None  # used once

        async def result():
            r = await task
            if r is not None:
                self.engine.metrics.early_finals += 1
            return r

        return self.session.spawn(result())

    async def speculate(self, turn: Turn, pause: int, audio: np.ndarray, early: asyncio.Task | None):
        """The transcript of the turn up to the pause that began at `pause` (`early`'s, if it has one; None if
        one up to a later pause replaced it while queued). With semantic_vad it decides how long this pause must
        last to end the turn (ending it now if it has); if the turn is still paused then, a reply may begin."""
        r = await early if early is not None else None
        if r is None:  # no early transcript, or a final transcript of another session stopped it
            r = await self._transcribe(turn, audio)
        if (
            r is not None
            and self.turns.detector is not None
            and self.turns.detector.pause_ms == pause
            and self.turns.turn is turn
        ):
            if (td := self.session.cfg.turn_detection) is not None and td.semantic:
                for _kind, ms in self.turns.detector.finish_pause(transcript_finished(r.text)):
                    await self.turns.speech_stopped(ms)
            if self.turns.turn is turn:  # still paused: the reply to the turn so far can begin before the pause ends it
                self.session.ahead.speculate(turn.item_id, turn.full(r.text))
        return r

    async def final(self, turn: Turn, item: Item, audio: np.ndarray, auto: bool, early: asyncio.Task | None):
        if turn.base is not None:  # a long turn that committed: its final transcribes the rest
            self.engine.metrics.long_final_rest_s = len(audio) / RATE
        try:
            r = await self.engine.wait(
                self._final_result(turn, audio, early), self.session.server.options.stall_timeout, "asr"
            )
        except EngineStalled as e:
            self.session.server.counters.stalls += 1
            return await failed(self.session, item, f"{e}; the turn was not transcribed", "engine_stalled")
        except Exception as e:  # noqa: BLE001 - the engine's step failed: this turn is told, the session goes on
            return await failed(self.session, item, f"transcription failed: {type(e).__name__}: {e}", "server_error")
        text = turn.full(r.text)
        delta = turn.final_delta(text)
        if delta:
            await self.session.send(E.transcription_delta(item.id, delta))
        item.parts[0].text = text
        logprobs, words = await final_extras(self.session, self.engine, r, audio, turn)
        await self.session.send(
            E.transcription_completed(item.id, text, len(audio) / RATE + turn.committed_s, logprobs, words)
        )
        await self.session.send(E.item_done(item.to_api()))
        if auto:
            await self.session.user_turn_done(text)

    async def _final_result(self, turn: Turn, audio: np.ndarray, early: asyncio.Task | None):
        r = None
        if early is not None:  # a drain (graceful shutdown) cancels early transcripts: then this one is made anew
            await asyncio.wait([early])
            r = None if early.cancelled() else early.result()
        if r is None:  # no early transcript, or a final transcript of another session stopped it
            r = await self._transcribe(turn, audio)
        return r


def newest_audio(inp: InputTurns, turn: Turn, first: int, used: list[int]) -> np.ndarray | None:
    """On the engine's worker, as a live round of `turn` begins: its audio from sample `first` to now (the length
    into used[0]), or None (the round keeps the audio it was asked with) once the turn has ended, paused or grown
    long (the next round commits)."""
    if inp.turn is not turn or (inp.detector is not None and inp.detector.pause_ms is not None):
        return None
    audio = inp.buf.since(first)
    if audio is None or len(audio) > turn.commit_after:
        return None
    used[0] = len(audio)
    return audio
