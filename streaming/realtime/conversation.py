"""A session's conversation: its items as dataclasses, serialized to the Realtime API's shapes only at the
edge (`to_api`), and the chat messages the language model reads from them."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from .protocol import ProtocolError, new_id, short

ROLES = ("user", "assistant", "system")
CALL_ITEMS = ("function_call_output", "function_call")  # (a client may add calls of its own, as OpenAI's API)


@dataclass
class Part:
    """One content part. Audio parts (input_audio, output_audio) carry a transcript (None until known);
    text parts (input_text, output_text) their text."""

    type: str
    text: str | None = None
    audio: str | None = field(default=None, repr=False)  # a client's input_audio (base64, as sent), until decoded

    @property
    def spoken(self) -> bool:
        return self.type in ("input_audio", "output_audio")

    def to_api(self) -> dict:
        return {"type": self.type, "transcript" if self.spoken else "text": self.text}

    def to_response_api(self) -> dict:
        """The part as response.content_part events show it ('audio' / 'text')."""
        return (
            {"type": "audio", "transcript": self.text or ""}
            if self.spoken
            else {"type": "text", "text": self.text or ""}
        )


@dataclass(eq=False)
class Item:
    """A message item. For an assistant's spoken answer, `spoken` records, as its audio went out, how
    much text had been said by each point of the audio: (audio end ms, transcript so far); `audio_ms` is
    how much audio was sent (or, after a truncation, played); for a user's audio item, how much it holds."""

    role: str
    parts: list[Part]
    id: str = field(default_factory=lambda: new_id("item"))
    status: str = "completed"
    spoken: list[tuple[int, str]] = field(default_factory=list)
    audio_ms: int = 0
    # a user audio item's final transcript: set once it is in (or failed); None where none is awaited
    transcribed: asyncio.Event | None = None
    # function calling (tools.py): type 'function_call' (the model's: name, call_id, arguments) or
    # 'function_call_output' (the client's: call_id, output); role and parts are unused then
    type: str = "message"
    call: dict = field(default_factory=dict)

    def text(self) -> str:
        if self.type != "message":  # (what it adds to the conversation's size)
            return self.call.get("arguments") or self.call.get("output") or ""
        return " ".join(p.text or "" for p in self.parts).strip()

    def to_api(self) -> dict:
        if self.type != "message":
            return {"id": self.id, "object": "realtime.item", "type": self.type, "status": self.status, **self.call}
        return {
            "id": self.id,
            "object": "realtime.item",
            "type": "message",
            "role": self.role,
            "status": self.status,
            "content": [p.to_api() for p in self.parts],
        }

    def truncate(self, content_index, audio_end_ms) -> None:
        """Keep what was said up to `audio_end_ms` of the item's audio (what the user heard)."""
        part = next((p for p in self.parts if p.type == "output_audio"), None)
        if self.role != "assistant" or part is None:
            raise ProtocolError("only assistant items with audio can be truncated", "invalid_value", "item_id")
        if isinstance(content_index, bool) or content_index != self.parts.index(part):
            raise ProtocolError(
                f"content_index must be {self.parts.index(part)} (the item's audio part), got {short(content_index)}",
                "invalid_value",
                "content_index",
            )
        if isinstance(audio_end_ms, bool) or not isinstance(audio_end_ms, int) or audio_end_ms < 0:
            raise ProtocolError("audio_end_ms must be a non-negative integer", "invalid_value", "audio_end_ms")
        if audio_end_ms > self.audio_ms:
            raise ProtocolError(
                f"audio_end_ms {audio_end_ms} is past the item's audio ({self.audio_ms} ms)",
                "invalid_value",
                "audio_end_ms",
            )
        part.text = next((upto for end, upto in reversed(self.spoken) if end <= audio_end_ms), "")
        self.audio_ms = audio_end_ms


def item_from_api(item, max_chars: int, audio: bool = False) -> Item:
    """A client's conversation.item.create payload -> Item (text messages of at most `max_chars`; with `audio`,
    user messages may hold input_audio parts too, their base64 kept in Part.audio), or ProtocolError."""
    if not isinstance(item, dict):
        raise ProtocolError("conversation.item.create needs an 'item' object", "missing_required_parameter", "item")
    if item.get("type", "message") not in ("message", *CALL_ITEMS):
        raise ProtocolError(
            f"item type {item.get('type')!r} is not supported; valid: message, {', '.join(CALL_ITEMS)}",
            "invalid_value",
            "item.type",
        )
    if item.get("type") in CALL_ITEMS:
        return call_item(item, max_chars)
    role = item.get("role")
    if role not in ROLES:
        raise ProtocolError(f"item.role must be user, assistant or system, got {role!r}", "invalid_value", "item.role")
    content = item.get("content")
    if not isinstance(content, list) or not content:
        raise ProtocolError("item.content must be a non-empty list of parts", "invalid_value", "item.content")
    texts, parts = [], []
    for part in content:
        if audio and role == "user" and isinstance(part, dict) and part.get("type") == "input_audio":
            parts.append(Part("input_audio", audio=part.get("audio")))  # decoded and checked by turns.item_audio
            continue
        if not isinstance(part, dict) or part.get("type") not in ("input_text", "text", "output_text"):
            valid = " or {'type': 'input_audio', 'audio': base64} (user items)" if audio else " (text items only)"
            raise ProtocolError(
                f"content parts must be {{'type': 'input_text', 'text': ...}}{valid}", "invalid_value", "item.content"
            )
        if not isinstance(part.get("text"), str):
            raise ProtocolError("a text part needs a string 'text'", "invalid_value", "item.content.text")
        texts.append(part["text"])
        parts.append(Part("output_text" if role == "assistant" else "input_text", part["text"]))
    chars = sum(len(t) for t in texts)
    if chars > max_chars:
        raise ProtocolError(
            f"the item's text has {chars} characters; this server takes at most {max_chars} per item",
            "invalid_value",
            "item.content",
        )
    item_id = item.get("id")
    if item_id is not None and (not isinstance(item_id, str) or not 0 < len(item_id) <= 64):
        raise ProtocolError("item.id must be a string of 1 to 64 characters", "invalid_value", "item.id")
    return Item(role, parts, id=item_id or new_id("item"))


def call_item(item: dict, max_chars: int) -> Item:
    """A client's function_call_output item (the result of a call: call_id, output) or function_call item
    (name, call_id, arguments) -> Item, or ProtocolError naming the field."""
    kind = item["type"]
    fields = ("call_id", "output") if kind == "function_call_output" else ("call_id", "name", "arguments")
    call = {}
    for f in fields:
        v = item.get(f, "" if f == "arguments" else None)
        if not isinstance(v, str) or (f in ("call_id", "name") and not v):
            raise ProtocolError(f"a {kind} item needs a string '{f}'", "invalid_value", f"item.{f}")
        call[f] = v
    size = len(call.get("output") or call.get("arguments") or "")
    if size > max_chars:
        raise ProtocolError(
            f"the item's {fields[-1]} has {size} characters; this server takes at most {max_chars} per item",
            "invalid_value",
            f"item.{fields[-1]}",
        )
    item_id = item.get("id")
    if item_id is not None and (not isinstance(item_id, str) or not 0 < len(item_id) <= 64):
        raise ProtocolError("item.id must be a string of 1 to 64 characters", "invalid_value", "item.id")
    role = "tool" if kind == "function_call_output" else "assistant"
    return Item(role, [], id=item_id or new_id("item"), type=kind, call=call)


def as_message(it: Item) -> dict | None:
    """An item as the language model's chat message (None: nothing to read): a call as the assistant's
    tool_calls, its output as a tool message."""
    if it.type == "function_call":
        fn = {"name": it.call["name"], "arguments": it.call["arguments"]}
        return {"role": "assistant", "content": "", "tool_calls": [{"id": it.call["call_id"], "function": fn}]}
    if it.type == "function_call_output":
        return {"role": "tool", "content": it.call["output"], "tool_call_id": it.call["call_id"]}
    text = it.text()
    return {"role": it.role, "content": text} if text else None


class Conversation:
    def __init__(self):
        self.items: list[Item] = []

    def check_room(self, item: Item, max_chars: int) -> None:
        """The conversation's text stays within `max_chars` with `item` added."""
        if sum(len(it.text()) for it in self.items) + len(item.text()) > max_chars:
            raise ProtocolError(
                f"the conversation would hold more than {max_chars} characters of text; delete older "
                "items (conversation.item.delete) first",
                "conversation_full",
                "item",
            )

    @property
    def last_id(self) -> str | None:
        return self.items[-1].id if self.items else None

    def append(self, item: Item) -> str | None:
        """Add `item` at the end -> the id of the item before it."""
        prev = self.last_id
        self.items.append(item)
        return prev

    def find(self, item_id) -> Item:
        for it in self.items:
            if it.id == item_id:
                return it
        raise ProtocolError(f"no conversation item with id {item_id!r}", "item_not_found", "item_id")

    def check_previous(self, previous_item_id) -> None:
        """Items are appended at the end: `previous_item_id` must be the last item (or absent, or 'root')."""
        if previous_item_id in (None, "root") or previous_item_id == self.last_id:
            return
        self.find(previous_item_id)
        raise ProtocolError(
            "items can only be appended at the end of the conversation", "invalid_value", "previous_item_id"
        )

    def delete(self, item_id) -> Item:
        it = self.find(item_id)
        self.items.remove(it)
        return it

    async def transcribed(self, upto: Item | None = None) -> None:
        """Wait for the final transcripts of the audio items before `upto` (all, if None) still being made: a
        response asked for right after a commit answers what was said (push to talk)."""
        for it in self.items:
            if it is upto:
                break
            if it.transcribed is not None:
                await it.transcribed.wait()

    def messages(self, instructions: str, upto: Item | None = None) -> list[dict]:
        """The items before `upto` (all, if None) as chat messages for the language model."""
        msgs = [{"role": "system", "content": instructions}] if instructions else []
        for it in self.items:
            if it is upto:
                break
            m = as_message(it)
            if m is not None:
                msgs.append(m)
        return msgs
