"""The user's side of a Realtime session: input audio in (decoded into the input audio buffer), voice activity
and turn detection on it, and turns out — each turn's transcripts started (turn_transcripts.py) and the finished
turn added to the conversation as a user item."""

from __future__ import annotations

import asyncio

import numpy as np

from speechrt.pipelines.asr import SAMPLE_RATE as RATE

from . import events as E
from .audio_buffer import AudioBuffer
from .audio_codec import InputDecoder
from .conversation import Item, Part
from .items import in_background
from .protocol import ProtocolError, new_id
from .turn import Turn
from .turn_transcripts import TurnTranscripts
from .vad import FRAME, QuietTracker, TurnDetector


class InputTurns:
    """Input audio in, turns out: `append` runs turn detection (server_vad / semantic_vad on Silero, timed from where
    the input went quiet) and starts each turn's transcripts; `commit` / `clear` are the client's. A finished turn
    becomes a user item of the conversation with its final transcript."""

    def __init__(self, session):
        self.session = session
        self.engine = session.server.engine
        self.policy = session.policy
        self.vad = session.server.vad.stream()
        self.quiet = QuietTracker(drop_db=self.policy.quiet_drop_db)
        self.buf = AudioBuffer()
        self.turn: Turn | None = None
        self.input = InputDecoder(session.cfg.input_format)
        self.detector = self._detector(session.cfg.turn_detection)
        self.transcripts = TurnTranscripts(self)

    def _detector(self, td) -> TurnDetector | None:
        return TurnDetector(td, self.policy.quiet_lead_ms) if td else None

    def configure(self, old, new):
        """The session's config changes from `old` to `new` (input format, turn detection)."""
        if new.input_format != old.input_format:
            if self.buf.size:
                raise ProtocolError(
                    "the input audio format cannot change while audio is buffered; commit or clear the buffer first",
                    "invalid_value",
                    "session.audio.input.format",
                )
            self.input = InputDecoder(new.input_format)
        if new.turn_detection != old.turn_detection:
            self.detector = self._detector(new.turn_detection)
            if self.detector:  # continue the frame clock of the stream
                self.detector.frames = self.buf.end // FRAME

    # -- input audio ------------------------------------------------------------------------------
    async def append(self, raw: bytes, max_seconds: float):
        x = self.input.decode(raw)
        if self.buf.size + len(x) > int(max_seconds * RATE):
            raise ProtocolError(
                f"input audio buffer full: at most {max_seconds:.0f} s of uncommitted audio per "
                "session; commit or clear it (the chunk was not added)",
                "input_audio_buffer_full",
                "audio",
            )
        self.buf.append(x)
        if self.detector is None:
            return
        if self.turn is None:  # no turn open: keep only what the next one may need (its prefix padding)
            self.buf.drop_until(self.buf.end - len(x) - self.policy.idle_keep - self._padding())
        self.quiet.feed(x, self.buf.end - len(x))
        probs = await self.session.server.vad.process(self.vad, x)
        q = self.quiet.quiet_since
        for kind, ms in self.detector.feed(probs, None if q is None else q * 1000 // RATE):
            await (self._speech_started(ms) if kind == "start" else self.speech_stopped(ms))
        turn, pause = self.turn, self.detector.pause_ms
        if turn is None or not turn.speculates(self.buf.end - self.first_sample(turn)):
            return
        if pause is None:
            turn.paused = None
            self.session.ahead.drop(turn.item_id)  # speech resumed: a reply begun in a pause answered too little
            self.transcripts.maybe_start_early(turn)
        elif turn.paused is None or turn.paused[0] != pause:
            # A pause began: transcribe the turn up to here now, so that if the pause becomes the end
            # of the turn (silence_duration_ms later) its final transcript is already (nearly) done.
            # The audio committed then differs from this only by trailing silence.
            audio = self.buf.slice(*self.span(turn, pause))
            speculate = self.transcripts.speculate(turn, pause, audio, self.transcripts.early_for(turn, pause))
            turn.paused = (pause, self.session.spawn(speculate))

    async def commit(self):
        if self.buf.size < RATE // 10:
            raise ProtocolError(
                f"buffer too small: expected at least 100 ms of audio, the buffer has "
                f"{self.buf.size * 1000 // RATE} ms",
                "input_audio_buffer_commit_empty",
            )
        turn = self.end_turn() or Turn(new_id("item"), self.buf.start, policy=self.policy)
        audio = self.buf.slice(self.buf.start, self.buf.end)
        self.buf.clear()
        await self._commit(turn, audio, auto=False)

    async def clear(self):
        self.end_turn()
        self.buf.clear()
        await self.session.send(E.buffer_cleared())

    def end_turn(self) -> Turn | None:
        """Forget the turn in progress (the client committed or cleared the buffer, or the session is
        closing) and stop its live transcript."""
        turn, self.turn = self.turn, None
        if turn is not None:
            turn.stop_live()
            self.session.ahead.drop(turn.item_id)
        if self.detector:
            self.detector.reset()
        return turn

    # -- turns ----------------------------------------------------------------------------------------
    async def _speech_started(self, ms: int):
        turn = self.turn = Turn(new_id("item"), ms * RATE // 1000, policy=self.policy)
        await self.session.send(E.speech_started(ms, turn.item_id))
        self.session.barge_in()
        if self.policy.partial_interval > 0:
            turn.sent, turn.live = [], self.session.spawn(self.transcripts.live(turn))

    async def speech_stopped(self, ms: int):
        # the turn's state is settled before the first await: a turn may end from the append handler
        # or from a semantic_vad decision (TurnTranscripts.speculate), which interleave at awaits
        turn, self.turn = self.turn, None
        turn.stop_live()
        if turn.paused is not None and turn.paused[0] == ms:
            early = turn.paused[1]  # the transcript started when this pause began
        else:  # the turn ended on the pause's first frames (timed from where the input went quiet)
            early = self.transcripts.early_for(turn, ms)
        start, end = self.span(turn, ms)
        audio = self.buf.slice(start, end)
        self.buf.drop_until(end)
        await self.session.send(E.speech_stopped(ms, turn.item_id))
        await self._commit(turn, audio, auto=True, early=early)

    def span(self, turn: Turn, end_ms: int) -> tuple[int, int]:
        """Samples of `turn` ending at `end_ms`: from its speech start less the prefix padding, to 100 ms
        into the pause (the policy's tail)."""
        return self.first_sample(turn), min(self.buf.end, end_ms * RATE // 1000 + self.policy.tail)

    def first_sample(self, turn: Turn) -> int:
        """The turn's speech start less the prefix padding (or where its audio not committed begins), within
        the buffer."""
        return max(self.buf.start, turn.start - self._padding() if turn.base is None else turn.base)

    def _padding(self) -> int:
        """Samples kept before a turn's speech start (turn detection's prefix_padding_ms)."""
        td = self.session.cfg.turn_detection  # (None if the client turned turn detection off mid-turn)
        return td.prefix_padding_ms * RATE // 1000 if td else 0

    async def _commit(self, turn: Turn, audio: np.ndarray, auto: bool, early: asyncio.Task | None = None):
        item = Item("user", [Part("input_audio")], id=turn.item_id, transcribed=asyncio.Event())
        item.audio_ms = len(audio) * 1000 // RATE  # (its audio tokens in a response's usage: events.usage)
        prev = self.session.conversation.append(item)
        await self.session.send(E.buffer_committed(item.id, prev))
        await self.session.send(E.item_added(item.to_api(), prev))
        in_background(self.session, item, self.transcripts.final(turn, item, audio, auto, early))
