"""A Realtime session's function calling: `tools` and `tool_choice` (of session.update and response.create) checked,
their wire form, and the grammar a response with them follows (cached: a session asks for the same one each turn)."""

from __future__ import annotations

import functools

from speechrt.pipelines.grammar import Grammar, GrammarError
from speechrt.pipelines.tool_calls import BARE, CallFormat, Tool, call_grammar, parse_choice, parse_tools

from .protocol import ProtocolError


def tool_settings(obj: dict, name: str, tools: tuple[Tool, ...], choice: str) -> tuple[tuple[Tool, ...], str]:
    """`obj`'s tools and tool_choice (`name`: 'session' or 'response'), over the current ones -> (tools, choice),
    or a ProtocolError naming the field."""
    try:
        if "tools" in obj:
            tools = parse_tools(obj["tools"], f"{name}.tools", flat=True)
        if obj.get("tool_choice") is not None:
            choice = parse_choice(obj["tool_choice"], tools, f"{name}.tool_choice", flat=True)
        elif choice not in ("auto", "none", "required") and choice not in (t.name for t in tools):
            choice = "auto"  # the function it named is no longer among the tools
    except GrammarError as e:
        raise ProtocolError(str(e), "invalid_value", e.param) from None
    return tools, choice


def tools_api(tools: tuple[Tool, ...], choice: str) -> dict:
    """The session's tools and tool_choice as session.updated shows them."""
    flat = [
        {"type": "function", "name": t.name, "description": t.description, "parameters": t.parameters} for t in tools
    ]
    named = choice not in ("auto", "none", "required")
    return {"tools": flat, "tool_choice": {"type": "function", "name": choice} if named else choice}


@functools.lru_cache(maxsize=64)
def grammar(tools: tuple[Tool, ...], choice: str, fmt: CallFormat = BARE) -> Grammar | None:
    """What a response with these tools writes: None (text), calls (one or more, in parallel as OpenAI's Realtime
    models may write them), or calls or text (tool_calls.call_grammar); `fmt`: the model's form of a call."""
    return call_grammar(tools, choice, True, fmt)
