"""One Realtime session per WebSocket connection: protocol dispatch of the client's events to the session's
three parts — its input turns (streaming/turns.py), its conversation (streaming/conversation.py) and the
assistant's responses (streaming/agent.py) — and the events sent back. Model work goes through the
shared Engine."""
from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import replace

from speechrt.errors import UserError
from speechrt.pipelines.asr import TranscribeOptions

from . import protocol as P
from .audio_codec import AudioFormatError, b64decode
from .conversation import Conversation, item_from_api
from .protocol import (BETA_NAMES, CLIENT_EVENTS, ProtocolError, SessionConfig, apply_session_update, error_event,
                       new_id)
from .turns import InputTurns

log = logging.getLogger(__name__)


class RealtimeSession:
    def __init__(self, server, ws, intent: str | None):
        self.server, self.ws = server, ws
        self.id = new_id("sess")
        opts = server.options
        cfg = SessionConfig(type="transcription" if intent == "transcription" else "realtime",
                            transcription_model=server.names["asr"][0], voice=server.names["tts"][0])
        if opts.silence_duration_ms is not None and cfg.turn_detection:
            cfg = replace(cfg, turn_detection=replace(cfg.turn_detection, silence_duration_ms=opts.silence_duration_ms))
        self.cfg = cfg
        self.asr_options = self._asr_options(cfg)
        self.conversation = Conversation()
        self.turns = InputTurns(self)
        self.response = None  # the active agent.Response, if any
        self.tasks: set[asyncio.Task] = set()
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
        await self.send(P.session_created(self.cfg.to_api(self.id)))
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
        handler = self.HANDLERS.get(etype)
        if handler is None:
            return await self.error(f"unknown event type {etype!r}; valid client events: {', '.join(CLIENT_EVENTS)}",
                                    "invalid_event_type", "type", eid)
        try:
            await handler(self, ev)
        except ProtocolError as e:
            await self.error(str(e), e.code, e.param, eid, e.type)
        except AudioFormatError as e:
            await self.error(str(e), "invalid_audio", "audio", eid)

    # -- session ----------------------------------------------------------------------------------
    @staticmethod
    def _asr_options(cfg: SessionConfig) -> TranscribeOptions:
        """The transcriber's options for this session's turns: greedy, its language and prompt."""
        return TranscribeOptions(without_timestamps=True, language=cfg.language, initial_prompt=cfg.prompt)

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
        try:
            self.server.asr.check_language(new.language)
        except UserError as e:
            raise ProtocolError(str(e), "invalid_value", "session.audio.input.transcription.language") from None
        self.turns.configure(self.cfg, new)
        self.cfg, self.asr_options = new, self._asr_options(new)
        await self.send(P.session_updated(self.cfg.to_api(self.id)))

    async def on_transcription_session_update(self, ev):
        s = dict(ev.get("session") or {})
        s.setdefault("type", "transcription")
        self.cfg = replace(self.cfg, beta=True)
        await self.on_session_update({"session": s, "event_id": ev.get("event_id")})

    # -- input audio ------------------------------------------------------------------------------
    async def on_input_audio_buffer_append(self, ev):
        if "audio" not in ev:
            raise ProtocolError("input_audio_buffer.append needs 'audio' (base64)", "missing_required_parameter", "audio")
        await self.turns.append(b64decode(ev["audio"]), self.server.options.max_buffer_seconds)

    async def on_input_audio_buffer_commit(self, ev):
        await self.turns.commit()

    async def on_input_audio_buffer_clear(self, ev):
        await self.turns.clear()

    def barge_in(self):
        """Speech began: a response in progress stops (if the session's turn detection says so)."""
        td = self.cfg.turn_detection
        if self.response is not None and td is not None and td.interrupt_response:
            self.response.cancel("turn_detected")

    async def user_turn_done(self, text: str):
        """A turn that turn detection ended has its transcript: answer it (conversation sessions)."""
        td = self.cfg.turn_detection
        if self.cfg.type == "realtime" and td and td.create_response and text.strip():
            await self.start_response({})

    # -- conversation items -----------------------------------------------------------------------
    async def on_conversation_item_create(self, ev):
        item = item_from_api(ev.get("item"))
        self.conversation.check_previous(ev.get("previous_item_id"))
        prev = self.conversation.append(item)
        await self.send(P.item_added(item.to_api(), prev))
        await self.send(P.item_done(item.to_api()))

    async def on_conversation_item_delete(self, ev):
        it = self.conversation.delete(ev.get("item_id"))
        await self.send(P.item_deleted(it.id))

    async def on_conversation_item_retrieve(self, ev):
        await self.send(P.item_retrieved(self.conversation.find(ev.get("item_id")).to_api()))

    async def on_conversation_item_truncate(self, ev):
        it = self.conversation.find(ev.get("item_id"))
        ms = ev.get("audio_end_ms")
        it.truncate(ms)
        if self.response is not None and self.response.item.id == it.id:
            self.response.cancel("client_truncated")
        await self.send(P.item_truncated(it.id, ev.get("content_index", 0), ms))

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
        await self.send(P.output_audio_buffer_cleared(None))

    HANDLERS = {
        "session.update": on_session_update, "transcription_session.update": on_transcription_session_update,
        "input_audio_buffer.append": on_input_audio_buffer_append,
        "input_audio_buffer.commit": on_input_audio_buffer_commit,
        "input_audio_buffer.clear": on_input_audio_buffer_clear,
        "conversation.item.create": on_conversation_item_create,
        "conversation.item.delete": on_conversation_item_delete,
        "conversation.item.retrieve": on_conversation_item_retrieve,
        "conversation.item.truncate": on_conversation_item_truncate,
        "response.create": on_response_create, "response.cancel": on_response_cancel,
        "output_audio_buffer.clear": on_output_audio_buffer_clear,
    }
    assert tuple(HANDLERS) == CLIENT_EVENTS, "every client event has one handler"
