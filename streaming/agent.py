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

from speechrt.pipelines.lm import GenerationOptions

from . import protocol as P
from .audio_codec import OutputEncoder
from .conversation import Item, Part
from .protocol import ProtocolError, new_id


class Response:
    def __init__(self, session, overrides: dict):
        if not isinstance(overrides, dict):
            raise ProtocolError("'response' must be an object", "invalid_value", "response")
        cfg = session.cfg
        self.session = session
        self.id = new_id("resp")
        mods = overrides.get("output_modalities") or overrides.get("modalities") or list(cfg.output_modalities)
        if not isinstance(mods, list) or any(m not in ("text", "audio") for m in mods):
            raise ProtocolError(f"output_modalities must be ['audio'] or ['text'], got {mods!r}", "invalid_value",
                                "response.output_modalities")
        self.audio = "audio" in mods
        self.instructions = overrides.get("instructions", cfg.instructions)
        self.say = overrides.get("speechrt_say")  # speechrt extension: speak this text verbatim
        if self.say is not None and (not isinstance(self.say, str) or not self.say.strip()):
            raise ProtocolError("speechrt_say must be a non-empty string", "invalid_value", "response.speechrt_say")
        max_tokens = overrides.get("max_output_tokens", cfg.max_output_tokens)
        self.max_tokens = 1024 if max_tokens == "inf" else int(max_tokens)
        self.status = "in_progress"
        self.reason = None
        self.item = Item("assistant", [], status="in_progress")
        self.transcript = ""  # text delivered (for audio: text whose audio was sent)
        self._lm_req = None
        self._tts_tasks: list = []
        self._runner: asyncio.Task | None = None

    def cancel(self, reason: str):
        if self.status != "in_progress":
            return
        self.status, self.reason = "cancelled", reason
        eng = self.session.server.engine
        if self._lm_req is not None:
            eng.cancel_generation(self._lm_req)
        for t in self._tts_tasks:
            t.cancelled = True
        if self._runner is not None:
            self._runner.cancel()

    async def run(self):
        self._runner = asyncio.current_task()
        s = self.session
        try:
            await self._run()
        except asyncio.CancelledError:
            if self.status == "in_progress":
                self.status = "cancelled"
        finally:
            await self._done()
            if s.response is self:
                s.response = None

    async def _run(self):
        s, eng = self.session, self.session.server.engine
        self.t0 = time.perf_counter()
        prev = s.conversation.append(self.item)
        await s.send(P.response_created(self._api("in_progress", [])))
        await s.send(P.output_item_added(self.id, self.item.to_api()))
        await s.send(P.item_added(self.item.to_api(), prev))
        part = Part("output_audio" if self.audio else "output_text", "")
        self.item.parts.append(part)
        await s.send(P.content_part_added(self.id, self.item.id, part.to_response_api()))
        if self.say is not None:
            pieces = self._static(self.say)
        else:
            lm = s.server.lm
            ids = lm.encode_chat(s.conversation.messages(self.instructions, upto=self.item))
            opts = GenerationOptions(max_tokens=self.max_tokens, temperature=s.cfg.temperature,
                                     seed=0 if s.cfg.temperature > 0 else None)
            self._lm_req, q = eng.generate(ids, opts, key=s.id)
            pieces = self._drain(q)
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

    async def _drain(self, q: asyncio.Queue):
        while True:
            piece = await q.get()
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
                    chunk = await q.get()
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
        item.status = "completed" if self.status == "completed" else "incomplete"
        await s.send(P.content_part_done(self.id, item.id, part.to_response_api()))
        await s.send(P.output_item_done(self.id, item.to_api()))
        await s.send(P.item_done(item.to_api()))
        await s.send(P.response_done(self._api(self.status, [item.to_api()])))
