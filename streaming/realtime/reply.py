"""A reply's work in the engine, apart from sending it: the language model's text, cut into sentences and
clauses as it arrives, each clause synthesized as soon as the one before it is done.

It runs ahead of whoever sends it (agent.Response), so a session can begin one during a pause, before
turn detection ends the turn (a speculative reply): if the pause ends the turn with the transcript it
answered, the response takes it over with its first audio already made; if the person goes on speaking,
or the transcript comes out different, it is dropped, and its engine work stops at once (the positions of
the conversation its prompt filled stay in the language model's cache for the next reply: lm_batching).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from speechrt.errors import ContextLengthExceeded
from speechrt.pipelines.lm import GenerationOptions

from .function_call import CallOrText
from .response_options import ResponseOptions, response_options

PRIME = GenerationOptions(max_tokens=1, temperature=0.0)  # a prompt read ahead: its one token is not used


class Segment:
    """One clause: its text and the audio chunks of it made so far (float32 at the voice's rate)."""

    def __init__(self, text: str):
        self.text = text
        self._chunks: asyncio.Queue = asyncio.Queue()  # arrays, then None (the end) or the exception that ended it

    def put(self, chunk) -> None:
        """Add a chunk; None ends the segment, an exception fails it."""
        self._chunks.put_nowait(chunk)

    async def chunks(self):
        while (c := await self._chunks.get()) is not None:
            if isinstance(c, BaseException):
                raise c
            yield c


class Reply:
    """The text (and, for audio replies, the speech) answering `messages` with `options`, made in the
    engine of `server` by a task of its own: `start()`, then iterate `texts()` (text replies) or
    `segments()` (audio replies), in order, or `cancel()`. `finish_reason` is the language model's once
    it is done ('stop', 'length'; None for text the client gave, `options.say`)."""

    def __init__(self, server, options: ResponseOptions, speed: float, temperature: float):
        self.engine, self.lm, self.tts = server.engine, server.lm, server.tts
        self.stall_timeout = server.options.stall_timeout
        self.options, self.speed, self.temperature = options, speed, temperature
        self.finish_reason: str | None = None
        self.cancelled = False
        self._out: asyncio.Queue = asyncio.Queue()  # str pieces or Segments, then None or an exception
        self._lm_req = None
        self._tts_tasks: list = []
        self._task: asyncio.Task | None = None
        # a reply that may call a function (options.grammar): what it writes is read as a call or a text answer,
        # and `decision()` says which as soon as that is known (a call: once its name is written)
        g = options.grammar
        self.call = CallOrText(options.call_format) if g is not None and g.kind.startswith("tool_call") else None

    def start(self, messages: list[dict], key) -> None:
        """Begin: `messages` are the chat the model answers (unless the options say what to say), `key`
        names the conversation (the language model reuses the positions its earlier prompts share)."""
        self._task = asyncio.create_task(self._run(messages, key))

    def cancel(self) -> None:
        """Stop the language model and the synthesis now; what was made is dropped."""
        if self.cancelled:
            return
        self.cancelled = True
        if self._lm_req is not None:
            self.engine.cancel_generation(self._lm_req)
        for t in self._tts_tasks:
            t.cancelled = True
        if self._task is not None:
            self._task.cancel()

    def tokens(self) -> tuple[int, int, int]:
        """The language model's (prompt tokens, of them found in its cache, tokens written) so far; zeros for text
        the client gave (options.say)."""
        r = self._lm_req
        return (0, 0, 0) if r is None else (len(r.ids), r.reused, r.count)

    async def texts(self):
        """The reply's text as it is written (text replies)."""
        async for piece in self._items():
            yield piece

    async def segments(self):
        """The reply's clauses, each with its audio (audio replies)."""
        async for seg in self._items():
            yield seg

    async def _items(self):
        while (x := await self._out.get()) is not None:
            if isinstance(x, BaseException):
                raise x
            yield x

    async def _run(self, messages, key):
        try:
            pieces = (
                self._static(self.options.say) if self.options.say is not None else await self._generate(messages, key)
            )
            if self.call is not None and (pieces := await self.call.split(pieces, self._out)) is None:
                self._out.put_nowait(None)  # a call: its arguments went out
                return
            if self.options.audio:
                await self._speak(pieces)
            else:
                async for text in pieces:
                    self._out.put_nowait(text)
            self._out.put_nowait(None)
        except asyncio.CancelledError:
            self._out.put_nowait(asyncio.CancelledError())
            if self.call is not None:  # (a response waiting for its decision hears it too)
                self.call.decide(asyncio.CancelledError())
            raise
        except Exception as e:  # noqa: BLE001 - reported to whoever sends the reply
            self.cancel()
            self._out.put_nowait(e)
            if self.call is not None:
                self.call.decide(e)

    @staticmethod
    async def _static(text):
        yield text

    async def _generate(self, messages, key):
        """Join the engine's language model batch with the latest turns of `messages` that fit its context
        (tokenized off the event loop) -> the text pieces as they come."""
        eng, o = self.engine, self.options
        try:
            if o.grammar is not None:
                await asyncio.to_thread(self.lm.prepare_grammars)
            ids = await asyncio.to_thread(
                self.lm.encode_chat_within, messages, eng.prompt_room(o.max_tokens), True, o.tools
            )
        except ContextLengthExceeded as e:
            raise ContextLengthExceeded(
                f"{e}: shorten the instructions or the message, or lower max_output_tokens "
                f"(the context is {eng.batcher.max_seq} tokens; up to max_output_tokens of "
                "them, at most half, are kept for the answer; older turns are left out "
                "whole)",
                e.needed,
                e.room,
            ) from None
        opts = GenerationOptions(
            max_tokens=o.max_tokens,
            temperature=self.temperature,
            seed=0 if self.temperature > 0 else None,
            grammar=o.grammar,
        )
        self._lm_req, q = eng.generate(ids, opts, key=key)
        if self.cancelled:  # cancelled while the prompt was tokenized
            eng.cancel_generation(self._lm_req)
        return self._drain(q)

    async def _drain(self, q: asyncio.Queue):
        while True:
            piece = await self.engine.wait(q.get(), self.stall_timeout, "lm")
            if isinstance(piece, Exception):
                raise piece
            if piece.text:
                yield piece.text
            if piece.finish_reason is not None:
                self.finish_reason = piece.finish_reason
                self.engine.metrics.prompt_tokens_reused += self._lm_req.reused
                self.engine.metrics.prompt_tokens += len(self._lm_req.ids)
                return

    async def _speak(self, pieces):
        """Clauses from the text stream are synthesized one after another, each as soon as it is complete
        and the one before it is done, while more text arrives."""
        clauses: asyncio.Queue = asyncio.Queue()

        async def cut():
            splitter = self.tts.clause_splitter(min_clause_words=6)
            try:
                async for text in pieces:
                    for c in splitter.push(text):
                        clauses.put_nowait(c)
                for c in splitter.flush():
                    clauses.put_nowait(c)
                clauses.put_nowait(None)
            except Exception as e:  # noqa: BLE001 - the language model failed: the speech ends there, with it
                clauses.put_nowait(e)

        cutter = asyncio.create_task(cut())
        try:
            while (text := await clauses.get()) is not None:
                if isinstance(text, Exception):
                    raise text
                if any(c.isalnum() for c in text):
                    await self._synthesize(text)
        finally:
            cutter.cancel()

    async def _synthesize(self, text: str):
        seg = Segment(text)
        self._out.put_nowait(seg)
        task, q = self.engine.stream(self.tts.synthesize(text, rate=self.speed, on_unsupported="drop"), "tts")
        self._tts_tasks.append(task)
        try:
            while True:
                chunk = await self.engine.wait(q.get(), self.stall_timeout, "tts")
                if isinstance(chunk, StopAsyncIteration):
                    break
                if isinstance(chunk, Exception):
                    raise chunk
                seg.put(chunk)
            seg.put(None)
        except BaseException as e:
            task.cancelled = True
            seg.put(e if isinstance(e, Exception) else asyncio.CancelledError())
            raise


@dataclass
class Speculation:
    """A reply begun during a pause of turn `item_id`, answering `messages` (the conversation with the turn's
    transcript so far as its last message), under the session's settings `cfg` at the time."""

    item_id: str
    messages: list[dict]
    cfg: object
    reply: Reply

    def fits(self, messages: list[dict], options: ResponseOptions, cfg) -> bool:
        """Is this the reply a response with `options` to `messages` under `cfg` would make?"""
        return (
            cfg is self.cfg and options == self.reply.options and messages == self.messages and not self.reply.cancelled
        )


class Speculator:
    """A session's speculative reply: begun during a pause of the open turn (speculate), taken over by the
    turn's response (take) or dropped when speech resumes, the turn goes another way, or the session's
    settings change (drop). At most one at a time."""

    def __init__(self, session):
        self.session = session
        self.speculation: Speculation | None = None

    def speculate(self, item_id: str, text: str) -> None:
        """Turn `item_id` is paused, with transcript `text` so far: if the pause ends the turn, its response
        will answer `text`. When the engine has time to spare, begin that reply now (nothing is sent)."""
        s, srv = self.session, self.session.server
        self.drop()
        if not self._wanted(text, lm=False):  # (a prompt it primed may still be in the language model's queue)
            return
        options, messages = self._prompt(text)
        reply = Reply(srv, options, s.cfg.speed, s.cfg.temperature)
        reply.start(messages, s.id)
        self.speculation = Speculation(item_id, messages, s.cfg, reply)
        srv.engine.metrics.replies_speculated += 1

    def prime(self, text: str) -> None:
        """The turn being spoken has said `text` so far (the words its live transcript sent): when the engine
        has time to spare, the language model reads the prompt of the reply to it up to there (nothing is
        sent). When the turn ends, its reply's prompt shares those positions (the session's cache slot, by
        key), so only the words after them, not the conversation before, are read on the reply's path."""
        if self.speculation is None and self._wanted(text, live=False):  # (the turn's own live rounds queue often)
            self.session.spawn(self._prime(*self._prompt(text)))

    async def _prime(self, options: ResponseOptions, messages: list[dict]) -> None:
        eng = self.session.server.engine
        try:
            ids = await asyncio.to_thread(
                self.session.server.lm.encode_chat_within, messages, eng.prompt_room(options.max_tokens)
            )
        except ContextLengthExceeded:
            return  # nothing to read ahead: the turn's response says why it cannot be answered
        if self.session.response is None and self.speculation is None:
            eng.generate(ids, PRIME, key=self.session.id)  # (its queue gets the token nobody reads)
            eng.metrics.prompts_primed += 1

    def _wanted(self, text: str, lm: bool = True, live: bool = True) -> bool:
        """Is reply work worth beginning before the turn ends: a conversation session that answers turns
        on its own, with nothing being answered now, words to answer, and an engine with time to spare
        (see Engine.has_spare_time for `lm` and `live`)."""
        s, srv = self.session, self.session.server
        return bool(
            s.policy.speculative_replies
            and s.cfg.answers_turns
            and text.strip()
            and srv.conversation_ready
            and s.response is None
            and not s.draining
            and srv.engine.has_spare_time(lm, live)
        )

    def _prompt(self, text: str) -> tuple[ResponseOptions, list[dict]]:
        """The response options and the chat of the reply to the open turn if it ends with `text`."""
        s = self.session
        options = response_options({}, s.cfg, call_format=s.server.call_format)
        return options, s.conversation.messages(options.instructions) + [{"role": "user", "content": text.strip()}]

    def take(self, messages: list[dict], options: ResponseOptions) -> Reply | None:
        """The reply begun during the last pause, if it answers `messages` with the response options
        `options` under the session's settings now (else it is dropped)."""
        spec, self.speculation = self.speculation, None
        if spec is None:
            return None
        if not spec.fits(messages, options, self.session.cfg):
            spec.reply.cancel()
            return None
        self.session.server.engine.metrics.replies_speculation_used += 1
        return spec.reply

    def drop(self, item_id: str | None = None) -> None:
        """Stop the reply begun during a pause (of turn `item_id` only, if given)."""
        if self.speculation is not None and item_id in (None, self.speculation.item_id):
            self.speculation.reply.cancel()
            self.speculation = None
