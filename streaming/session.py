"""One Realtime session per WebSocket connection: its configuration, input audio buffer, turn detection,
live transcripts and conversation items. Model work goes through the shared Engine."""
from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import replace

import numpy as np

from .audio_codec import AudioFormatError, InputDecoder, b64decode
from .protocol import (BETA_NAMES, CLIENT_EVENTS, ProtocolError, SessionConfig, apply_session_update, error_event,
                       new_id)
from .vad import QuietTracker, TurnDetector, quiet_began_pause, transcript_finished

log = logging.getLogger(__name__)
RATE = 16000
# early transcripts: begun once the input has been quiet this long (before Silero confirms the pause),
# and used as the final one if Silero's pause begins shortly after (vad.quiet_began_pause)
EARLY_QUIET = RATE * 10 // 1000


class AudioBuffer:
    """Uncommitted input audio at 16 kHz, addressed by absolute sample index since the session began."""

    def __init__(self):
        self.chunks: list[np.ndarray] = []
        self.start = 0  # absolute index of the first buffered sample
        self.size = 0

    @property
    def end(self) -> int:
        return self.start + self.size

    def append(self, x: np.ndarray):
        if len(x):
            self.chunks.append(x)
            self.size += len(x)

    def slice(self, a: int, b: int) -> np.ndarray:
        a, b = max(a, self.start), min(b, self.end)
        if b <= a:
            return np.zeros(0, np.float32)
        if len(self.chunks) > 1:
            self.chunks = [np.concatenate(self.chunks)]
        return self.chunks[0][a - self.start: b - self.start].copy()

    def drop_until(self, idx: int):
        idx = min(max(idx, self.start), self.end)
        if idx == self.start:
            return
        rest = self.slice(idx, self.end)
        self.chunks = [rest] if len(rest) else []
        self.start, self.size = idx, len(rest)

    def clear(self):
        self.drop_until(self.end)


def _common_prefix(a: list[str], b: list[str]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class RealtimeSession:
    def __init__(self, server, ws, intent: str | None):
        self.server, self.ws = server, ws
        self.id = new_id("sess")
        opts = server.options
        self.cfg = SessionConfig(type="transcription" if intent == "transcription" else "realtime",
                                 transcription_model=server.names["asr"][0], voice=server.names["tts"][0])
        if opts.silence_duration_ms is not None and self.cfg.turn_detection:
            self.cfg = replace(self.cfg, turn_detection=replace(self.cfg.turn_detection,
                                                                silence_duration_ms=opts.silence_duration_ms))
        self.input = InputDecoder(self.cfg.input_format)
        self.vad = server.vad.stream()
        self.turns = TurnDetector(self.cfg.turn_detection) if self.cfg.turn_detection else None
        self.buf = AudioBuffer()
        self.items: list[dict] = []
        self.turn_item: str | None = None
        self.turn_start = 0  # absolute sample index where the current turn's speech began
        self.partial_task: asyncio.Task | None = None
        self.tasks: set[asyncio.Task] = set()
        self.response = None  # the active agent.Response, if any
        self.speculative = None  # (pause_ms, task): the final transcript begun when a pause started
        self.quiet = QuietTracker()
        self.early = None  # (quiet_since, item id, task): a transcript begun when the input went quiet
        self.partial_words: tuple[str | None, list[str]] = (None, [])  # (item id, words sent as deltas)
        self.live_words: list[str] = []  # the latest live hypothesis of the turn in partial_words
        self.hypothesis: tuple[str | None, list[int]] = (None, [])  # (item id, tokens of its latest transcript)
        self.last_activity = time.monotonic()
        self.closed = False

    # -- output -----------------------------------------------------------------------------------
    async def send(self, event: dict):
        if self.closed:
            return
        if self.cfg.beta and event["type"] in BETA_NAMES:
            event = {**event, "type": BETA_NAMES[event["type"]]}
        event.setdefault("event_id", new_id("event"))
        try:
            await self.ws.send(json.dumps(event))
        except Exception:  # connection gone: the receive loop ends the session
            self.closed = True

    async def error(self, message: str, code: str, param: str | None = None, event_id: str | None = None,
                    type: str = "invalid_request_error"):
        await self.send(error_event(message, code, type, param, event_id))

    def spawn(self, coro) -> asyncio.Task:
        t = asyncio.create_task(coro)
        self.tasks.add(t)
        t.add_done_callback(self._task_done)
        return t

    def _task_done(self, t: asyncio.Task):
        self.tasks.discard(t)
        if not t.cancelled() and t.exception() is not None:
            log.error("session %s task failed", self.id, exc_info=t.exception())
            asyncio.ensure_future(self.error(f"internal error: {t.exception()}", "server_error", type="server_error"))

    # -- lifecycle --------------------------------------------------------------------------------
    async def run(self):
        await self.send({"type": "session.created", "session": self.cfg.to_api(self.id)})
        async for message in self.ws:
            self.last_activity = time.monotonic()
            await self.handle(message)

    async def finish(self, graceful: bool):
        """Connection closing: with `graceful`, let turns in flight finish first."""
        if graceful and self.tasks:
            await asyncio.wait(list(self.tasks), timeout=self.server.options.drain_seconds)
        self.closed = True
        for t in list(self.tasks):
            t.cancel()
        if self.response is not None:
            self.response.cancel("client_closed")

    async def handle(self, message):
        limit = self.server.options.max_message_bytes
        if len(message) > limit:
            return await self.error(f"message of {len(message)} bytes exceeds this server's limit of {limit} bytes; "
                                    "send audio in smaller chunks", "message_too_large")
        if isinstance(message, bytes):
            return await self.error("binary frames are not part of the protocol; send JSON text events", "invalid_json")
        try:
            ev = json.loads(message)
        except json.JSONDecodeError as e:
            return await self.error(f"message is not valid JSON: {e}", "invalid_json")
        if not isinstance(ev, dict) or not isinstance(ev.get("type"), str):
            return await self.error("every event must be a JSON object with a string 'type'", "invalid_event")
        etype, eid = ev["type"], ev.get("event_id")
        handler = getattr(self, "on_" + etype.replace(".", "_"), None)
        if etype not in CLIENT_EVENTS or handler is None:
            return await self.error(f"unknown event type {etype!r}; valid client events: {', '.join(CLIENT_EVENTS)}",
                                    "invalid_event_type", "type", eid)
        try:
            await handler(ev)
        except ProtocolError as e:
            await self.error(str(e), e.code, e.param, eid, e.type)
        except AudioFormatError as e:
            await self.error(str(e), "invalid_audio", "audio", eid)

    # -- session ----------------------------------------------------------------------------------
    async def on_session_update(self, ev):
        s = ev.get("session")
        if s is None:
            raise ProtocolError("session.update needs a 'session' object", "missing_required_parameter", "session")
        new = apply_session_update(self.cfg, s, self.server.names)
        if isinstance(s, dict) and ("modalities" in s or "input_audio_format" in s):
            new = replace(new, beta=True)  # a beta client: answer with the beta event names
        if new.type == "realtime" and not self.server.conversation_ready:
            raise ProtocolError("this server runs transcription only (started without a language model or voice)",
                                "invalid_value", "session.type")
        if new.input_format != self.cfg.input_format:
            if self.buf.size:
                raise ProtocolError("the input audio format cannot change while audio is buffered; "
                                    "commit or clear the buffer first", "invalid_value", "session.audio.input.format")
            self.input = InputDecoder(new.input_format)
        if new.turn_detection != self.cfg.turn_detection:
            self.turns = TurnDetector(new.turn_detection) if new.turn_detection else None
            if self.turns:  # continue the frame clock of the stream
                self.turns.frames = self.buf.end // 512
        self.cfg = new
        await self.send({"type": "session.updated", "session": self.cfg.to_api(self.id)})

    async def on_transcription_session_update(self, ev):
        s = dict(ev.get("session") or {})
        s.setdefault("type", "transcription")
        self.cfg = replace(self.cfg, beta=True)
        await self.on_session_update({"session": s, "event_id": ev.get("event_id")})

    # -- input audio ------------------------------------------------------------------------------
    async def on_input_audio_buffer_append(self, ev):
        if "audio" not in ev:
            raise ProtocolError("input_audio_buffer.append needs 'audio' (base64)", "missing_required_parameter", "audio")
        raw = b64decode(ev["audio"])
        x = self.input.decode(raw)
        cap = int(self.server.options.max_buffer_seconds * RATE)
        if self.buf.size + len(x) > cap:
            raise ProtocolError(f"input audio buffer full: at most {self.server.options.max_buffer_seconds:.0f} s of "
                                "uncommitted audio per session; commit or clear it (the chunk was not added)",
                                "input_audio_buffer_full", "audio")
        self.buf.append(x)
        if self.turns is None:
            return
        self.quiet.feed(x, self.buf.end - len(x))
        probs = await asyncio.get_running_loop().run_in_executor(self.server.vad_pool, self.vad.process, x)
        q = self.quiet.quiet_since
        for kind, ms in self.turns.feed(probs, None if q is None else q * 1000 // RATE):
            if kind == "start":
                await self._speech_started(ms)
            else:
                await self._speech_stopped(ms)
        pause = self.turns.pause_ms
        if pause is None:
            self.speculative = None
            self._maybe_start_early()
        elif self.speculative is None or self.speculative[0] != pause:
            # A pause began: transcribe the turn up to here now, so that if the pause becomes the end
            # of the turn (silence_duration_ms later) its final transcript is already (nearly) done.
            # The audio committed then differs from this only by trailing silence.
            start, end = self._turn_span(pause)
            self.speculative = (pause, self.spawn(self._speculate(pause, self.buf.slice(start, end), self.turn_item,
                                                                  self._early_for(pause))))

    def _maybe_start_early(self):
        """The input went quiet during a turn, but Silero has not called a pause yet (it lags the last
        sound by 60-130 ms): if the engine has nothing else queued, transcribe the turn up to here
        already, at live-transcript priority. If Silero's pause follows, this is its transcript."""
        q = self.quiet.quiet_since
        if (q is None or not self.turns.speaking or q <= self.turn_start or self.buf.end - q < EARLY_QUIET
                or (self.early is not None and self.early[0] == q) or not self.server.engine.has_spare_time()):
            return
        audio = self.buf.slice(self._turn_first_sample(), min(self.buf.end, q + RATE // 10))
        self.early = (q, self.turn_item, self.spawn(self._early(audio, self.turn_item)))

    async def _early(self, audio: np.ndarray, item_id: str):
        # it replaces the session's live transcript, queued or running: its audio is the newest
        r = await self._transcribe_turn(audio, item_id, partial=True, supersede=True)
        if r is not None and self.turn_item == item_id:
            await self._live_hypothesis(item_id, r.text)
        return r

    def _early_for(self, pause: int) -> asyncio.Task | None:
        """The early transcript that covers the pause Silero saw begin at `pause` ms: begun in this
        turn, when the input went quiet shortly before, and quiet ever since (so the audio after it
        holds no speech). It is promoted to final priority if it is still queued or running."""
        if self.early is None:
            return None
        q, item, task = self.early
        if item != self.turn_item or self.quiet.quiet_since != q or not quiet_began_pause(q * 1000 // RATE, pause):
            return None
        if not task.done():
            self.server.engine.promote(self.id)
        self.early = None  # used once

        async def result():
            r = await task
            if r is not None:
                self.server.engine.metrics.early_finals += 1
            return r
        return self.spawn(result())

    async def _speculate(self, pause: int, audio: np.ndarray, item_id: str, early: asyncio.Task | None = None):
        """The transcript of the turn up to the pause that began at `pause` (`early`'s, if it has one).
        With semantic_vad it also decides how long this pause must last to end the turn, and ends it
        now if it already has."""
        r = await early if early is not None else None
        if r is None:  # no early transcript, or a final transcript of another session stopped it
            r = await self._transcribe_turn(audio, item_id)
        td = self.cfg.turn_detection
        if (td is not None and td.semantic and self.turns is not None and self.turns.pause_ms == pause
                and self.turn_item == item_id):
            for _kind, ms in self.turns.finish_pause(transcript_finished(r.text)):
                await self._speech_stopped(ms)
        return r

    async def _speech_started(self, ms: int):
        self.turn_item = new_id("item")
        self.turn_start = ms * RATE // 1000
        await self.send({"type": "input_audio_buffer.speech_started", "audio_start_ms": ms, "item_id": self.turn_item})
        if self.response is not None and self.cfg.turn_detection.interrupt_response:
            self.response.cancel("turn_detected")  # barge-in
        if self.server.options.partial_interval > 0:
            self.partial_task = self.spawn(self._partials(self.turn_item))

    async def _speech_stopped(self, ms: int):
        # the turn's state is settled before the first await: a turn may end from the append handler
        # or from a semantic_vad decision (_speculate), which interleave at awaits
        item = self.turn_item
        if self.partial_task:
            self.partial_task.cancel()
        if self.speculative is not None and self.speculative[0] == ms:
            early = self.speculative[1]  # the transcript started when this pause began
        else:  # the turn ended on the pause's first frames (timed from where the input went quiet)
            early = self._early_for(ms)
        start, end = self._turn_span(ms)
        audio = self.buf.slice(start, end)
        self.buf.drop_until(end)
        self.turn_item = None
        self.speculative = None
        await self.send({"type": "input_audio_buffer.speech_stopped", "audio_end_ms": ms, "item_id": item})
        await self._commit(item, audio, auto=True, early=early)

    def _turn_span(self, end_ms: int) -> tuple[int, int]:
        """Samples of the current turn ending at `end_ms`: from the speech start less the prefix
        padding, to 100 ms into the pause (the tail helps Whisper finish the last word)."""
        return self._turn_first_sample(), min(self.buf.end, end_ms * RATE // 1000 + RATE // 10)

    def _turn_first_sample(self) -> int:
        """The current turn's speech start less the prefix padding, within the buffer."""
        pad = self.cfg.turn_detection.prefix_padding_ms * RATE // 1000
        return max(self.buf.start, self.turn_start - pad)

    async def _partials(self, item_id: str):
        """Live transcript of the turn being spoken: re-transcribe the growing audio about every
        `partial_interval` seconds and emit only words two consecutive hypotheses agree on."""
        interval = self.server.options.partial_interval
        last_len = 0
        self.partial_words, self.live_words = (item_id, []), []
        while True:
            await asyncio.sleep(interval)
            audio = self.buf.slice(self._turn_first_sample(), self.buf.end)[-30 * RATE:]
            if len(audio) - last_len < RATE // 4:
                continue
            if self.turns is not None and self.turns.pause_ms is not None:
                continue  # paused: the final transcript (begun at the pause) has the engine's time
            if self.early is not None and self.early[0] == self.quiet.quiet_since:
                continue  # quiet since the early transcript began: it is this round's hypothesis
            last_len = len(audio)
            r = await self._transcribe_turn(audio, item_id, partial=True)
            if r is not None and self.turn_item == item_id:
                await self._live_hypothesis(item_id, r.text)

    async def _live_hypothesis(self, item_id: str, text: str):
        """A new transcript of the turn being spoken: send as deltas the words it agrees on with the
        previous one, past those already sent."""
        said_id, said = self.partial_words
        if said_id != item_id:
            return
        words = text.split()
        stable = _common_prefix(self.live_words, words)
        if stable > len(said) and words[: len(said)] == said:
            await self.send({"type": "conversation.item.input_audio_transcription.delta", "item_id": item_id,
                             "content_index": 0, "delta": (" " if said else "") + " ".join(words[len(said):stable])})
            self.partial_words = (item_id, words[:stable])
        self.live_words = words

    async def _transcribe_turn(self, audio: np.ndarray, item_id: str | None, partial: bool = False,
                               supersede: bool = False):
        """Transcribe (part of) turn `item_id`, drafting with the turn's latest transcript: the speech
        only grew since, so most of its tokens are checked in one decoder pass."""
        hyp_item, draft = self.hypothesis
        # keyed by session: a final transcript drops the pending live one of this session (made useless)
        r = await self.server.engine.transcribe(audio, partial=partial, key=self.id, supersede=supersede,
                                                draft=draft if item_id is not None and hyp_item == item_id else None)
        if r is not None and item_id is not None and r.tokens:
            self.hypothesis = (item_id, r.tokens)
        return r

    async def on_input_audio_buffer_commit(self, ev):
        if self.buf.size < RATE // 10:
            raise ProtocolError(f"buffer too small: expected at least 100 ms of audio, the buffer has "
                                f"{self.buf.size * 1000 // RATE} ms", "input_audio_buffer_commit_empty")
        item = self.turn_item or new_id("item")
        if self.partial_task:
            self.partial_task.cancel()
        audio = self.buf.slice(self.buf.start, self.buf.end)
        self.buf.clear()
        if self.turns:
            self.turns.reset()
        self.turn_item = None
        await self._commit(item, audio, auto=False)

    async def on_input_audio_buffer_clear(self, ev):
        if self.partial_task:
            self.partial_task.cancel()
        self.buf.clear()
        if self.turns:
            self.turns.reset()
        self.turn_item = None
        await self.send({"type": "input_audio_buffer.cleared"})

    async def _commit(self, item_id: str, audio: np.ndarray, auto: bool, early: asyncio.Task | None = None):
        prev = self.items[-1]["id"] if self.items else None
        item = {"id": item_id, "object": "realtime.item", "type": "message", "role": "user", "status": "completed",
                "content": [{"type": "input_audio", "transcript": None}]}
        self.items.append(item)
        await self.send({"type": "input_audio_buffer.committed", "item_id": item_id, "previous_item_id": prev})
        await self.send({"type": "conversation.item.added", "item": item, "previous_item_id": prev})
        self.spawn(self._final_transcript(item, audio, auto, early))

    async def _final_transcript(self, item: dict, audio: np.ndarray, auto: bool, early: asyncio.Task | None):
        r = await early if early is not None else None
        if r is None:  # no early transcript, or a final transcript of another session stopped it
            r = await self._transcribe_turn(audio, item["id"])
        text = r.text
        said_id, said = self.partial_words
        if said_id == item["id"] and said:
            words = text.split()
            if words[: len(said)] == said and len(words) > len(said):
                await self.send({"type": "conversation.item.input_audio_transcription.delta", "item_id": item["id"],
                                 "content_index": 0, "delta": " " + " ".join(words[len(said):])})
        elif text:
            await self.send({"type": "conversation.item.input_audio_transcription.delta", "item_id": item["id"],
                             "content_index": 0, "delta": text})
        item["content"][0]["transcript"] = text
        await self.send({"type": "conversation.item.input_audio_transcription.completed", "item_id": item["id"],
                         "content_index": 0, "transcript": text,
                         "usage": {"type": "duration", "seconds": round(len(audio) / RATE, 3)}})
        await self.send({"type": "conversation.item.done", "item": item})
        td = self.cfg.turn_detection
        if auto and self.cfg.type == "realtime" and td and td.create_response and text.strip():
            await self.start_response({})

    # -- conversation items -----------------------------------------------------------------------
    def _find(self, item_id) -> dict:
        for it in self.items:
            if it["id"] == item_id:
                return it
        raise ProtocolError(f"no conversation item with id {item_id!r}", "item_not_found", "item_id")

    async def on_conversation_item_create(self, ev):
        item = ev.get("item")
        if not isinstance(item, dict):
            raise ProtocolError("conversation.item.create needs an 'item' object", "missing_required_parameter", "item")
        if item.get("type", "message") != "message":
            raise ProtocolError(f"item type {item.get('type')!r} is not supported; valid: message", "invalid_value", "item.type")
        role = item.get("role")
        if role not in ("user", "assistant", "system"):
            raise ProtocolError(f"item.role must be user, assistant or system, got {role!r}", "invalid_value", "item.role")
        content = item.get("content")
        if not isinstance(content, list) or not content:
            raise ProtocolError("item.content must be a non-empty list of parts", "invalid_value", "item.content")
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") not in ("input_text", "text", "output_text"):
                raise ProtocolError("content parts must be {'type': 'input_text', 'text': ...} (text items only)",
                                    "invalid_value", "item.content")
            if not isinstance(part.get("text"), str):
                raise ProtocolError("a text part needs a string 'text'", "invalid_value", "item.content.text")
            texts.append(part["text"])
        prev = ev.get("previous_item_id")
        if prev not in (None, "root") and prev != (self.items[-1]["id"] if self.items else None):
            self._find(prev)
            raise ProtocolError("items can only be appended at the end of the conversation", "invalid_value",
                                "previous_item_id")
        new = {"id": item.get("id") or new_id("item"), "object": "realtime.item", "type": "message", "role": role,
               "status": "completed",
               "content": [{"type": "input_text" if role != "assistant" else "output_text", "text": t} for t in texts]}
        last = self.items[-1]["id"] if self.items else None
        self.items.append(new)
        await self.send({"type": "conversation.item.added", "item": new, "previous_item_id": last})
        await self.send({"type": "conversation.item.done", "item": new})

    async def on_conversation_item_delete(self, ev):
        it = self._find(ev.get("item_id"))
        self.items.remove(it)
        await self.send({"type": "conversation.item.deleted", "item_id": it["id"]})

    async def on_conversation_item_retrieve(self, ev):
        await self.send({"type": "conversation.item.retrieved", "item": self._find(ev.get("item_id"))})

    async def on_conversation_item_truncate(self, ev):
        it = self._find(ev.get("item_id"))
        if it["role"] != "assistant" or not any(p.get("type") == "output_audio" for p in it["content"]):
            raise ProtocolError("only assistant items with audio can be truncated", "invalid_value", "item_id")
        ms = ev.get("audio_end_ms")
        if isinstance(ms, bool) or not isinstance(ms, int) or ms < 0:
            raise ProtocolError("audio_end_ms must be a non-negative integer", "invalid_value", "audio_end_ms")
        spoken = it.get("_spoken", [])  # [(end_ms, text so far)]
        played = it.get("_audio_ms", 0)
        if ms > played:
            raise ProtocolError(f"audio_end_ms {ms} is past the item's audio ({played} ms)", "invalid_value", "audio_end_ms")
        text = ""
        for end_ms, upto in spoken:
            if end_ms <= ms:
                text = upto
        part = next(p for p in it["content"] if p.get("type") == "output_audio")
        part["transcript"] = text
        it["_audio_ms"] = ms
        if self.response is not None and self.response.item_id == it["id"]:
            self.response.cancel("client_truncated")
        await self.send({"type": "conversation.item.truncated", "item_id": it["id"],
                         "content_index": ev.get("content_index", 0), "audio_end_ms": ms})

    # -- responses ----------------------------------------------------------------------------------
    async def on_response_create(self, ev):
        if self.cfg.type != "realtime":
            raise ProtocolError("responses are not available in transcription sessions", "invalid_value", "type")
        if self.response is not None:
            raise ProtocolError("a response is already in progress; cancel it first or wait for response.done",
                                "conversation_already_has_active_response")
        await self.start_response(ev.get("response") or {})

    async def start_response(self, overrides: dict):
        if not self.server.conversation_ready:
            raise ProtocolError("this server runs transcription only", "invalid_value", "type")
        if self.response is not None:
            self.response.cancel("superseded")
        from .agent import Response

        self.response = Response(self, overrides)
        self.spawn(self.response.run())

    async def on_response_cancel(self, ev):
        if self.response is None:
            raise ProtocolError("there is no response in progress to cancel", "response_cancel_not_active")
        self.response.cancel("client_cancelled")

    async def on_output_audio_buffer_clear(self, ev):
        if self.response is not None:
            self.response.cancel("client_cancelled")
        await self.send({"type": "output_audio_buffer.cleared", "response_id": None})
