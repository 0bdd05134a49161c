"""A response that calls a function: its output item becomes a function_call item (name, call_id, arguments), the
arguments go out as response.function_call_arguments.delta events while the model writes them, then .done; the
client runs the function and adds a function_call_output item, and its next response reads both."""

from __future__ import annotations

from . import events as E
from .protocol import new_id


class FunctionCall:
    """The function call of a Response (agent.py): run() while its reply writes the call, done() at the end."""

    def __init__(self, response):
        self.r = response

    async def run(self, reply) -> None:
        """The reply decided on a call: add the item, send its arguments as they come."""
        r, s = self.r, self.r.session
        item = r.item
        item.type, item.status = "function_call", "in_progress"
        item.call = {"name": reply.call.name or "", "call_id": new_id("call"), "arguments": ""}
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
