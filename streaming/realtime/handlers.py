"""The client events of a Realtime session, one handler each (ClientEvents.HANDLERS): the session's settings, its
input audio, its conversation's items and its responses."""

from __future__ import annotations

from dataclasses import replace

from . import events as E
from .audio_codec import b64decode
from .config import apply_session_update, check_settings
from .conversation import item_from_api
from .events import CLIENT_EVENTS
from .items import finish_item, item_audio
from .protocol import ProtocolError, item_id, short


class ClientEvents:
    """The handlers of a RealtimeSession's client events (it dispatches them by HANDLERS), and what turns and
    responses ask of it (barge_in, user_turn_done, start_response)."""

    # -- session ----------------------------------------------------------------------------------
    async def on_session_update(self, ev):
        s = ev.get("session")
        if s is None:
            raise ProtocolError("session.update needs a 'session' object", "missing_required_parameter", "session")
        new = apply_session_update(self.cfg, s, self.server.names)
        if isinstance(s, dict) and ("modalities" in s or "input_audio_format" in s):
            new = replace(new, beta=True)  # a beta client: answer with the beta event names
        check_settings(self.server, new)
        self.turns.configure(self.cfg, new)
        self.ahead.drop()  # (it was made under the old settings)
        self.cfg, (self.asr_options, self.live_options) = new, self.policy.transcribe_options(new)
        await self.send(E.session_updated(self.cfg.to_api(self.id)))

    async def on_transcription_session_update(self, ev):
        s = dict(ev.get("session") or {})
        s.setdefault("type", "transcription")
        self.cfg = replace(self.cfg, beta=True)
        await self.on_session_update({"session": s, "event_id": ev.get("event_id")})

    # -- input audio ------------------------------------------------------------------------------
    async def on_input_audio_buffer_append(self, ev):
        if "audio" not in ev:
            raise ProtocolError(
                "input_audio_buffer.append needs 'audio' (base64)", "missing_required_parameter", "audio"
            )
        await self.turns.append(b64decode(ev["audio"]), self.server.options.max_buffer_seconds)

    async def on_input_audio_buffer_commit(self, ev):
        await self.turns.commit()

    async def on_input_audio_buffer_clear(self, ev):
        await self.turns.clear()

    def barge_in(self):
        """Speech began: a response in progress stops (if turn detection says so), a reply begun in a pause too."""
        self.ahead.drop()
        td = self.cfg.turn_detection
        if self.response is not None and td is not None and td.interrupt_response:
            self.response.cancel("turn_detected")

    async def user_turn_done(self, text: str):
        """A turn that turn detection ended has its transcript: answer it (conversation sessions)."""
        if self.cfg.answers_turns and text.strip():
            await self.start_response({})

    # -- conversation items -----------------------------------------------------------------------
    async def on_conversation_item_create(self, ev):
        o = self.server.options
        item = item_from_api(ev.get("item"), o.max_item_chars, audio=True)
        audio = item_audio(item, self.cfg.input_format, o.max_buffer_seconds)  # checked before the item is added
        self.conversation.check_room(item, o.max_conversation_chars)
        self.conversation.check_previous(ev.get("previous_item_id"))
        prev = self.conversation.append(item)
        await self.send(E.item_added(item.to_api(), prev))
        await finish_item(self, item, audio)

    async def on_conversation_item_delete(self, ev):
        it = self.conversation.delete(item_id(ev))
        await self.send(E.item_deleted(it.id))

    async def on_conversation_item_retrieve(self, ev):
        await self.send(E.item_retrieved(self.conversation.find(item_id(ev)).to_api()))

    async def on_conversation_item_truncate(self, ev):
        it = self.conversation.find(item_id(ev))
        ms = ev.get("audio_end_ms")
        it.truncate(ev.get("content_index", 0), ms)
        if self.response is not None and self.response.item.id == it.id:
            self.response.cancel("client_truncated")
        await self.send(E.item_truncated(it.id, 0, ms))

    # -- responses ----------------------------------------------------------------------------------
    async def on_response_create(self, ev):
        if self.cfg.type != "realtime":
            raise ProtocolError("responses are not available in transcription sessions", "invalid_value", "type")
        if self.response is not None:
            raise ProtocolError(
                "a response is already in progress; cancel it first or wait for response.done",
                "conversation_already_has_active_response",
            )
        await self.start_response(ev.get("response") or {})

    async def start_response(self, overrides: dict):
        if not self.server.conversation_ready:
            raise ProtocolError("this server runs transcription only", "invalid_value", "type")
        if self.response is not None:
            self.response.cancel("superseded")
        from .agent import Response

        self.response = Response(self, overrides)
        self.spawn(self.response.run(), essential=True)

    async def on_response_cancel(self, ev):
        if self.response is None:
            raise ProtocolError("there is no response in progress to cancel", "response_cancel_not_active")
        rid = ev.get("response_id")
        if rid is not None and rid != self.response.id:
            raise ProtocolError(
                f"no response in progress with id {short(rid)} (the one in progress is {self.response.id})",
                "response_cancel_not_active",
                "response_id",
            )
        self.response.cancel("client_cancelled")

    async def on_output_audio_buffer_clear(self, ev):
        if self.response is not None:
            self.response.cancel("client_cancelled")
        await self.send(E.output_audio_buffer_cleared(None))

    HANDLERS = {
        "session.update": on_session_update,
        "transcription_session.update": on_transcription_session_update,
        "input_audio_buffer.append": on_input_audio_buffer_append,
        "input_audio_buffer.commit": on_input_audio_buffer_commit,
        "input_audio_buffer.clear": on_input_audio_buffer_clear,
        "conversation.item.create": on_conversation_item_create,
        "conversation.item.delete": on_conversation_item_delete,
        "conversation.item.retrieve": on_conversation_item_retrieve,
        "conversation.item.truncate": on_conversation_item_truncate,
        "response.create": on_response_create,
        "response.cancel": on_response_cancel,
        "output_audio_buffer.clear": on_output_audio_buffer_clear,
    }
    assert tuple(HANDLERS) == CLIENT_EVENTS, "every client event has one handler"
