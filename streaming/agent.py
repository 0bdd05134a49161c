"""The speech-to-speech agent: one Response per assistant turn.

The language model's reply streams from the engine's continuous batch; it is cut into sentences and
clauses as it arrives, and each piece is synthesized (as engine stream tasks) and sent as
`response.output_audio.delta` while the model is still writing the rest. Cancelling (response.cancel,
barge-in, truncation) stops generation and synthesis at once and keeps, as the assistant's message,
only the text whose audio was sent.
"""
from __future__ import annotations

import asyncio
import base64
import time

from speechrt.errors import UserError
from speechrt.pipelines.lm import GenerationOptions

from . import protocol as P
from .audio_codec import OutputEncoder
from .conversation import Item, Part
from .engine import EngineStalled
from .protocol import ProtocolError, new_id, response_options


class Response:
    def __init__(self, session, overrides: dict):
        self.session = session
        self.options = response_options(overrides, session.cfg)
        if self.options.say is not None:  # text the client gave: what the voice cannot read is an error
            try:
                session.server.tts.check_text(self.options.say)
            except UserError as e:
                raise ProtocolError(str(e), "invalid_value", "response.speechrt_say") from None
        self.audio = self.options.audio
        self.id = new_id("resp")
        self.status = "in_progress"
        self.reason = None
        self.error: dict | None = None  # why it failed
        self.item = Item("assistant", [], status="in_progress")
        self.transcript = ""  # text delivered (for audio: text whose audio was sent)
        self._lm_req = None
        self._tts_tasks: list = []
        self._runner: asyncio.Task | None = None

    def cancel(self, reason: str):
        if self.status != "in_progress":
            return
        self.status, self.reason = "cancelled", reason
        self._stop_work()
        if self._runner is not None:
            self._runner.cancel()

    def _stop_work(self):
        """Stop the language model and the synthesis of this response in the engine."""
        eng = self.session.server.engine
        if self._lm_req is not None:
            eng.cancel_generation(self._lm_req)
        for t in self._tts_tasks:
            t.cancelled = True

    async def run(self):
        self._runner = asyncio.current_task()
        s = self.session
        try:
            await self._run()
        except asyncio.CancelledError:
            if self.status == "in_progress":
                self.status = "cancelled"
        except Exception as e:  # noqa: BLE001 - a failed step, a stall: this response fails, the session goes on
            stalled = isinstance(e, EngineStalled)
            message = f"the response failed: {e}" if stalled else f"the response failed: {type(e).__name__}: {e}"
            code = "engine_stalled" if stalled else "server_error"
            if self.status == "in_progress":
                self._stop_work()
                self.status, self.error = "failed", {"type": "server_error", "code": code, "message": message}
            if stalled:
                s.server.counters.stalls += 1
            await s.error(message, code, type="server_error")
        finally:
            await self._done()
            if s.response is self:
                s.response = None

    async def _run(self):
        s, eng = self.session, self.session.server.engine
        o, stall = self.options, s.server.options.stall_timeout
        self.t0 = time.perf_counter()
        prev = s.conversation.append(self.item)
        await s.send(P.response_created(self._api("in_progress", [])))
        await s.send(P.output_item_added(self.id, self.item.to_api()))
        await s.send(P.item_added(self.item.to_api(), prev))
        part = Part("output_audio" if self.audio else "output_text", "")
        self.item.parts.append(part)
        await s.send(P.content_part_added(self.id, self.item.id, part.to_response_api()))
        if o.say is not None:
            pieces = self._static(o.say)
        else:
            # the latest turns that fit in the model's context, tokenized off the event loop
            messages = s.conversation.messages(o.instructions, upto=self.item)
            ids = await asyncio.to_thread(s.server.lm.encode_chat_within, messages, eng.prompt_room(o.max_tokens))
            opts = GenerationOptions(max_tokens=o.max_tokens, temperature=s.cfg.temperature,
                                     seed=0 if s.cfg.temperature > 0 else None)
            self._lm_req, q = eng.generate(ids, opts, key=s.id)
            pieces = self._drain(q, stall)
        if self.audio:
            await self._speak(pieces)
        else:
            async for text in pieces:
                self.transcript += text
                await s.send(P.output_text_delta(self.id, self.item.id, text))
        if self.status == "in_progress":
            self.status = "completed"

    @staticmethod
    async def _static(text):
        yield text

    async def _drain(self, q: asyncio.Queue, stall: float):
        eng = self.session.server.engine
        while True:
            piece = await eng.wait(q.get(), stall)
            if isinstance(piece, Exception):
                raise piece
            if piece.text:
                yield piece.text
            if piece.finish_reason is not None:
                if piece.finish_reason == "length" and self.status == "in_progress":
                    self.status, self.reason = "incomplete", "max_output_tokens"
                return

    async def _speak(self, pieces):
        """Sentences/clauses from the text stream are synthesized in order while more text arrives."""
        s, eng = self.session, self.session.server.engine
        tts = s.server.tts
        enc = OutputEncoder(tts.sample_rate, s.cfg.output_format)
        segments: asyncio.Queue = asyncio.Queue()

        async def cut():
            splitter = tts.clause_splitter(min_clause_words=6)
            try:
                async for text in pieces:
                    for seg in splitter.push(text):
                        segments.put_nowait(seg)
                for seg in splitter.flush():
                    segments.put_nowait(seg)
            finally:
                segments.put_nowait(None)

        cutter = asyncio.create_task(cut())
        sent_samples = 0
        first = True
        try:
            while (seg := await segments.get()) is not None:
                if self.status != "in_progress":
                    break
                if not any(c.isalnum() for c in seg):
                    continue
                gen = tts.synthesize(seg, rate=s.cfg.speed, on_unsupported="drop")
                task, q = eng.stream(gen)
                self._tts_tasks.append(task)
                spoken_text = (" " if self.transcript else "") + seg
                announced = False
                while True:
                    chunk = await eng.wait(q.get(), s.server.options.stall_timeout)
                    if isinstance(chunk, StopAsyncIteration):
                        break
                    if isinstance(chunk, Exception):
                        raise chunk
                    if self.status != "in_progress":
                        task.cancelled = True
                        break
                    data = enc.encode(chunk)
                    if not data:
                        continue
                    if not announced:  # the transcript of a segment goes out with its first audio
                        announced = True
                        self.transcript += spoken_text
                        await s.send(P.output_audio_transcript_delta(self.id, self.item.id, spoken_text))
                    if first:
                        first = False
                        eng.metrics.first_audio_latency.append(time.perf_counter() - self.t0)
                    sent_samples += len(data) // s.cfg.output_format.bytes_per_sample
                    await s.send(P.output_audio_delta(self.id, self.item.id, base64.b64encode(data).decode()))
                    self.item.audio_ms = sent_samples * 1000 // s.cfg.output_format.rate
                if announced:
                    self.item.spoken.append((self.item.audio_ms, self.transcript))
        finally:
            cutter.cancel()
            if self._lm_req is not None and self.status != "in_progress":
                eng.cancel_generation(self._lm_req)

    def _api(self, status: str, output: list) -> dict:
        r = {"id": self.id, "object": "realtime.response", "status": status, "output": output,
             "output_modalities": ["audio"] if self.audio else ["text"], "conversation_id": self.session.id}
        if status in ("cancelled", "incomplete"):
            r["status_details"] = {"type": status, "reason": self.reason}
        elif status == "failed":
            r["status_details"] = {"type": "failed", "error": self.error}
        return r

    async def _done(self):
        s, item = self.session, self.item
        if not item.parts:
            return
        part = item.parts[0]
        part.text = self.transcript
        if self.audio:
            await s.send(P.output_audio_done(self.id, item.id))
            await s.send(P.output_audio_transcript_done(self.id, item.id, self.transcript))
        else:
            await s.send(P.output_text_done(self.id, item.id, self.transcript))
        item.status = "completed" if self.status == "completed" else "incomplete"  # (the API's item statuses)
        await s.send(P.content_part_done(self.id, item.id, part.to_response_api()))
        await s.send(P.output_item_done(self.id, item.to_api()))
        await s.send(P.item_done(item.to_api()))
        await s.send(P.response_done(self._api(self.status, [item.to_api()])))
