"""The user's side of a Realtime session: the input audio buffer, voice activity and turn detection, and
each turn's transcripts — live while the person speaks, early when the input goes quiet, final when the
turn ends. Model work goes through the shared Engine; events go out through the session."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from dataclasses import dataclass, field

import numpy as np

from speechrt.pipelines.asr import MAX_UTTERANCE_SAMPLES, segment_windows
from speechrt.pipelines.asr import SAMPLE_RATE as RATE

from . import protocol as P
from .audio_codec import AudioFormatError, InputDecoder, b64decode
from .conversation import Item, Part
from .engine import EngineStalled
from .protocol import ProtocolError, new_id
from .vad import FRAME, QuietTracker, TurnDetector, quiet_began_pause, transcript_finished

# early transcripts: begun once the input has been quiet this long (before Silero confirms the pause),
# and used as the final one if Silero's pause begins shortly after (vad.quiet_began_pause)
EARLY_QUIET = RATE * 10 // 1000
TAIL = RATE // 10  # audio kept after the end of speech: the tail helps Whisper finish the last word
IDLE_KEEP = RATE  # audio kept, besides the prefix padding, while no turn is open (Silero may start a turn late)
# local agreement on long turns: past COMMIT_AFTER of audio not yet committed, live rounds transcribe it with
# timestamps and commit the segments two rounds agree on that end COMMIT_MARGIN or more before its end
COMMIT_AFTER, COMMIT_MARGIN = 12 * RATE, 3 * RATE
# live rounds before a turn's first words: OPENING_ROUND partial intervals apart, and run before other live
# transcripts while their audio is at most OPENING_MAX (a short encoder pass and a word or two: tens of ms)
OPENING_ROUND, OPENING_MAX = 0.3, 2 * RATE
OPENING_WORDS = 1  # words a turn's first hypothesis may send before a second one agrees (Turn.agree)
# tokens an opening round decodes: it sends one word, so the rest would be decoded only to be checked again by
# the next round (which takes these as its draft). Greedy decoding's first words hardly depend on where it stops
# (only near-ties at the audio's end: the decoder's cache is sized by the cap, which moves the last bits of its
# sums). On `bench server`'s 12 utterances x 3 voice seeds cut at 0.6-1.5 s of speech: the same first word in 144
# rounds of 144, at 0.65x the time (35 -> 23 ms a round; AVX2 paths 41 -> 28 ms; Zen 4; bench.opening_study)
OPENING_TOKENS = 4


class AudioBuffer:
    """Uncommitted input audio at 16 kHz, addressed by absolute sample index since the session began. The event
    loop writes it; `since` may be called from the engine's worker too (a live transcript takes the newest audio
    when it begins), so changes and reads hold a lock."""

    def __init__(self):
        self.chunks: list[np.ndarray] = []
        self.start = 0  # absolute index of the first buffered sample
        self.size = 0
        self._lock = threading.Lock()

    @property
    def end(self) -> int:
        return self.start + self.size

    def append(self, x: np.ndarray):
        if len(x):
            with self._lock:
                self.chunks.append(x)
                self.size += len(x)

    def slice(self, a: int, b: int) -> np.ndarray:
        with self._lock:
            return self._slice(a, b)

    def _slice(self, a: int, b: int) -> np.ndarray:
        a, b = max(a, self.start), min(b, self.end)
        if b <= a:
            return np.zeros(0, np.float32)
        if len(self.chunks) > 1:
            self.chunks = [np.concatenate(self.chunks)]
        return self.chunks[0][a - self.start : b - self.start].copy()

    def since(self, a: int) -> np.ndarray | None:
        """Samples from `a` to the end, or None if the buffer no longer holds `a` (any thread)."""
        with self._lock:
            return None if a < self.start else self._slice(a, self.start + self.size)

    def drop_until(self, idx: int):
        with self._lock:
            idx = min(max(idx, self.start), self.end)
            if idx == self.start:
                return
            rest = self._slice(idx, self.end)
            self.chunks = [rest] if len(rest) else []
            self.start, self.size = idx, len(rest)

    def clear(self):
        self.drop_until(self.end)


PUNCTUATION = ".,!?;:\"'()[]-…"  # stripped from words' ends when live hypotheses are compared


def common_prefix(a: list[str], b: list[str]) -> int:
    """How many leading words `a` and `b` share, ignoring case and the punctuation around them (a live hypothesis
    of "the pack," and a later "The package" share "the")."""
    n = 0
    for x, y in zip(a, b):
        if x.lower().strip(PUNCTUATION) != y.lower().strip(PUNCTUATION):
            break
        n += 1
    return n


@dataclass(eq=False)
class Turn:
    """One user turn, from the speech start (or a commit without one) to its final transcript, with the
    transcripts in flight for it:
    - `live`: the loop that re-transcribes the growing turn; words that two consecutive hypotheses agree
      on go out as deltas (`sent`: those sent, None when the session sends none; `heard`: the latest);
    - `early`: (quiet since, task), a transcript begun when the input went quiet, before Silero calls
      the pause;
    - `paused`: (pause start ms, task), the transcript up to the pause in progress (the early one if it
      covers that pause): the final transcript if the pause ends the turn.
    `draft`: the tokens of its latest transcript, which the next one checks in one decoder pass.
    A long turn commits what is stable as it goes (commit_stable): `committed` is the text of its audio
    before sample `base`, which its transcripts from then on leave out."""

    item_id: str
    start: int  # absolute sample index where its speech began
    draft: list[int] = field(default_factory=list)
    live: asyncio.Task | None = None
    sent: list[str] | None = None
    heard: list[str] = field(default_factory=list)
    early: tuple[int, asyncio.Task] | None = None
    paused: tuple[int, asyncio.Task] | None = None
    base: int | None = None  # where its audio not yet committed begins (None: at its start)
    committed: str = ""
    committed_s: float = 0.0  # seconds of the committed audio
    closed: tuple = ()  # the last commit round's closed segments: (base, [(start s, end s, text, tokens), ...])
    extras: list = field(default_factory=list)  # (offset s, task) of the committed parts' logprobs and word times

    def full(self, text: str) -> str:
        """The turn's text: what it committed, then `text` (a transcript of its audio after `base`)."""
        return f"{self.committed} {text}".strip() if self.committed else text

    def commit(self, text: str, base: int, seconds: float):
        self.committed, self.base, self.draft = self.full(text), base, []
        self.committed_s += seconds

    def speculates(self, uncommitted: int) -> bool:
        """Are early and paused transcripts worth starting, with `uncommitted` samples not committed? Not once a
        live round has a commit to make (they would stop it, see commit_stable; and each pause would start a
        final-priority transcript of all of it), nor past 30 s (long-form, once, when the turn ends)."""
        return uncommitted <= (COMMIT_AFTER if self.live is not None else MAX_UTTERANCE_SAMPLES)

    def agree(self, text: str) -> str | None:
        """A new live hypothesis -> the delta to send: the words it agrees on with the previous one, past
        those already sent. Until some are sent, a hypothesis of two words or more sends its first OPENING_WORDS
        without waiting for a second one: a turn's first word comes one round sooner. A word that ends two
        hypotheses alike is not agreed on: both may have heard only its first part ("drive to the air?" from an
        early transcript begun in the silence of the p and from a live round just after; "airport?" in the final
        one), and two opening rounds may both stop at OPENING_TOKENS inside it. (A hypothesis's first word
        is its surest: at 0.6 s of speech, 24 clips' words but the last were wrong in 4, the first word only
        where the final transcript is wrong too, "and" for "Add"; two words went out wrong in 2 of 24 turns at
        8 streams: "the concept", "Please but".)"""
        if self.sent is None:
            return None
        words = self.full(text).split()
        stable = common_prefix(self.heard, words)
        if stable == len(self.heard) == len(words):  # the word both end on: maybe the first part of one, twice
            stable -= 1
        if not self.sent:
            stable = max(stable, min(OPENING_WORDS, len(words) - 1))
        delta = None
        if stable > len(self.sent) and common_prefix(words, self.sent) == len(self.sent):
            delta = (" " if self.sent else "") + " ".join(words[len(self.sent) : stable])
            self.sent = self.sent + words[len(self.sent) : stable]
        self.heard = words
        return delta

    def final_delta(self, text: str) -> str | None:
        """The final transcript -> the delta that completes the live deltas sent (all of it if none; none if
        the final transcript does not begin with them)."""
        if not self.sent:
            return text or None
        words = text.split()
        if common_prefix(words, self.sent) == len(self.sent) and len(words) > len(self.sent):
            return " " + " ".join(words[len(self.sent) :])
        return None

    def stop_live(self):
        if self.live is not None:
            self.live.cancel()


class InputTurns:
    """Input audio in, turns out: `append` runs turn detection (server_vad / semantic_vad on Silero, timed from where
    the input went quiet) and starts each turn's transcripts; `commit` / `clear` are the client's. A finished turn
    becomes a user item of the conversation with its final transcript."""

    def __init__(self, session):
        self.session = session
        self.engine = session.server.engine
        self.vad = session.server.vad.stream()
        self.quiet = QuietTracker()
        self.buf = AudioBuffer()
        self.turn: Turn | None = None
        self.input = InputDecoder(session.cfg.input_format)
        self.detector = TurnDetector(session.cfg.turn_detection) if session.cfg.turn_detection else None

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
            self.detector = TurnDetector(new.turn_detection) if new.turn_detection else None
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
            self.buf.drop_until(self.buf.end - len(x) - IDLE_KEEP - self._padding())
        self.quiet.feed(x, self.buf.end - len(x))
        probs = await self.session.server.vad.process(self.vad, x)
        q = self.quiet.quiet_since
        for kind, ms in self.detector.feed(probs, None if q is None else q * 1000 // RATE):
            await (self._speech_started(ms) if kind == "start" else self._speech_stopped(ms))
        turn, pause = self.turn, self.detector.pause_ms
        if turn is None or not turn.speculates(self.buf.end - self._first_sample(turn)):
            return
        if pause is None:
            turn.paused = None
            self.session.ahead.drop(turn.item_id)  # speech resumed: a reply begun in a pause answered too little
            self._maybe_start_early(turn)
        elif turn.paused is None or turn.paused[0] != pause:
            # A pause began: transcribe the turn up to here now, so that if the pause becomes the end
            # of the turn (silence_duration_ms later) its final transcript is already (nearly) done.
            # The audio committed then differs from this only by trailing silence.
            audio = self.buf.slice(*self._span(turn, pause))
            turn.paused = (pause, self.session.spawn(self._speculate(turn, pause, audio, self._early_for(turn, pause))))

    async def commit(self):
        if self.buf.size < RATE // 10:
            raise ProtocolError(
                f"buffer too small: expected at least 100 ms of audio, the buffer has "
                f"{self.buf.size * 1000 // RATE} ms",
                "input_audio_buffer_commit_empty",
            )
        turn = self.end_turn() or Turn(new_id("item"), self.buf.start)
        audio = self.buf.slice(self.buf.start, self.buf.end)
        self.buf.clear()
        await self._commit(turn, audio, auto=False)

    async def clear(self):
        self.end_turn()
        self.buf.clear()
        await self.session.send(P.buffer_cleared())

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
        turn = self.turn = Turn(new_id("item"), ms * RATE // 1000)
        await self.session.send(P.speech_started(ms, turn.item_id))
        self.session.barge_in()
        if self.session.server.options.partial_interval > 0:
            turn.sent, turn.live = [], self.session.spawn(self._live(turn))

    async def _speech_stopped(self, ms: int):
        # the turn's state is settled before the first await: a turn may end from the append handler
        # or from a semantic_vad decision (_speculate), which interleave at awaits
        turn, self.turn = self.turn, None
        turn.stop_live()
        if turn.paused is not None and turn.paused[0] == ms:
            early = turn.paused[1]  # the transcript started when this pause began
        else:  # the turn ended on the pause's first frames (timed from where the input went quiet)
            early = self._early_for(turn, ms)
        start, end = self._span(turn, ms)
        audio = self.buf.slice(start, end)
        self.buf.drop_until(end)
        await self.session.send(P.speech_stopped(ms, turn.item_id))
        await self._commit(turn, audio, auto=True, early=early)

    def _span(self, turn: Turn, end_ms: int) -> tuple[int, int]:
        """Samples of `turn` ending at `end_ms`: from its speech start less the prefix padding, to 100 ms
        into the pause."""
        return self._first_sample(turn), min(self.buf.end, end_ms * RATE // 1000 + TAIL)

    def _first_sample(self, turn: Turn) -> int:
        """The turn's speech start less the prefix padding (or where its audio not committed begins), within
        the buffer."""
        return max(self.buf.start, turn.start - self._padding() if turn.base is None else turn.base)

    def _padding(self) -> int:
        """Samples kept before a turn's speech start (turn detection's prefix_padding_ms)."""
        td = self.session.cfg.turn_detection  # (None if the client turned turn detection off mid-turn)
        return td.prefix_padding_ms * RATE // 1000 if td else 0

    async def _commit(self, turn: Turn, audio: np.ndarray, auto: bool, early: asyncio.Task | None = None):
        item = Item("user", [Part("input_audio")], id=turn.item_id, transcribed=asyncio.Event())
        prev = self.session.conversation.append(item)
        await self.session.send(P.buffer_committed(item.id, prev))
        await self.session.send(P.item_added(item.to_api(), prev))
        in_background(self.session, item, self._final(turn, item, audio, auto, early))

    # -- transcripts ------------------------------------------------------------------------------------
    async def _transcribe(
        self,
        turn: Turn,
        audio: np.ndarray,
        partial: bool = False,
        supersede: bool = False,
        live: bool = False,
        opening: bool = False,
        fresh=None,
    ):
        """Transcribe (part of) `turn`, drafting with its latest transcript: the speech only grew since, so most of
        its tokens are checked in one decoder pass. `live`: a live transcript's options (the encoder over the audio
        only), else a final's (see session.asr_options); `opening`: its first OPENING_TOKENS tokens only."""
        # keyed by session: a final transcript drops the pending live one of this session (made useless)
        opts = self.session.live_options if live else self.session.asr_options
        opts = dataclasses.replace(opts, sample_len=OPENING_TOKENS) if opening else opts
        r = await self.engine.transcribe(
            audio,
            partial=partial,
            key=self.session.id,
            supersede=supersede,
            options=opts,
            draft=turn.draft or None,
            turn=turn.item_id,
            opening=opening,
            fresh=fresh,
        )
        if r is not None and r.tokens:
            turn.draft = r.tokens
        return r

    async def _live(self, turn: Turn):
        """Live transcript of the turn being spoken: re-transcribe the growing audio every `partial_interval` s
        (longer while transcripts queue) and send the words hypotheses agree on (Turn.agree). Until its first words
        go out, rounds come OPENING_ROUND apart, unstretched, before other live transcripts while short (cheap)."""
        interval, last = self.session.server.options.partial_interval, [0]  # [the audio of the last round]
        while True:
            opening = not turn.sent
            await asyncio.sleep(interval * OPENING_ROUND if opening else self.engine.live_interval(interval))
            audio = self.buf.slice(first := self._first_sample(turn), self.buf.end)
            # paused: the final (begun at the pause) has the engine; quiet since the early one: it is this round's
            paused = self.detector is not None and self.detector.pause_ms is not None
            if len(audio) - last[0] < RATE // 4 or paused or turn.early and turn.early[0] == self.quiet.quiet_since:
                continue
            if len(audio) > COMMIT_AFTER:  # a long turn: this round also commits what is stable
                last[0] = len(audio) - await commit_stable(self, turn, first, audio)
                continue
            last[0], opening = len(audio), opening and len(audio) <= OPENING_MAX  # (last: see newest_audio)
            r = await self._transcribe(
                turn,
                audio,
                partial=True,
                live=True,
                opening=opening,
                fresh=lambda: newest_audio(self, turn, first, last),
            )
            if r is not None:
                await self.hypothesis(turn, r.text)

    async def hypothesis(self, turn: Turn, text: str):
        if self.turn is turn and (delta := turn.agree(text)):
            await self.session.send(P.transcription_delta(turn.item_id, delta))
            self.session.ahead.prime(" ".join(turn.sent))

    def _maybe_start_early(self, turn: Turn):
        """The input went quiet during a turn, but Silero has not called a pause yet (it lags the last
        sound by 60-130 ms): if the engine has nothing else queued, transcribe the turn up to here
        already, at live-transcript priority. If Silero's pause follows, this is its transcript."""
        q = self.quiet.quiet_since
        if (
            q is None
            or not self.detector.speaking
            or q <= turn.start
            or self.buf.end - q < EARLY_QUIET
            or (turn.early is not None and turn.early[0] == q)
            or not self.engine.has_spare_time()
        ):
            return
        audio = self.buf.slice(self._first_sample(turn), min(self.buf.end, q + TAIL))
        turn.early = (q, self.session.spawn(self._early(turn, audio)))

    async def _early(self, turn: Turn, audio: np.ndarray):
        # it replaces the session's live transcript, queued or running: its audio is the newest
        r = await self._transcribe(turn, audio, partial=True, supersede=True)
        if r is not None:
            await self.hypothesis(turn, r.text)
        return r

    def _early_for(self, turn: Turn, pause: int) -> asyncio.Task | None:
        """The early transcript that covers the pause Silero saw begin at `pause` ms: begun when the
        input went quiet shortly before, and quiet ever since (so the audio after it holds no speech).
        It is promoted to final priority if it is still queued or running."""
        if turn.early is None:
            return None
        q, task = turn.early
        if self.quiet.quiet_since != q or not quiet_began_pause(q * 1000 // RATE, pause):
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

    async def _speculate(self, turn: Turn, pause: int, audio: np.ndarray, early: asyncio.Task | None):
        """The transcript of the turn up to the pause that began at `pause` (`early`'s, if it has one; None if
        one up to a later pause replaced it while queued). With semantic_vad it decides how long this pause must
        last to end the turn (ending it now if it has); if the turn is still paused then, a reply may begin."""
        r = await early if early is not None else None
        if r is None:  # no early transcript, or a final transcript of another session stopped it
            r = await self._transcribe(turn, audio)
        if r is not None and self.detector is not None and self.detector.pause_ms == pause and self.turn is turn:
            if (td := self.session.cfg.turn_detection) is not None and td.semantic:
                for _kind, ms in self.detector.finish_pause(transcript_finished(r.text)):
                    await self._speech_stopped(ms)
            if self.turn is turn:  # still paused: the reply to the turn so far can begin before the pause ends it
                self.session.ahead.speculate(turn.item_id, turn.full(r.text))
        return r

    async def _final(self, turn: Turn, item: Item, audio: np.ndarray, auto: bool, early: asyncio.Task | None):
        try:
            r = await self.engine.wait(
                self._final_result(turn, audio, early), self.session.server.options.stall_timeout
            )
        except EngineStalled as e:
            self.session.server.counters.stalls += 1
            return await failed(self.session, item, f"{e}; the turn was not transcribed", "engine_stalled")
        except Exception as e:  # noqa: BLE001 - the engine's step failed: this turn is told, the session goes on
            return await failed(self.session, item, f"transcription failed: {type(e).__name__}: {e}", "server_error")
        text = turn.full(r.text)
        delta = turn.final_delta(text)
        if delta:
            await self.session.send(P.transcription_delta(item.id, delta))
        item.parts[0].text = text
        logprobs, words = await final_extras(self.session, self.engine, r, audio, turn)
        await self.session.send(
            P.transcription_completed(item.id, text, len(audio) / RATE + turn.committed_s, logprobs, words)
        )
        await self.session.send(P.item_done(item.to_api()))
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
    if audio is None or len(audio) > COMMIT_AFTER:
        return None
    used[0] = len(audio)
    return audio


def item_audio(item: Item, fmt, max_seconds: float) -> np.ndarray | None:
    """The input_audio parts of a client's item (conversation.item_from_api), base64-decoded, decoded from the
    session's input format `fmt` to 16 kHz and joined (None if it has none); ProtocolError for what is not
    base64, audio the format cannot hold, or under 0.1 s or over `max_seconds`."""
    clips = [p for p in item.parts if p.type == "input_audio"]
    if not clips:
        return None
    try:
        audio = InputDecoder(fmt).decode(b"".join(b64decode(p.audio) for p in clips), last=True)
    except AudioFormatError as e:
        raise ProtocolError(f"{e} (item.content input_audio)", "invalid_audio", "item.content.audio") from None
    if not RATE // 10 <= len(audio) <= max_seconds * RATE:
        raise ProtocolError(
            f"an item's audio must hold 0.1 to {max_seconds:g} s, got {len(audio) / RATE:.2f} s",
            "invalid_audio",
            "item.content.audio",
        )
    for p in clips:
        p.audio = None
    item.transcribed = asyncio.Event()  # (before the item is added: a response from then on waits for it)
    return audio


def in_background(session, item: Item, transcript) -> None:
    """Run `transcript`, the coroutine that makes `item`'s final transcript, as essential session work; the
    item's `transcribed` event is set when it ends, however it ends, so a response waiting for it goes on."""
    session.spawn(transcript, essential=True).add_done_callback(lambda _t: item.transcribed.set())


async def finish_item(session, item: Item, audio: np.ndarray | None):
    """A client's item, just added: conversation.item.done now for a text item; for one with audio (its
    item_audio), once its transcript is in (a response waits for that, as for committed audio)."""
    if audio is None:
        return await session.send(P.item_done(item.to_api()))
    in_background(session, item, transcribe_item(session, item, audio))


async def transcribe_item(session, item: Item, audio: np.ndarray):
    """The final transcript of a client's audio item (conversation.item.create with input_audio): on its
    first audio part, then ...transcription.completed and conversation.item.done."""
    engine = session.server.engine
    try:
        r = await engine.wait(
            engine.transcribe(audio, key=session.id, options=session.asr_options), session.server.options.stall_timeout
        )
    except EngineStalled as e:
        session.server.counters.stalls += 1
        return await failed(session, item, f"{e}; the item was not transcribed", "engine_stalled")
    except Exception as e:  # noqa: BLE001 - a failed step: this item is told, the session goes on
        return await failed(session, item, f"transcription failed: {type(e).__name__}: {e}", "server_error")
    text = r.text.strip() if r is not None else ""
    next(p for p in item.parts if p.type == "input_audio").text = text
    logprobs, words = await final_extras(session, engine, r, audio) if r is not None else (None, None)
    await session.send(P.transcription_completed(item.id, text, len(audio) / RATE, logprobs, words))
    await session.send(P.item_done(item.to_api()))


async def failed(session, item: Item, message: str, code: str):
    """The transcript of `item` failed: the session is told (and the item is incomplete)."""
    session.ahead.drop(item.id)
    item.status = "incomplete"
    await session.send(P.transcription_failed(item.id, message, code))
    await session.error(message, code, type="server_error")
    await session.send(P.item_done(item.to_api()))


async def commit_stable(turns: InputTurns, turn: Turn, first: int, audio: np.ndarray) -> int:
    """A live round of a long turn with local agreement (whisper_streaming's LocalAgreement-2 and buffer
    trimming): its audio not yet committed (`audio`, from sample `first`; the first 30 s of it) is transcribed
    with timestamps, the text goes out as the round's hypothesis, and the leading segments that the previous
    round also had and that end COMMIT_MARGIN or more before the end are committed: their text is the turn's
    for good, and its transcripts from then on start where they end, so a turn's cost grows with its length,
    not with its square. -> the samples committed (0: none)."""
    s = turns.session
    opts = dataclasses.replace(s.live_options, without_timestamps=False)
    r = await turns.engine.transcribe(audio[:MAX_UTTERANCE_SAMPLES], partial=True, key=s.id, options=opts)
    if r is None:
        return 0
    await turns.hypothesis(turn, r.text)
    segs = turns.engine.asr.closed_segments(r, tokens=True)
    before, turn.closed = turn.closed, (first, segs)
    segs = agreed(before[1] if before and before[0] == first else [], segs, min(len(audio), MAX_UTTERANCE_SAMPLES))
    if not segs:
        return 0
    end = round(segs[-1][1] * RATE)
    if s.cfg.logprobs or s.cfg.word_timestamps:  # the committed part's, aligned now: its audio is dropped below
        tokens = [t for *_, part in segs for t in part]
        turn.extras.append((turn.committed_s, asyncio.ensure_future(aligned(s, turns.engine, audio[:end], tokens))))
    turn.commit(" ".join(text.strip() for _, _, text, _ in segs), first + end, end / RATE)
    turns.buf.drop_until(turn.base)
    turns.engine.metrics.turn_commits += 1
    return end


def agreed(before: list, now: list, samples: int) -> list:
    """Local agreement: the leading segments (start s, end s, text, ...) of this round (`now`) that the previous
    round over the same start (`before`) also had — same words, ends within 0.5 s — and that end COMMIT_MARGIN
    before the end of the `samples` transcribed. (One round alone may skip or repeat speech; two rather not the
    same way.)"""
    out = []
    for seg, prev in zip(now, before):
        (_, end0, text0), (_, end, text) = prev[:3], seg[:3]
        if text.split() != text0.split() or abs(end - end0) > 0.5 or end * RATE > samples - COMMIT_MARGIN:
            break
        out.append(seg)
    return out


async def final_extras(
    session, engine, r, audio: np.ndarray, turn: Turn | None = None
) -> tuple[list | None, list | None]:
    """A final transcript's token logprobs and word times, for a session that asked for them (None
    otherwise): one more encoder and decoder pass on the engine's worker (one per 30 s of its segments where
    the rest of the turn was transcribed long-form), after those of the parts its `turn` committed (aligned as
    commit_stable commits them), word times counted from the turn's start; a failure is reported and gives
    None for both."""
    cfg = session.cfg
    if not (cfg.logprobs or cfg.word_timestamps):
        return None, None
    parts = [(off, await task) for off, task in (turn.extras if turn else [])]
    rest_at = turn.committed_s if turn else 0.0  # where `audio`, the turn's audio not committed, begins
    # the rest: one span, or spans of at most 30 s of its segments where it was transcribed long-form
    for a, b, tokens in segment_windows(r.segments, len(audio)) if r.segments else [(0, len(audio), r.tokens)]:
        parts.append((rest_at + a / RATE, await aligned(session, engine, audio[a:b], tokens)))
    if any(got is None for _, got in parts):  # the transcript still goes out, without the extras
        return None, None
    words = [
        dataclasses.replace(w, start=round(w.start + off, 2), end=round(w.end + off, 2))
        for off, (ws, _) in parts
        for w in ws
    ]
    logprobs = [lp for _, (_, lps) in parts for lp in lps]
    return (
        [{"token": b.decode("utf-8", "replace"), "logprob": round(lp, 6), "bytes": list(b)} for _, b, lp in logprobs]
        if cfg.logprobs
        else None,
        [w.to_dict() for w in words] if cfg.word_timestamps else None,
    )


async def aligned(session, engine, audio: np.ndarray, tokens: list[int]) -> tuple[list, list] | None:
    """(words, token logprobs) of `tokens`, a transcript of `audio`, from ASRPipeline.align on the engine's
    worker; empty for no tokens or audio over 30 s; None where it failed (the session is told)."""
    if not tokens or len(audio) > MAX_UTTERANCE_SAMPLES:
        return [], []
    asr, lang = engine.asr, session.cfg.language

    def align():
        yield asr.align(audio, tokens, lang)

    _, q = engine.stream(align())
    got = await q.get()
    if isinstance(got, BaseException):
        await session.error(f"word timing failed: {type(got).__name__}: {got}", "server_error", type="server_error")
        return None
    return got
