"""speechrt's Python SDK for the Realtime server: an async client and a sync wrapper (its typed events:
speechrt/client_events.py).

from speechrt.client import Client
with Client("ws://127.0.0.1:8765/v1/realtime") as c:
    print(c.transcribe_file("talk.wav"))
    reply = c.ask("What is the capital of France?")      # text in, spoken answer out
    print(reply.transcript, len(reply.audio))
"""

from __future__ import annotations

import asyncio
import base64
import json
import threading
from collections.abc import AsyncIterator, Iterable

import numpy as np

from speechrt.client_events import (
    AudioDelta,
    ErrorEvent,
    Event,
    RealtimeError,
    Reply,
    ResponseDone,
    SpeechStarted,
    SpeechStopped,
    TextDelta,
    TranscriptCompleted,
    TranscriptDelta,
    parse_event,
    read_reply,
)

WIRE_RATE = 24000


def _pcm16(audio: np.ndarray) -> bytes:
    return (np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes()


def _to_wire(audio, sample_rate: int | None) -> np.ndarray:
    from speechrt.models.audio import load_audio

    if isinstance(audio, (str, bytes)) or hasattr(audio, "__fspath__"):
        return load_audio(audio, sample_rate=WIRE_RATE)
    return load_audio(
        np.asarray(audio), sample_rate=WIRE_RATE, source_rate=WIRE_RATE if sample_rate is None else sample_rate
    )


# -- async client ------------------------------------------------------------------------------------
class RealtimeConnection:
    """A Realtime session over one WebSocket: its events in order (next_event, wait_for), events out (send),
    the session's configuration (update_session) and input audio (append_audio)."""

    def __init__(
        self,
        url: str = "ws://127.0.0.1:8765/v1/realtime",
        api_key: str | None = None,
        transcription: bool = False,
        session: dict | None = None,
        open_timeout: float = 10,
    ):
        self.url = url + ("&" if "?" in url else "?") + "intent=transcription" if transcription else url
        self.api_key, self.session, self.open_timeout = api_key, session, open_timeout
        self.transcription = transcription
        self.ws = None
        self._events: asyncio.Queue = asyncio.Queue()
        self._reader = None

    async def __aenter__(self):
        return await self.connect()

    async def __aexit__(self, *exc):
        await self.close()

    async def connect(self):
        from websockets.asyncio.client import connect

        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        self.ws = await connect(
            self.url, additional_headers=headers, open_timeout=self.open_timeout, max_size=None, compression=None
        )
        self._reader = asyncio.create_task(self._read())
        ev = await self.next_event()
        if isinstance(ev, ErrorEvent):
            await self.close()
            raise RealtimeError(ev.code, ev.message)
        self.session_config = ev.raw.get("session", {})
        if self.session or self.transcription:
            s = dict(self.session or {})
            if self.transcription:
                s.setdefault("type", "transcription")
            await self.update_session(s)
        return self

    async def _read(self):
        try:
            async for m in self.ws:
                ev = parse_event(json.loads(m))
                if ev.type in ("session.created", "session.updated"):
                    self.session_config = ev.raw.get("session", {})  # the server's view of our session
                self._events.put_nowait(ev)
        except Exception:  # noqa: BLE001 - the connection ended; readers see None
            pass
        finally:
            self._events.put_nowait(None)

    async def close(self):
        """Clean close: the server finishes nothing more for us; no reconnect."""
        if self.ws is not None:
            await self.ws.close()
            if self._reader:
                await asyncio.wait([self._reader], timeout=5)
            self.ws = None

    async def send(self, event: dict):
        await self.ws.send(json.dumps(event))

    async def next_event(self, timeout: float | None = 120) -> Event | None:
        return await asyncio.wait_for(self._events.get(), timeout)

    async def events(self) -> AsyncIterator[Event]:
        while (ev := await self.next_event(None)) is not None:
            yield ev

    async def wait_for(self, *types: str, timeout: float = 120) -> Event:
        """The next event of one of `types`; an error event raises RealtimeError."""
        while True:
            ev = await self.next_event(timeout)
            if ev is None:
                raise ConnectionError("the server closed the connection")
            if isinstance(ev, ErrorEvent):
                raise RealtimeError(ev.code, ev.message)
            if ev.type in types:
                return ev

    async def update_session(self, session: dict) -> dict:
        """session.update with these fields (the Realtime API's layout) -> the session as the server now has
        it; a value the server refuses raises RealtimeError naming it, and the session stays as it was."""
        await self.send({"type": "session.update", "session": session})
        return (await self.wait_for("session.updated")).raw.get("session", {})

    async def append_audio(self, audio24k: np.ndarray, chunk_ms: int = 100, realtime: bool = False):
        """Send float32 audio at 24 kHz as pcm16 chunks (paced in real time if asked)."""
        step = WIRE_RATE * chunk_ms // 1000
        for i in range(0, len(audio24k), step):
            await self.send(
                {
                    "type": "input_audio_buffer.append",
                    "audio": base64.b64encode(_pcm16(audio24k[i : i + step])).decode(),
                }
            )
            if realtime:
                await asyncio.sleep(chunk_ms / 1000)


class AsyncClient(RealtimeConnection):
    """The Realtime session's uses in one call each: transcribe a file or a stream, ask, talk, say."""

    async def transcribe(self, audio, sample_rate: int | None = None, realtime: bool = False) -> str:
        """Transcript of a whole file or array: sent, committed, transcribed (no turn detection)."""
        td = (self.session_config.get("audio") or {}).get("input", {}).get("turn_detection")
        if td is not None:  # manual commit for a whole file; turn detection comes back afterwards
            await self.update_session({"audio": {"input": {"turn_detection": None}}})
        try:
            await self.append_audio(_to_wire(audio, sample_rate), realtime=realtime)
            await self.send({"type": "input_audio_buffer.commit"})
            ev = await self.wait_for("conversation.item.input_audio_transcription.completed")
        finally:
            if td is not None:
                await self.update_session({"audio": {"input": {"turn_detection": td}}})
        return ev.transcript

    async def transcribe_stream(self, chunks, sample_rate: int, final_timeout: float = 30) -> AsyncIterator[Event]:
        """Live transcription of an (async) iterable of audio chunks at `sample_rate`, with server turn
        detection: yields SpeechStarted/Stopped, TranscriptDelta and TranscriptCompleted events. Ends
        once all audio is sent and every started turn has its final transcript (or `final_timeout`
        seconds passed without one)."""

        async def pump():
            if hasattr(chunks, "__aiter__"):
                async for c in chunks:
                    await self.append_audio(_to_wire(c, sample_rate))
            else:
                for c in chunks:
                    await self.append_audio(_to_wire(c, sample_rate))

        task = asyncio.create_task(pump())
        quiet = 0.0  # seconds without an event since all audio was sent
        pending = 0  # turns started whose final transcript has not come yet
        try:
            while True:
                try:
                    ev = await self.next_event(0.5)
                except asyncio.TimeoutError:
                    if task.done():
                        task.result()  # a failed send raises here
                        quiet += 0.5
                        if pending == 0 or quiet > final_timeout:
                            return
                    continue
                quiet = 0.0
                if ev is None:
                    return
                if isinstance(ev, ErrorEvent):
                    raise RealtimeError(ev.code, ev.message)
                if isinstance(ev, SpeechStarted):
                    pending += 1
                elif isinstance(ev, TranscriptCompleted):
                    pending = max(0, pending - 1)
                if isinstance(ev, (SpeechStarted, SpeechStopped, TranscriptDelta, TranscriptCompleted)):
                    yield ev
        finally:
            task.cancel()

    async def ask(self, text: str) -> Reply:
        """Send a text message; the assistant answers (audio + transcript, or text in text sessions)."""
        await self.send(
            {
                "type": "conversation.item.create",
                "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]},
            }
        )
        # a message the server refuses raises here, before a response to the conversation without it is asked for
        await self.wait_for("conversation.item.added", "conversation.item.created")
        await self.send({"type": "response.create"})
        return await read_reply(self.next_event)

    async def talk(self, audio, sample_rate: int | None = None, realtime: bool = False) -> Reply:
        """Speak to the agent: audio is sent (followed by silence so the server detects the end of the
        turn), transcribed, answered and spoken. Returns the reply with the user's transcript."""
        if self.session_config.get("type") == "transcription":  # nothing would answer: say so, do not wait
            raise RealtimeError(
                "invalid_value",
                "talk() needs a conversation session; this one is a transcription "
                "session (a transcription-only server, or transcription=True)",
            )
        wire = _to_wire(audio, sample_rate)
        await self.append_audio(np.concatenate([wire, np.zeros(WIRE_RATE, np.float32)]), realtime=realtime)
        return await read_reply(self.next_event)

    async def say(self, text: str) -> np.ndarray:
        """Speech synthesis through the server (speechrt extension: a response that speaks `text`
        verbatim, without the language model). Returns float32 audio at 24 kHz."""
        await self.send({"type": "response.create", "response": {"speechrt_say": text}})
        return (await read_reply(self.next_event)).audio


# -- sync wrapper -------------------------------------------------------------------------------------
class Client:
    """Blocking wrapper around AsyncClient (runs its own event loop thread)."""

    def __init__(
        self,
        url: str = "ws://127.0.0.1:8765/v1/realtime",
        api_key: str | None = None,
        transcription: bool = False,
        session: dict | None = None,
    ):
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._c = AsyncClient(url, api_key, transcription, session)
        try:
            self._call(self._c.connect())
        except BaseException:
            self._stop_loop()
            raise

    def _call(self, coro, timeout: float | None = 600):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def send(self, event: dict):
        self._call(self._c.send(event))

    def next_event(self, timeout: float | None = 120) -> Event | None:
        return self._call(self._c.next_event(timeout))

    def update_session(self, session: dict) -> dict:
        return self._call(self._c.update_session(session))

    def transcribe_file(self, path, realtime: bool = False) -> str:
        return self._call(self._c.transcribe(path, realtime=realtime))

    def transcribe(self, audio, sample_rate: int, realtime: bool = False) -> str:
        return self._call(self._c.transcribe(audio, sample_rate, realtime=realtime))

    def transcribe_stream(self, chunks: Iterable, sample_rate: int) -> Iterable[Event]:
        agen = self._c.transcribe_stream(chunks, sample_rate)
        while True:
            try:
                yield self._call(agen.__anext__())
            except StopAsyncIteration:
                return

    def ask(self, text: str) -> Reply:
        return self._call(self._c.ask(text))

    def talk(self, audio, sample_rate: int | None = None, realtime: bool = False) -> Reply:
        return self._call(self._c.talk(audio, sample_rate, realtime))

    def say(self, text: str) -> np.ndarray:
        return self._call(self._c.say(text))

    def close(self):
        if self._loop.is_running():
            try:
                self._call(self._c.close(), timeout=10)
            finally:
                self._stop_loop()

    def _stop_loop(self):
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)


__all__ = [
    "AsyncClient",
    "Client",
    "Event",
    "ErrorEvent",
    "SpeechStarted",
    "SpeechStopped",
    "TranscriptDelta",
    "TranscriptCompleted",
    "AudioDelta",
    "TextDelta",
    "ResponseDone",
    "Reply",
    "RealtimeError",
    "parse_event",
]
