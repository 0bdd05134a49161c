"""A response that calls functions: each call becomes a function_call item (name, call_id, arguments; several calls
in one answer are several items, output_index 0, 1, ...), the arguments go out as
response.function_call_arguments.delta events while the model writes them, then .done; the client runs the functions
and adds function_call_output items, and its next response reads them."""

from __future__ import annotations

import asyncio

from speechrt.pipelines.call_reader import CallReader
from speechrt.pipelines.tool_calls import BARE, CallFormat

from . import events as E
from .conversation import Item
from .protocol import new_id


class CallOrText:
    """What a reply that may call a function (reply.Reply.call) writes: read as calls or a text answer, and
    `decision()` says which as soon as that is known (calls: once the first one's name is written)."""

    def __init__(self, fmt: CallFormat = BARE):
        self.reader = CallReader(fmt)
        self._decided: asyncio.Future = asyncio.get_running_loop().create_future()
        # a reply nobody waits on (a speculative one, dropped) may fail: its exception is not "never retrieved"
        self._decided.add_done_callback(lambda f: f.cancelled() or f.exception())

    async def decision(self) -> str:
        """'call' or 'text': then the reply's `texts()` gives the calls' news (index, name when new, arguments'
        new text) as they are written, or the text answer (for audio replies, `segments()`)."""
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
        """Read the first text pieces until they show calls or a text answer -> the text pieces (None for calls,
        whose news, CallReader.push's, are put on `out` as they come)."""
        r = self.reader
        async for text in pieces:
            content, news = r.push(text)
            if r.is_call is False:
                self.decide("text")
                return _chain(content, pieces)
            if r.calls:
                self.decide("call")
                for n in news:
                    out.put_nowait(n)
        if r.is_call is None:  # the model wrote nothing: an empty text answer
            self.decide("text")
            return _chain("", pieces)
        self.decide("call")  # (a call cut short before its name is incomplete)
        return None


async def _chain(first: str, rest):
    if first:
        yield first
    async for text in rest:
        yield text


class FunctionCall:
    """The function calls of a Response (agent.py): run() while its reply writes them, done() at the end. The first
    call is the response's own item; each further one is a new item after it."""

    def __init__(self, response):
        self.r = response
        self.items: list[Item] = []

    async def run(self, reply) -> None:
        """The reply decided on calls: add their items, send their arguments as they come."""
        r = self.r
        await self._begin(r.item, reply.call.reader.name or "", r.prev)
        async for i, name, delta in reply.texts():
            if r.status != "in_progress":
                return
            if i == len(self.items):
                item = Item("assistant", [], status="in_progress")
                prev = None if r.options.out_of_band else r.session.conversation.append(item)
                await self._begin(item, name or "", prev)
            item = self.items[i]
            if delta:
                item.call["arguments"] += delta
                await r.session.send(E.function_call_arguments_delta(r.id, item.id, item.call["call_id"], delta, i))
        if reply.finish_reason == "length" and r.status == "in_progress":
            r.status, r.reason = "incomplete", "max_output_tokens"
        if r.status == "in_progress":
            r.status = "completed"

    async def _begin(self, item: Item, name: str, prev: str | None) -> None:
        """A call's item made a function_call and added (output_index: its place among the calls)."""
        r, s = self.r, self.r.session
        item.type, item.status = "function_call", "in_progress"
        item.call = {"name": name, "call_id": new_id("call"), "arguments": ""}
        self.items.append(item)
        await s.send(E.output_item_added(r.id, item.to_api(), len(self.items) - 1))
        if not r.options.out_of_band:
            await s.send(E.item_added(item.to_api(), prev))

    async def done(self) -> None:
        """The calls are over (written whole, cut short or cancelled): their arguments, items and the response
        done."""
        r, s = self.r, self.r.session
        for i, item in enumerate(self.items):
            item.status = "completed" if r.status == "completed" else "incomplete"
            c = item.call
            await s.send(E.function_call_arguments_done(r.id, item.id, c["call_id"], c["name"], c["arguments"], i))
            await s.send(E.output_item_done(r.id, item.to_api(), i))
            if not r.options.out_of_band:
                await s.send(E.item_done(item.to_api()))
        output = [item.to_api() for item in self.items]
        await s.send(E.response_done({**r.api(r.status, output), "usage": r.usage()}))
