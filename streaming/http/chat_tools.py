"""Tools and structured output of a chat completion: the request's tools, tool_choice, parallel_tool_calls and
response_format checked into the grammar its answer follows, and an answer that calls tools in OpenAI's message and
chunk shapes."""

from __future__ import annotations

from dataclasses import dataclass

from speechrt.pipelines.call_reader import CallReader
from speechrt.pipelines.grammar import Grammar, GrammarError
from speechrt.pipelines.tool_calls import BARE, CallFormat, Tool, call_grammar, parse_choice, parse_tools

from ..realtime.protocol import new_id
from .endpoint import RestError

FORMATS = ("text", "json_object", "json_schema")


@dataclass(frozen=True)
class ChatTools:
    tools: tuple[Tool, ...]  # in the prompt (also with tool_choice 'none': the model may read about them)
    grammar: Grammar | None  # what the answer follows: a call (or text), a JSON schema, any JSON object; None: text

    @property
    def calls(self) -> bool:
        """May the answer be a tool call?"""
        return self.grammar is not None and self.grammar.kind.startswith("tool_call")


def chat_tools(body: dict, fmt: CallFormat = BARE) -> ChatTools:
    """The request's tools, tool_choice, parallel_tool_calls (OpenAI's default: true) and response_format ->
    ChatTools, the calls in `fmt` (the model's chat template's form); a RestError naming the field if wrong."""
    if body.get("functions"):
        raise RestError(
            400,
            "functions (deprecated) is not supported; give them as tools: [{'type': 'function', ...}]",
            param="functions",
        )
    try:
        tools = parse_tools(body.get("tools"))
        choice = parse_choice(body.get("tool_choice"), tools)
        parallel = body.get("parallel_tool_calls", True)
        if not isinstance(parallel, bool):
            raise GrammarError(f"parallel_tool_calls must be true or false, got {parallel!r}", "parallel_tool_calls")
        calls = call_grammar(tools, choice, parallel, fmt)
        fmt = format_grammar(body.get("response_format"))
    except GrammarError as e:
        raise RestError(400, str(e), param=e.param) from None
    if calls is not None and fmt is not None:
        raise RestError(
            400,
            "response_format json_object / json_schema cannot be combined with tools that may be called: "
            "give tool_choice 'none', or leave response_format out",
            param="response_format",
        )
    return ChatTools(tools, calls or fmt)


def format_grammar(fmt) -> Grammar | None:
    """OpenAI's response_format: text (None), json_object (any JSON object) or json_schema (its schema)."""
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind not in FORMATS:
        raise GrammarError(
            f"response_format must be {{'type': one of {', '.join(FORMATS)}}}, got {fmt!r}", "response_format.type"
        )
    if kind == "text":
        return None
    if kind == "json_object":
        return Grammar.json_object()
    spec = fmt.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        raise GrammarError(
            "response_format.json_schema must be {'name': ..., 'schema': {...}, 'strict': ...}",
            "response_format.json_schema",
        )
    schema = spec.get("schema", {"type": "object"})
    return Grammar.json_schema(schema, "response_format.json_schema.schema")


class CallAnswer:
    """One choice's answer under a tool grammar: text deltas pass through; calls become tool_calls deltas (each
    call's first with its index, id and name, then its arguments as they are written)."""

    def __init__(self, fmt: CallFormat = BARE):
        self.reader = CallReader(fmt)
        self.ids: list[str] = []  # of the calls begun

    def deltas(self, text: str) -> list[dict]:
        """The chunk deltas for new text (none while it is undecided)."""
        content, news = self.reader.push(text)
        if content:
            return [{"content": content}]
        out = []
        for i, name, args in news:
            if name is not None:
                self.ids.append(new_id("call"))
                fn = {"name": name, "arguments": ""}
                out.append({"tool_calls": [{"index": i, "id": self.ids[i], "type": "function", "function": fn}]})
            if args:
                out.append({"tool_calls": [{"index": i, "function": {"arguments": args}}]})
        return out

    def message(self, text: str) -> dict:
        """The whole answer's message (text: all it wrote; on an answer that was not given deltas)."""
        self.reader.push(text)
        calls = self.reader.finish()
        if calls is None:
            return {"role": "assistant", "content": text}
        tool_calls = [
            {"id": new_id("call"), "type": "function", "function": {"name": name, "arguments": args}}
            for name, args in calls
        ]
        return {"role": "assistant", "content": None, "tool_calls": tool_calls}

    def finish_reason(self, reason: str) -> str:
        """OpenAI's 'tool_calls' for calls that were written whole."""
        return "tool_calls" if self.reader.is_call and reason == "stop" else reason
