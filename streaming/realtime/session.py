"""One Realtime session per WebSocket connection: its state and lifecycle, the events it sends, and the dispatch
of the client's events (handlers.ClientEvents) to its three parts — its input turns (turns.py), its conversation
(conversation.py) and the assistant's responses (agent.py). Model work goes through the shared Engine; the turn
policy is the server's (policy.TurnPolicy)."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import replace

from .audio_codec import AudioFormatError
from .config import SessionConfig
from .connection import Outbox, serve_events
from .conversation import Conversation
from .events import BETA_NAMES, CLIENT_EVENTS, error_event, session_created
from .handlers import ClientEvents
from .policy import TurnPolicy
from .protocol import ProtocolError, new_id
from .reply import Speculator
from .turns import InputTurns

log = logging.getLogger(__name__)
# client events not taken once the server drains (graceful shutdown): they would begin new work
DRAIN_IGNORES = frozenset(
    {"input_audio_buffer.append", "input_audio_buffer.commit", "conversation.item.create", "response.create"}
)


class RealtimeSession(ClientEvents):
    def __init__(self, server, conn, intent: str | None, model: str | None = None):
        self.server, self.conn = server, conn
        self.id = new_id("sess")
        opts = server.options
        self.policy: TurnPolicy = server.turn_policy
        # a transcription-only server's sessions are transcription sessions, whatever the URL says
        kind = "realtime" if intent != "transcription" and server.conversation_ready else "transcription"
        cfg = SessionConfig(
            type=kind,
            model=model or SessionConfig.model,
            transcription_model=server.names["asr"][0],
            voice=(server.names["tts"] or [SessionConfig.voice])[0],
        )  # (no voice loaded: the default)
        silence_ms = self.policy.silence_duration_ms
        if silence_ms is not None and cfg.turn_detection:
            cfg = replace(cfg, turn_detection=replace(cfg.turn_detection, silence_duration_ms=silence_ms))
        self.cfg = cfg
        self.asr_options, self.live_options = self.policy.transcribe_options(cfg)
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
        await self.send(session_created(self.cfg.to_api(self.id), self.server.replica))
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
