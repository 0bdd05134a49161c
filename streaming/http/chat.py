"""POST /v1/chat/completions: OpenAI's chat completion, whole or streamed (`chat.completion.chunk` server-sent
events, then `data: [DONE]`), through the engine's continuous batch (the same one the voice conversations
use); messages are rendered with the language model's chat template."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time

from fastapi import Request
from starlette.responses import JSONResponse, StreamingResponse

from speechrt.errors import ContextLengthExceeded, UserError
from speechrt.pipelines.generation import check_bias
from speechrt.pipelines.grammar import Grammar
from speechrt.pipelines.lm import GenerationOptions

from ..realtime.protocol import new_id
from .chat_tools import CallAnswer, chat_tools
from .endpoint import SSE, RestError, check_model, json_body, loaded, number, sse

ROLES = ("system", "developer", "user", "assistant", "tool")
DEFAULT_MAX_TOKENS = 512
# the batcher's reasons -> OpenAI's (a reply cut because it repeats itself stopped, as far as a client knows)
FINISH = {"stop": "stop", "length": "length", "repetition": "stop", "cancelled": "stop"}


def message_text(content, i: int) -> str:
    """A message's content: a string, or a list of parts of which the text ones are read."""
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if isinstance(content, list):
        out = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text":
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise RestError(400, f"messages[{i}].content: only text parts are understood, got {kind!r}")
            out.append(str(part.get("text", "")))
        return "".join(out)
    raise RestError(400, f"messages[{i}].content must be a string or a list of text parts")


def chat_messages(raw) -> list[dict]:
    if not isinstance(raw, list) or not raw:
        raise RestError(
            400, "'messages' must be a non-empty list of {role, content} objects", "missing_required_parameter"
        )
    out = []
    for i, m in enumerate(raw):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            role = m.get("role") if isinstance(m, dict) else None
            raise RestError(400, f"messages[{i}].role {role!r} is not valid; valid: {', '.join(ROLES)}")
        role = "system" if m["role"] == "developer" else m["role"]
        msg = {"role": role, "content": message_text(m.get("content"), i)}
        if role == "assistant" and m.get("tool_calls"):
            msg["tool_calls"] = tool_calls(m["tool_calls"], i)
        if role == "tool" and m.get("tool_call_id") is not None:
            msg["tool_call_id"] = str(m["tool_call_id"])
        out.append(msg)
    return out


def tool_calls(calls, i: int) -> list[dict]:
    """An assistant message's tool_calls (the calls it made earlier in the conversation), checked."""
    ok = isinstance(calls, list) and all(
        isinstance(c, dict)
        and isinstance(c.get("function"), dict)
        and isinstance(c["function"].get("name"), str)
        and isinstance(c["function"].get("arguments", ""), str)
        for c in calls
    )
    if not ok:
        raise RestError(
            400,
            f"messages[{i}].tool_calls must be a list of {{'id', 'type': 'function', 'function': {{'name', "
            "'arguments' (JSON text)}}",
            param=f"messages[{i}].tool_calls",
        )
    return [{"id": c.get("id"), "type": "function", "function": dict(c["function"])} for c in calls]


def check_unsupported(body: dict) -> None:
    """Parameters of OpenAI's endpoint that this server cannot honour, when they ask for something: a 400
    that names them, rather than an answer that silently ignores them (their neutral values pass)."""
    mods = body.get("modalities")
    if mods is not None and mods != ["text"]:
        raise RestError(
            400,
            f"modalities must be ['text'] here, got {mods!r} (speech: POST /v1/audio/speech, or a Realtime session)",
        )


def logprobs_option(body: dict) -> int | None:
    """OpenAI's logprobs (bool) and top_logprobs (0-20, only with logprobs) -> GenerationOptions.logprobs."""
    want, top = body.get("logprobs"), body.get("top_logprobs")
    if want not in (None, True, False):
        raise RestError(400, f"logprobs must be true or false, got {want!r}")
    if top is not None and (isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= 20):
        raise RestError(400, f"top_logprobs must be an integer in [0, 20], got {top!r}")
    if top and not want:
        raise RestError(400, "top_logprobs needs logprobs=true")
    return (top or 0) if want else None


def generation_options(body: dict, grammar: Grammar | None = None) -> GenerationOptions:
    """The request's sampling options; `grammar`: what its answer follows (chat_tools)."""
    check_unsupported(body)
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is None:
        max_tokens = DEFAULT_MAX_TOKENS
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise RestError(400, f"max_tokens / max_completion_tokens must be an integer >= 1, got {max_tokens!r}")
    stop = body.get("stop") or ()
    if isinstance(stop, str):
        stop = (stop,)
    if not isinstance(stop, (list, tuple)) or len(stop) > 4 or not all(isinstance(s, str) and s for s in stop):
        raise RestError(400, f"stop must be a string or a list of up to 4 non-empty strings, got {stop!r}")
    temperature = number(body.get("temperature"), "temperature", 0, 2, 1.0)
    seed = body.get("seed")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
        raise RestError(400, f"seed must be an integer, got {seed!r}")
    try:
        return GenerationOptions(
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=number(body.get("top_p"), "top_p", 0.01, 1, 1.0),
            stop=tuple(stop),
            seed=seed,
            logit_bias=body.get("logit_bias") or (),
            frequency_penalty=number(body.get("frequency_penalty"), "frequency_penalty", -2, 2, 0.0),
            presence_penalty=number(body.get("presence_penalty"), "presence_penalty", -2, 2, 0.0),
            logprobs=logprobs_option(body),
            grammar=grammar,
        )
    except UserError as e:
        raise RestError(400, str(e)) from None


MAX_CHOICES = 8


def choices_option(n) -> int:
    """OpenAI's n: how many choices (each its own sequence in the batch; a seed gives choice i seed + i)."""
    if n is None:
        return 1
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_CHOICES:
        raise RestError(400, f"n must be an integer from 1 to {MAX_CHOICES} (choices per request), got {n!r}")
    return n


async def chat_completion(server, request: Request):
    """The endpoint: the request checked, then answered (ChatCompletion)."""
    loaded(server.lm, "language model")
    body = await json_body(request)
    check_model(body.get("model"), "lm", server, "chat")
    return await ChatCompletion(server, body).respond()


class ChatCompletion:
    """One request: its prompt in the batch (n times for n choices), its pieces gathered or streamed."""

    def __init__(self, server, body: dict):
        self.server, self.lm, self.engine = server, server.lm, server.engine
        self.messages = chat_messages(body.get("messages"))
        self.tools = chat_tools(body, self.lm.call_format)
        self.options = generation_options(body, self.tools.grammar)
        try:
            check_bias(self.options, self.lm.config.vocab_size)
        except UserError as e:
            raise RestError(400, str(e)) from None
        self.stream = bool(body.get("stream"))
        self.usage_chunk = bool((body.get("stream_options") or {}).get("include_usage"))
        self.model = self.lm.name
        self.id = new_id("chatcmpl")
        self.created = int(time.time())
        self.n = choices_option(body.get("n"))
        self.prompt_tokens = 0
        self.texts = [""] * self.n
        self.choices = Choices(self.server, self.options, self.n)

    async def respond(self):
        room = self.engine.prompt_room(self.options.max_tokens)
        if self.options.grammar is not None:
            await asyncio.to_thread(self.lm.prepare_grammars)
        try:  # as OpenAI's endpoint does: messages that do not fit are an error, none is left out
            ids = await asyncio.to_thread(self.lm.encode_chat_within, self.messages, room, False, self.tools.tools)
        except ContextLengthExceeded as e:
            raise RestError(
                400,
                f"{e}: shorten the messages or lower max_tokens (this server's context is "
                f"{self.engine.batcher.max_seq} tokens; up to max_tokens of them, at most half, are "
                "kept for the answer)",
                e.code,
            ) from None
        self.prompt_tokens = len(ids)
        pieces = self.choices.pieces(ids)
        if self.stream:
            return StreamingResponse(self.events(pieces), media_type="text/event-stream", headers=SSE)
        logprobs, finish = [[] for _ in range(self.n)], [None] * self.n
        async with contextlib.aclosing(pieces):
            async for i, text, end, entry in pieces:
                self.texts[i] += text
                logprobs[i] += [entry] if entry else []
                finish[i] = end or finish[i]
        answers = [CallAnswer(self.lm.call_format) if self.tools.calls else None for _ in range(self.n)]
        choices = [
            {
                "index": i,
                "message": a.message(self.texts[i]) if a else {"role": "assistant", "content": self.texts[i]},
                "finish_reason": a.finish_reason(finish[i]) if a else finish[i],
                "logprobs": self.logprobs(logprobs[i]),
            }
            for i, a in enumerate(answers)
        ]
        return JSONResponse(
            {
                "id": self.id,
                "object": "chat.completion",
                "created": self.created,
                "model": self.model,
                "choices": choices,
                "usage": self.usage(),
            },
            headers={"Cache-Control": "no-store"},
        )

    def logprobs(self, entries: list[dict]) -> dict | None:
        """choices[].logprobs, as OpenAI's: None unless asked for."""
        return None if self.options.logprobs is None else {"content": entries, "refusal": None}

    def usage(self) -> dict:
        done = self.choices.written()  # the tokens sampled (their text, re-encoded, may count otherwise)
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": done,
            "total_tokens": self.prompt_tokens + done,
        }

    def chunk(self, delta: dict, finish=None, entry: dict | None = None, index: int = 0) -> str:
        return sse(
            {
                "id": self.id,
                "object": "chat.completion.chunk",
                "created": self.created,
                "model": self.model,
                "choices": [
                    {
                        "index": index,
                        "delta": delta,
                        "finish_reason": finish,
                        "logprobs": self.logprobs([entry]) if entry else None,
                    }
                ],
            }
        )

    async def events(self, pieces):
        for i in range(self.n):
            yield self.chunk({"role": "assistant", "content": ""}, index=i)
        answers = [CallAnswer(self.lm.call_format) if self.tools.calls else None for _ in range(self.n)]
        async with contextlib.aclosing(pieces):
            try:
                async for i, text, finish, entry in pieces:
                    self.texts[i] += text
                    a = answers[i]
                    if a is None:
                        yield self.chunk({"content": text} if text else {}, finish, entry, i)
                        continue
                    for delta in a.deltas(text):
                        yield self.chunk(delta, None, entry, i)
                        entry = None
                    if finish or entry:
                        yield self.chunk({}, a.finish_reason(finish) if finish else None, entry, i)
            except Exception as e:  # noqa: BLE001 - the status is sent: the error goes as an event
                yield sse(
                    {
                        "error": {
                            "message": f"the completion failed: {e}",
                            "type": "server_error",
                            "code": "server_error",
                        }
                    }
                )
                return
        if self.usage_chunk:
            yield sse(
                {
                    "id": self.id,
                    "object": "chat.completion.chunk",
                    "created": self.created,
                    "model": self.model,
                    "choices": [],
                    "usage": self.usage(),
                }
            )
        yield sse("[DONE]")


class Choices:
    """The n choices of one request, each its own sequence in the engine's continuous batch (with a seed, choice i
    samples with seed + i), as their pieces come."""

    def __init__(self, server, options: GenerationOptions, n: int):
        self.server, self.lm, self.engine = server, server.lm, server.engine
        self.options, self.n = options, n
        self.requests = []  # each choice's request in the engine's batch, as it starts

    def written(self) -> int:
        """Tokens the choices' sequences have sampled so far (a stop token included, as Realtime's usage counts)."""
        return sum(r.count for r in self.requests)

    async def pieces(self, ids: list[int]):
        """(choice, text, finish_reason or None, logprobs entry or None) of the n choices as they come, each choice
        its own sequence in the batch (with a seed, choice i samples with seed + i); the first failure raises."""
        if self.n == 1:
            async with contextlib.aclosing(self.sequence(ids, self.options)) as pieces:
                async for text, finish, entry in pieces:
                    yield 0, text, finish, entry
            return
        q: asyncio.Queue = asyncio.Queue()

        async def run(i: int, options: GenerationOptions):
            try:
                async with contextlib.aclosing(self.sequence(ids, options)) as pieces:
                    async for text, finish, entry in pieces:
                        q.put_nowait((i, text, finish, entry))
            except Exception as e:  # noqa: BLE001 - handed to the consumer, which raises it
                q.put_nowait(e)

        seed = self.options.seed
        tasks = [
            asyncio.ensure_future(run(i, dataclasses.replace(self.options, seed=None if seed is None else seed + i)))
            for i in range(self.n)
        ]
        try:
            finished = 0
            while finished < self.n:
                item = await q.get()
                if isinstance(item, Exception):
                    raise item
                finished += item[2] is not None
                yield item
        finally:  # a consumer that stops (a client gone) stops every choice's sequence
            for t in tasks:
                t.cancel()

    def entry(self, piece) -> dict | None:
        """One token's logprobs entry (OpenAI's shape: token, logprob, bytes, top_logprobs), or None."""
        if piece.logprob is None:
            return None

        def one(token: int, logprob: float) -> dict:
            b = self.lm.tokenizer.token_bytes(token)
            return {"token": b.decode("utf-8", "replace"), "logprob": logprob, "bytes": list(b)}

        return {**one(piece.token, piece.logprob), "top_logprobs": [one(t, v) for t, v in piece.top]}

    async def sequence(self, ids: list[int], options: GenerationOptions):
        """(text, None, logprobs entry or None) per piece, then ("", finish_reason, None); the request leaves the
        batch if the consumer stops."""
        eng = self.engine
        req, q = eng.generate(ids, options)
        self.requests.append(req)
        finished = False
        try:
            while True:
                piece = await eng.wait(q.get(), self.server.options.stall_timeout, "lm")
                if isinstance(piece, Exception):
                    raise piece
                entry = self.entry(piece)
                if piece.text or entry:
                    yield piece.text, None, entry
                if piece.finish_reason is not None:
                    finished = True
                    yield "", FINISH.get(piece.finish_reason, "stop"), None
                    return
        finally:
            if not finished:
                eng.cancel_generation(req)
