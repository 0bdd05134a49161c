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
from .protocol import BETA_NAMES, CLIENT_EVENTS, ProtocolError, SessionConfig, apply_session_update, error_event, new_id
from .reply import Speculator
from .turns import InputTurns, finish_item, item_audio

log = logging.getLogger(__name__)
# client events not taken once the server drains (graceful shutdown): they would begin new work
DRAIN_IGNORES = frozenset(
    {"input_audio_buffer.append", "input_audio_buffer.commit", "conversation.item.create", "response.create"}
)


def asr_options(cfg: SessionConfig, live: bool = False, final_margin: float | None = None) -> TranscribeOptions:
    """The transcriber's options for a session's turns: greedy, its language and prompt, a decoded loop cut,
    and the encoder over the turn's audio plus a margin of padding, not a whole 30-s window (whisper.cpp's
    audio_ctx). Live transcripts (`live`, redone every second) take a 1 s margin; final ones (and the early
    ones that may become final) `final_margin` (default FINAL_MARGIN_S: the server's --final-margin).

    The final margin, measured on the benchmark's 12 sentences and 4 questions in the embedded voice, 3 seeds
    x 3 lead/tail silences (144 clips of 1.5-3 s, `transcribe_batch` as the server runs it, tiny.en int8 on
    ONNX Runtime, AMD EPYC Zen 4, 2026-11-27): whole windows 4.61 % WER at 218 ms a clip, 10 s 4.61 % / 90 ms,
    8 s 5.32 % / 75 ms, 6 s 5.67 % / 60 ms, 4 s and 3 s 7.09 % / 54 ms ("What color is the sky on a clear
    day?" -> "What colors does this guy ...", "Remind me" -> "Rem I need"); torch float32 the same way (whole
    and 8 s 4.61 %, 3 s 6.38 %, 48 clips). The conversation benchmark's 4 questions: 12.9 % WER with 3 s, 0 %
    with 10 s, final p50 305 vs 302 ms. (An earlier study, 108 clips of the 12 sentences alone on Zen 3, had
    found 3 s at whole windows' WER, 3.31 vs 3.19 %, and the server ran 3 s until this one.)"""
    return TranscribeOptions(
        without_timestamps=True,
        language=cfg.language,
        initial_prompt=cfg.prompt,
        trim_context=True,
        trim_margin=1.0 if live else final_margin or FINAL_MARGIN_S,
        stop_repeats=3,
    )


FINAL_MARGIN_S = 10.0
# the final margin while the engine is loaded (streaming/transcripts.py, LoadedMargins)
LOADED_FINAL_MARGIN_S = 3.0


def turn_options(cfg: SessionConfig, final_margin: float | None = None) -> tuple[TranscribeOptions, TranscribeOptions]:
    """(final, live) transcriber options of a session's turns (asr_options)."""
    return asr_options(cfg, final_margin=final_margin), asr_options(cfg, live=True)


def check_settings(server, cfg: SessionConfig) -> None:
    """ProtocolError if the server cannot serve a session with settings `cfg`: a conversation on a
    transcription-only server, a language its ASR model lacks, word times from a backend without them."""
    if cfg.type == "realtime" and not server.conversation_ready:
        raise ProtocolError(
            "this server runs transcription only (started without a language model or voice)",
            "invalid_value",
            "session.type",
        )
    try:
        server.asr.check_language(cfg.language)
    except UserError as e:
        raise ProtocolError(str(e), "invalid_value", "session.audio.input.transcription.language") from None
    check_word_timing(server.asr, cfg)


def check_word_timing(asr, cfg: SessionConfig) -> None:
    """ProtocolError if the session asks for word times and the server's ASR backend cannot give them."""
    if cfg.word_timestamps and not asr.runner.word_timing:
        raise ProtocolError(
            f"word timestamps are not available on this server's {asr.info.backend} backend; start "
            f"it with one of: {', '.join(asr.runner.WORD_TIMING_BACKENDS)}",
            "invalid_value",
            "session.audio.input.transcription.speechrt_word_timestamps",
        )


class Outbox:
    """Events on their way to one client: a queue drained by one writer task, bounded in bytes. A client
    that stops reading fills it up, and `put` says so (the session is then closed: its memory stays
    bounded whatever the client does)."""

    def __init__(self, conn, max_bytes: int):
        self.conn, self.max_bytes = conn, max_bytes
        self.queue: asyncio.Queue = asyncio.Queue()
        self.size = 0
        self.writer: asyncio.Task | None = None

    def start(self):
        self.writer = asyncio.create_task(self._write())

    def put(self, text: str) -> bool:
        if self.size + len(text) > self.max_bytes:
            return False
        self.size += len(text)
        self.queue.put_nowait(text)
        return True

    async def _write(self):
        while True:
            item = await self.queue.get()
            if isinstance(item, tuple):  # (code, reason): close after what was queued before it
                return await self.conn.close(*item)
            try:
                await self.conn.send(item)
            except Exception:  # noqa: BLE001 - the connection is gone: the receive loop ends the session
                return await self.conn.close(1011, "send failed")
            finally:
                self.size -= len(item)

    async def close(self, code: int, reason: str, flush: bool, timeout: float = 5.0):
        """Close the connection; with `flush`, after the events queued so far (for at most `timeout`)."""
        if flush and self.writer is not None and not self.writer.done():
            self.queue.put_nowait((code, reason))
            try:
                await asyncio.wait_for(asyncio.shield(self.writer), timeout)
            except asyncio.TimeoutError:
                pass
            except asyncio.CancelledError:
                # the writer was cancelled meanwhile (the client left and its session closed): nothing more
                # to flush, and the caller (a server shutting down) goes on; a cancellation of the caller
                # itself still propagates
                me = asyncio.current_task()
                if not self.writer.cancelled() or (me is not None and getattr(me, "cancelling", lambda: 0)()):
                    raise
        if self.writer is not None:
            self.writer.cancel()
        await self.conn.close(code, reason)


READ_AHEAD = 2  # client events read while one is handled (at most 2 x --max-message-bytes held a session)


async def serve_events(session):
    """Handle a session's client events in order until its connection closes, read by read_ahead."""
    inbox: asyncio.Queue = asyncio.Queue(READ_AHEAD)
    reader = asyncio.create_task(read_ahead(session, inbox))
    try:
        while (message := await inbox.get()) is not None and not session.conn.closed:
            await session.handle(message)
    finally:
        reader.cancel()
    if reader.done() and not reader.cancelled() and reader.exception() is not None:
        raise reader.exception()


async def read_ahead(session, inbox: asyncio.Queue):
    """A session's reader: its client's events into `inbox`, READ_AHEAD ahead of the one being handled, so that
    a client's close is seen at once, not after its last events' work (their VAD under load): the connection
    counts as closed (SpeechServer.open_sessions) and the events it left unhandled are dropped with its work."""
    try:
        while (message := await session.conn.receive()) is not None:
            session.last_activity = time.monotonic()
            await inbox.put(message)  # waits while READ_AHEAD are queued: a flooding client is held back
    except Exception:  # a broken connection, not a close: the handler stops after the queued events too
        await session.conn.close(1011, "internal error")
        raise  # (serve_events raises it once the handler is done)
    finally:
        if not inbox.full():  # (full: the handler sees the closed connection before it needs the end mark)
            inbox.put_nowait(None)


class RealtimeSession:
    def __init__(self, server, conn, intent: str | None, model: str | None = None):
        self.server, self.conn = server, conn
        self.id = new_id("sess")
        opts = server.options
        # a transcription-only server's sessions are transcription sessions, whatever the URL says
        kind = "realtime" if intent != "transcription" and server.conversation_ready else "transcription"
        cfg = SessionConfig(
            type=kind,
            model=model or SessionConfig.model,
            transcription_model=server.names["asr"][0],
            voice=(server.names["tts"] or [SessionConfig.voice])[0],
        )  # (no voice loaded: the default)
        if opts.silence_duration_ms is not None and cfg.turn_detection:
            cfg = replace(cfg, turn_detection=replace(cfg.turn_detection, silence_duration_ms=opts.silence_duration_ms))
        self.cfg = cfg
        self.asr_options, self.live_options = turn_options(cfg, opts.final_margin)
        self.conversation = Conversation()
        self.turns = InputTurns(self)
        self.response = None  # the active agent.Response, if any
        self.ahead = Speculator(self)  # a reply begun during the open turn's pause, if any
        self.tasks: set[asyncio.Task] = set()
        self.essential: set[asyncio.Task] = set()  # final transcripts and responses: a drain waits for them
        self.outbox = Outbox(conn, opts.max_send_queue_bytes)
        self.last_activity = time.monotonic()
        self.closed = self.draining = False  # draining: set by drain(), input that would begin new work is not taken

    # -- output -----------------------------------------------------------------------------------
    async def send(self, event: dict):
        if self.closed:
            return
        if self.cfg.beta and event["type"] in BETA_NAMES:
            event = {**event, "type": BETA_NAMES[event["type"]]}
        event.setdefault("event_id", new_id("event"))
        self.last_activity = time.monotonic()
        if event["type"] == "error":
            self.server.counters.errors_sent += 1
        if not self.outbox.put(json.dumps(event)):
            self.closed = True
            self.server.counters.slow_readers_closed += 1
            log.warning("session %s: the client does not read; closing it", self.id)
            await self.outbox.close(
                1008, "send queue full: the client does not read the events sent to it", flush=False
            )

    async def error(
        self,
        message: str,
        code: str,
        param: str | None = None,
        event_id: str | None = None,
        type: str = "invalid_request_error",
    ):
        await self.send(error_event(message, code, type, param, event_id))

    def spawn(self, coro, essential: bool = False) -> asyncio.Task:
        """Run `coro` for this session; `essential` work (a final transcript, a response) is what a graceful
        shutdown waits for."""
        t = asyncio.create_task(coro)
        self.tasks.add(t)
        if essential:
            self.essential.add(t)
        t.add_done_callback(self._task_done)
        return t

    def _task_done(self, t: asyncio.Task):
        self.tasks.discard(t)
        self.essential.discard(t)
        if not t.cancelled() and t.exception() is not None:
            log.error("session %s task failed", self.id, exc_info=t.exception())
            asyncio.ensure_future(self.error(f"internal error: {t.exception()}", "server_error", type="server_error"))

    # -- lifecycle --------------------------------------------------------------------------------
    async def run(self):
        """Serve the client's events until the connection closes (serve_events)."""
        self.outbox.start()
        await self.send(P.session_created(self.cfg.to_api(self.id), self.server.replica))
        await serve_events(self)

    def drain(self) -> list[asyncio.Task]:
        """Graceful shutdown: stop what only serves a turn still being spoken, take no input that would
        begin new work (DRAIN_IGNORES); -> the final transcripts and responses in flight, to be waited for."""
        self.draining = True
        self.ahead.drop()
        self.turns.end_turn()
        for t in self.tasks - self.essential:
            t.cancel()
        return list(self.essential)

    def has_essential_work(self) -> bool:
        return any(not t.done() for t in self.essential)

    async def end(self, message: str, code: str, close_code: int, error: bool = True):
        """Close from the server's side: an error event saying why (if `error`), then the connection."""
        if self.closed:
            return
        if error:
            await self.error(message, code, type="server_error")
        self.closed = True
        await self.outbox.close(close_code, message, flush=True)

    async def close(self):
        """The connection is closed: stop this session's work at once and forget its queued work."""
        self.closed = True
        for t in list(self.tasks):
            t.cancel()
        if self.response is not None:
            self.response.cancel("client_closed")
        self.ahead.drop()
        self.turns.end_turn()
        self.server.engine.forget(self.id)
        await self.outbox.close(1000, "", flush=False)

    async def handle(self, message):
        limit = self.server.options.max_message_bytes
        if len(message) > limit:
            return await self.error(
                f"message of {len(message)} bytes exceeds this server's limit of {limit} bytes; "
                "send audio in smaller chunks",
                "message_too_large",
            )
        if isinstance(message, bytes):
            return await self.error("binary frames are not part of the protocol; send JSON text events", "invalid_json")
        try:
            ev = json.loads(message)
        except (ValueError, RecursionError) as e:  # JSONDecodeError, 4300+ digit integers, deep nesting
            return await self.error(f"message is not valid JSON: {str(e)[:200]}", "invalid_json")
        if not isinstance(ev, dict) or not isinstance(ev.get("type"), str):
            return await self.error("every event must be a JSON object with a string 'type'", "invalid_event")
        etype, eid = ev["type"], ev.get("event_id")
        if self.draining and etype in DRAIN_IGNORES:
            return  # the server is shutting down: its notice says input after the drain began was not taken
        handler = self.HANDLERS.get(etype)
        if handler is None:
            return await self.error(
                f"unknown event type {etype!r}; valid client events: {', '.join(CLIENT_EVENTS)}",
                "invalid_event_type",
                "type",
                eid,
            )
        try:
            await handler(self, ev)
        except ProtocolError as e:
            await self.error(str(e), e.code, e.param, eid, e.type)
        except AudioFormatError as e:
            await self.error(str(e), "invalid_audio", "audio", eid)
        except Exception as e:  # noqa: BLE001 - a bug must not end the session: the client is told
            log.exception("session %s: %s failed", self.id, etype)
            await self.error(
                f"internal error handling {etype}: {type(e).__name__}: {e}", "server_error", None, eid, "server_error"
            )

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
        self.cfg, (self.asr_options, self.live_options) = new, turn_options(new, self.server.options.final_margin)
        await self.send(P.session_updated(self.cfg.to_api(self.id)))

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
        await self.send(P.item_added(item.to_api(), prev))
        await finish_item(self, item, audio)

    async def on_conversation_item_delete(self, ev):
        it = self.conversation.delete(P.item_id(ev))
        await self.send(P.item_deleted(it.id))

    async def on_conversation_item_retrieve(self, ev):
        await self.send(P.item_retrieved(self.conversation.find(P.item_id(ev)).to_api()))

    async def on_conversation_item_truncate(self, ev):
        it = self.conversation.find(P.item_id(ev))
        ms = ev.get("audio_end_ms")
        it.truncate(ev.get("content_index", 0), ms)
        if self.response is not None and self.response.item.id == it.id:
            self.response.cancel("client_truncated")
        await self.send(P.item_truncated(it.id, 0, ms))

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
                f"no response in progress with id {P.short(rid)} (the one in progress is {self.response.id})",
                "response_cancel_not_active",
                "response_id",
            )
        self.response.cancel("client_cancelled")

    async def on_output_audio_buffer_clear(self, ev):
        if self.response is not None:
            self.response.cancel("client_cancelled")
        await self.send(P.output_audio_buffer_cleared(None))

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
