"""A response that calls a function: its output item becomes a function_call item (name, call_id, arguments), the
arguments go out as response.function_call_arguments.delta events while the model writes them, then .done; the
client runs the function and adds a function_call_output item, and its next response reads both."""

from __future__ import annotations

import asyncio

from speechrt.pipelines.tool_calls import CallReader

from . import events as E
from .protocol import new_id


class CallOrText:
    """What a reply that may call a function (reply.Reply.call) writes: read as a call or a text answer, and
    `decision()` says which as soon as that is known (a call: once its name is written)."""

    def __init__(self):
        self.reader = CallReader()
        self._decided: asyncio.Future = asyncio.get_running_loop().create_future()
        # a reply nobody waits on (a speculative one, dropped) may fail: its exception is not "never retrieved"
        self._decided.add_done_callback(lambda f: f.cancelled() or f.exception())

    async def decision(self) -> str:
        """'call' or 'text': then the reply's `texts()` gives the call's arguments as they are written, or the
        text answer (for audio replies, `segments()`)."""
        return await self._decided

    def decide(self, kind: str | BaseException) -> None:
        if not self._decided.done():
            if isinstance(kind, asyncio.CancelledError):
                self._decided.cancel()
            elif isinstance(kind, BaseException):
                self._decided.set_exception(kind)
            else:
                self._decided.set_result(kind)

    async def split(self, pieces, out: asyncio.Queue):
        """Read the first text pieces until they show a call or a text answer -> the text pieces (None for a call,
        whose arguments' text is put on `out` as it comes)."""
        r = self.reader
        async for text in pieces:
            content, args = r.push(text)
            if r.is_call is False:
                self.decide("text")
                return _chain(content, pieces)
            if r.name is not None:
                self.decide("call")
                if args:
                    out.put_nowait(args)
        if r.is_call is None:  # the model wrote nothing: an empty text answer
            self.decide("text")
            return _chain("", pieces)
        self.decide("call")  # (a call cut short before its name is incomplete)
        if r.rest():
            out.put_nowait(r.rest())
        return None


async def _chain(first: str, rest):
    if first:
        yield first
    async for text in rest:
        yield text


class FunctionCall:
    """The function call of a Response (agent.py): run() while its reply writes the call, done() at the end."""

    def __init__(self, response):
        self.r = response

    async def run(self, reply) -> None:
        """The reply decided on a call: add the item, send its arguments as they come."""
        r, s = self.r, self.r.session
        item = r.item
        item.type, item.status = "function_call", "in_progress"
        item.call = {"name": reply.call.reader.name or "", "call_id": new_id("call"), "arguments": ""}
        await s.send(E.output_item_added(r.id, item.to_api()))
        if not r.options.out_of_band:
            await s.send(E.item_added(item.to_api(), r.prev))
        async for delta in reply.texts():
            if r.status != "in_progress":
                return
            item.call["arguments"] += delta
            await s.send(E.function_call_arguments_delta(r.id, item.id, item.call["call_id"], delta))
        if reply.finish_reason == "length" and r.status == "in_progress":
            r.status, r.reason = "incomplete", "max_output_tokens"
        if r.status == "in_progress":
            r.status = "completed"

    async def done(self) -> None:
        """The call is over (written whole, cut short or cancelled): its arguments, item and the response done."""
        r, s = self.r, self.r.session
        item = r.item
        item.status = "completed" if r.status == "completed" else "incomplete"
        c = item.call
        await s.send(E.function_call_arguments_done(r.id, item.id, c["call_id"], c["name"], c["arguments"]))
        await s.send(E.output_item_done(r.id, item.to_api()))
        if not r.options.out_of_band:
            await s.send(E.item_done(item.to_api()))
        await s.send(E.response_done({**r.api(r.status, [item.to_api()]), "usage": r.usage()}))
