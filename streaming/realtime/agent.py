"""The speech-to-speech agent: one Response per assistant turn.

The language model's reply streams from the engine's continuous batch; it is cut into sentences and
clauses as it arrives, and each piece is synthesized (as engine stream tasks, reply.py) and sent
as `response.output_audio.delta` while the model is still writing the rest. A reply the session began
during the turn's last pause (a speculative one) is taken over when it answered the same conversation. Cancelling
(response.cancel, barge-in, truncation) stops generation and synthesis at once and keeps, as the assistant's message,
only the text whose audio was sent.
"""

from __future__ import annotations

import asyncio
import base64
import time

from speechrt.errors import UserError

from ..engine import EngineStalled
from . import events as E
from .audio_codec import OutputEncoder
from .conversation import Item, Part, as_message, item_from_api
from .function_call import FunctionCall
from .protocol import ProtocolError, new_id
from .reply import Reply
from .response_options import response_options


class Response:
    def __init__(self, session, overrides: dict):
        self.session = session
        self.options = response_options(overrides, session.cfg, session.server.names, session.server.call_format)
        if self.options.say is not None:  # text the client gave: what the voice cannot read is an error
            try:
                session.server.tts.check_text(self.options.say)
            except UserError as e:
                raise ProtocolError(str(e), "invalid_value", "response.speechrt_say") from None
        # response.input: this response's own context (messages, or references to the conversation's items)
        # instead of the conversation; [] is none
        raw = overrides.get("input")
        self.input = None if raw is None else [input_item(session, x, i) for i, x in enumerate(raw)]
        self.audio = self.options.audio
        self.id = new_id("resp")
        self.status = "in_progress"
        self.reason = None
        self.error: dict | None = None  # why it failed
        self.item = Item("assistant", [], status="in_progress")
        self.transcript = ""  # text delivered (for audio: text whose audio was sent)
        self._reply: Reply | None = None
        self._runner: asyncio.Task | None = None
        self.prev: str | None = None  # the id of the conversation's item before this response's
        self.created = self.announced = False  # response.created sent; its message item added
        self.calls = FunctionCall(self)

    def cancel(self, reason: str):
        if self.status != "in_progress":
            return
        self.status, self.reason = "cancelled", reason
        self._stop_work()
        if self._runner is not None:
            self._runner.cancel()

    def _stop_work(self):
        """Stop the language model and the synthesis of this response in the engine."""
        if self._reply is not None:
            self._reply.cancel()

    async def run(self):
        self._runner = asyncio.current_task()
        s = self.session
        try:
            await self._run()
        except asyncio.CancelledError:
            if self.status == "in_progress":
                self.status = "cancelled"
        except Exception as e:  # noqa: BLE001 - a failed step, a stall: this response fails, the session goes on
            stalled, asked = isinstance(e, EngineStalled), isinstance(e, UserError)  # asked: what the client asked
            message = (
                f"the response failed: {e}" if stalled or asked else f"the response failed: {type(e).__name__}: {e}"
            )
            code = "engine_stalled" if stalled else getattr(e, "code", "invalid_value") if asked else "server_error"
            kind = "invalid_request_error" if asked else "server_error"
            if self.status == "in_progress":
                self._stop_work()
                self.status, self.error = "failed", {"type": kind, "code": code, "message": message}
            if stalled:
                s.server.counters.stalls += 1
            await s.error(message, code, type=kind)
        finally:
            await self._done()
            if s.response is self:
                s.response = None

    async def _run(self):
        s, o = self.session, self.options
        self.t0 = time.perf_counter()
        if not o.out_of_band:
            self.prev = s.conversation.append(self.item)
        await s.send(E.response_created(self.api("in_progress", [])))
        self.created = True
        if o.grammar is None:  # (a reply that may call a function is announced once it shows which it is)
            await self._announce()
        # the latest turns that fit in the model's context: the reply begun during the turn's last pause,
        # if it answered these very messages (see reply.Speculation), else one begun now. A response with
        # its own context (input, or out of band) neither takes that reply nor takes the conversation's cache
        # slot (key), so the next turn's prompt still finds its positions there
        own = self.input is not None or o.out_of_band
        await s.conversation.transcribed(upto=None if o.out_of_band else self.item)
        if self.input is not None:
            messages = [{"role": "system", "content": o.instructions}] if o.instructions else []
            messages += [m for m in map(as_message, self.input) if m is not None]
        else:
            messages = s.conversation.messages(o.instructions, upto=None if o.out_of_band else self.item)
        self._reply = None if own else s.ahead.take(messages, o)
        if self._reply is None:
            self._reply = Reply(s.server, o, s.cfg.speed, s.cfg.temperature)
            self._reply.start(messages, None if own else s.id)
        if o.grammar is not None:
            if self._reply.call is not None and await self._reply.call.decision() == "call":
                return await self.calls.run(self._reply)
            await self._announce()
        try:
            if self.audio:
                await self._speak()
            else:
                async for text in self._reply.texts():
                    self.transcript += text
                    await s.send(E.output_text_delta(self.id, self.item.id, text))
        finally:
            if self.status != "in_progress":
                self._reply.cancel()
        if self._reply.finish_reason == "length" and self.status == "in_progress":
            self.status, self.reason = "incomplete", "max_output_tokens"
        if self.status == "in_progress":
            self.status = "completed"

    async def _announce(self):
        """The response's message item and its content part, added."""
        s = self.session
        self.announced = True
        await s.send(E.output_item_added(self.id, self.item.to_api()))
        if not self.options.out_of_band:
            await s.send(E.item_added(self.item.to_api(), self.prev))
        part = Part("output_audio" if self.audio else "output_text", "")
        self.item.parts.append(part)
        await s.send(E.content_part_added(self.id, self.item.id, part.to_response_api()))

    async def _speak(self):
        """Send each clause's audio as it is made, its transcript with its first audio."""
        s = self.session
        fmt = self.options.output_format or s.cfg.output_format  # the response's own, or the session's
        enc = OutputEncoder(s.server.tts.sample_rate, fmt)
        sent_samples, first = 0, True
        async for seg in self._reply.segments():
            spoken_text = (" " if self.transcript else "") + seg.text
            announced = False
            async for chunk in seg.chunks():
                if self.status != "in_progress":
                    return
                data = enc.encode(chunk)
                if not data:
                    continue
                if not announced:  # the transcript of a segment goes out with its first audio
                    announced = True
                    self.transcript += spoken_text
                    await s.send(E.output_audio_transcript_delta(self.id, self.item.id, spoken_text))
                if first:
                    first = False
                    s.server.engine.metrics.first_audio_latency.append(time.perf_counter() - self.t0)
                sent_samples += len(data) // fmt.bytes_per_sample
                await s.send(E.output_audio_delta(self.id, self.item.id, base64.b64encode(data).decode()))
                self.item.audio_ms = sent_samples * 1000 // fmt.rate
            if announced:
                self.item.spoken.append((self.item.audio_ms, self.transcript))

    def api(self, status: str, output: list) -> dict:
        r = {
            "id": self.id,
            "object": "realtime.response",
            "status": status,
            "output": output,
            "output_modalities": ["audio"] if self.audio else ["text"],
            "conversation_id": None if self.options.out_of_band else self.session.id,
        }
        if self.options.metadata is not None:
            r["metadata"] = dict(self.options.metadata)
        if status in ("cancelled", "incomplete"):
            r["status_details"] = {"type": status, "reason": self.reason}
        elif status == "failed":
            r["status_details"] = {"type": "failed", "error": self.error}
        return r

    async def _done(self):
        s, item = self.session, self.item
        if item.type == "function_call":
            return await self.calls.done()
        if self.created and not self.announced:  # it failed or was cancelled before it showed what it writes
            await self._announce()
        if not item.parts:
            return
        part = item.parts[0]
        part.text = self.transcript
        if self.audio:
            await s.send(E.output_audio_done(self.id, item.id))
            await s.send(E.output_audio_transcript_done(self.id, item.id, self.transcript))
        else:
            await s.send(E.output_text_done(self.id, item.id, self.transcript))
        item.status = "completed" if self.status == "completed" else "incomplete"  # (the API's item statuses)
        await s.send(E.content_part_done(self.id, item.id, part.to_response_api()))
        await s.send(E.output_item_done(self.id, item.to_api()))
        if not self.options.out_of_band:
            await s.send(E.item_done(item.to_api()))
        await s.send(E.response_done({**self.api(self.status, [item.to_api()]), "usage": self.usage()}))

    def usage(self) -> dict:
        """What the response read and wrote (events.usage): the language model's prompt and answer tokens, the audio
        of the user's items it answered, the audio it sent."""
        items = self.input if self.input is not None else self.session.conversation.items
        upto = items.index(self.item) if self.item in items else len(items)
        heard = sum(it.audio_ms for it in items[:upto] if it.role == "user")
        tokens = self._reply.tokens() if self._reply is not None else (0, 0, 0)
        return E.usage(*tokens, heard, self.item.audio_ms)


def input_item(session, entry, i: int) -> Item:
    """One entry of response.input -> its item (a conversation item's text is read when the response
    begins: an audio item's transcript may still be on its way now)."""
    if isinstance(entry, dict) and entry.get("type") == "item_reference":
        return session.conversation.find(entry.get("id"))
    try:
        return item_from_api(entry, session.server.options.max_item_chars)
    except ProtocolError as e:
        raise ProtocolError(f"response.input[{i}]: {e}", e.code, f"response.input[{i}]") from None
