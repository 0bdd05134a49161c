"""Function calling with the language model: the tools checked, their grammar for a tool_choice, the tools put
in the prompt, and a call read back from what the model wrote.

A call is written as one JSON object, {"name": <tool>, "arguments": {...}}, constrained by the grammar (grammar.py)
so that the name is one of the tools and the arguments are valid against that tool's parameters schema. A chat
template that knows tools (its source uses `tools`) gets them as transformers' apply_chat_template passes them;
one that does not (SmolLM2's) gets them in the system message, as the Hugging Face convention for such templates
writes them (see TOOLS_PROMPT), and calls already made in the conversation as that JSON in the assistant's turn.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from .grammar import Grammar, GrammarError, json_grammar

CHOICES = ("auto", "none", "required")
NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI's rule for a function's name
TOOLS_PROMPT = (
    "You may call one of the following functions to answer the user. Their signatures, as JSON:\n{tools}\n\n"
    'To call a function, answer with only a JSON object: {{"name": <function name>, "arguments": '
    "<the arguments as a JSON object>}}."
)


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters_json: str  # the parameters' JSON schema (as text: the dataclass stays hashable)

    @property
    def parameters(self) -> dict:
        return json.loads(self.parameters_json)

    def as_openai(self) -> dict:
        """The chat completions shape, as chat templates that know tools read it."""
        fn = {"name": self.name, "description": self.description, "parameters": self.parameters}
        return {"type": "function", "function": fn}


def parse_tools(raw, param: str = "tools", flat: bool = False) -> tuple[Tool, ...]:
    """OpenAI's tool list -> Tools. `flat`: the Realtime shape ({'type': 'function', 'name', 'parameters', ...});
    else chat completions' ({'type': 'function', 'function': {...}}). GrammarError naming the field if wrong
    (a schema llguidance cannot follow included)."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise GrammarError(f"{param} must be a list of function tools, got {type(raw).__name__}", param)
    out = []
    for i, t in enumerate(raw):
        p = f"{param}[{i}]"
        fn = t if flat else (t.get("function") if isinstance(t, dict) else None)
        if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(fn, dict):
            shape = (
                "{'type': 'function', 'name': ..., 'parameters': {...}}"
                if flat
                else ("{'type': 'function', 'function': {'name': ..., 'parameters': {...}}}")
            )
            raise GrammarError(f"{p} must be a function tool: {shape}", p)
        fp = p if flat else f"{p}.function"
        name = fn.get("name")
        if not isinstance(name, str) or not NAME.match(name):
            raise GrammarError(f"{fp}.name must be 1-64 letters, digits, '_' or '-', got {name!r}", f"{fp}.name")
        if name in (o.name for o in out):
            raise GrammarError(f"{fp}.name {name!r} is given twice; tool names must differ", f"{fp}.name")
        params = fn.get("parameters")
        params = {"type": "object", "properties": {}} if params is None else params
        Grammar.json_schema(params, f"{fp}.parameters")  # a schema the engine cannot follow fails here, named
        desc = fn.get("description") or ""
        if not isinstance(desc, str):
            raise GrammarError(f"{fp}.description must be a string", f"{fp}.description")
        out.append(Tool(name, desc, json.dumps(params)))
    return tuple(out)


def parse_choice(raw, tools: tuple[Tool, ...], param: str = "tool_choice", flat: bool = False) -> str:
    """OpenAI's tool_choice -> 'auto', 'none', 'required' or the name of the one tool to call. Default (None):
    'auto' with tools, 'none' without."""
    if raw is None:
        return "auto" if tools else "none"
    if isinstance(raw, str):
        if raw not in CHOICES:
            raise GrammarError(f"{param} must be one of {', '.join(CHOICES)} or a function, got {raw!r}", param)
        if raw == "required" and not tools:
            raise GrammarError(f"{param} 'required' needs tools; none are given", param)
        return raw
    fn = raw if flat else (raw.get("function") if isinstance(raw, dict) else None)
    if not isinstance(raw, dict) or raw.get("type") != "function" or not isinstance(fn, dict):
        shape = "{'type': 'function', 'name': ...}" if flat else "{'type': 'function', 'function': {'name': ...}}"
        raise GrammarError(f"{param} must be one of {', '.join(CHOICES)} or {shape}, got {raw!r}", param)
    name = fn.get("name")
    names = [t.name for t in tools]
    if name not in names:
        valid = ", ".join(names) if names else "none are given"
        raise GrammarError(f"{param} names the function {name!r}, which is not in tools (valid: {valid})", param)
    return name


def call_grammar(tools: tuple[Tool, ...], choice: str) -> Grammar | None:
    """The grammar of the model's answer: None for 'none' (free text); for 'required' a call of any of the tools,
    for a name a call of that one, for 'auto' either a call or a plain text answer (one that does not start
    with '{')."""
    if choice == "none" or not tools:
        return None
    chosen = [t for t in tools if choice in ("auto", "required") or t.name == choice]
    calls = [
        {
            "type": "object",
            "properties": {"name": {"const": t.name}, "arguments": t.parameters},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for t in chosen
    ]
    schema = calls[0] if len(calls) == 1 else {"anyOf": calls}
    if choice != "auto":
        return Grammar.json_schema(schema, "tools", kind="tool_call")
    lark = "start: TEXT | call\nTEXT: /[^{](.|\\n)*/\ncall: %json " + json.dumps(json_grammar(schema))
    return Grammar.lark(lark, "tool_call_or_text", "tools")


def knows_tools(template_source: str | None) -> bool:
    """Does a chat template render `tools` itself (transformers passes them to it as `tools`)?"""
    return bool(template_source) and re.search(r"\btools\b", template_source) is not None


def with_tools(messages: list[dict], tools: tuple[Tool, ...], template_source: str | None) -> tuple[list[dict], dict]:
    """(messages, extra template variables) for a prompt with `tools`: given to a template that knows tools as
    `tools`; else written into the system message (TOOLS_PROMPT), and the calls in the conversation written as
    the JSON the model answers with."""
    if knows_tools(template_source):
        return messages, ({"tools": [t.as_openai() for t in tools]} if tools else {})
    out = []
    for m in messages:
        calls = m.get("tool_calls")
        if calls:
            text = "\n".join(json.dumps({"name": c["function"]["name"], "arguments": _args(c)}) for c in calls)
            m = {"role": m["role"], "content": ((m.get("content") or "") + "\n" + text).strip()}
        out.append({k: v for k, v in m.items() if k in ("role", "content")})
    if tools:
        sig = "\n".join(json.dumps(t.as_openai()["function"]) for t in tools)
        note = TOOLS_PROMPT.format(tools=sig)
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": out[0]["content"] + "\n\n" + note}
        else:
            out.insert(0, {"role": "system", "content": note})
    return out, {}


def _args(call: dict):
    a = call["function"].get("arguments")
    try:
        return json.loads(a) if isinstance(a, str) else a
    except ValueError:
        return a


class CallReader:
    """Reads what a sequence writes under a tool grammar: whether it is a call (its first character is '{') or a
    text answer, the call's name as soon as it is written, and its arguments' text as it grows."""

    HEAD = re.compile(r'^\{"name": "([^"]*)", "arguments": ')  # the grammar's JSON style writes exactly this

    def __init__(self):
        self.buf = ""
        self.is_call: bool | None = None  # None until the first character that is not whitespace
        self.name: str | None = None
        self.sent = 0  # characters of the arguments handed out by push

    def push(self, text: str) -> tuple[str, str]:
        """New text -> (text of a text answer, new text of the call's arguments); one of them is empty."""
        self.buf += text
        if self.is_call is None:
            head = self.buf.lstrip()
            if not head:
                return "", ""
            self.is_call = head.startswith("{")
            self.buf = head if self.is_call else self.buf
            if not self.is_call:
                return self.buf, ""
        if not self.is_call:
            return text, ""
        if self.name is None:
            m = self.HEAD.match(self.buf)
            if m is None:
                return "", ""
            self.name, self.start = m.group(1), m.end()
        end = len(self.buf) - 1  # the last character may be the object's closing brace: held back
        delta = self.buf[self.start + self.sent : end] if end > self.start + self.sent else ""
        self.sent += len(delta)
        return "", delta

    def finish(self) -> tuple[str, str] | None:
        """The call (name, arguments as JSON text) once the sequence ended, or None for a text answer. A call cut
        short (max_tokens) gives what was written (the finish reason says 'length')."""
        if not self.is_call:
            return None
        if self.name is None:
            return "", ""
        return self.name, self.buf[self.start : self._end()]

    def rest(self) -> str:
        """The arguments' text that push held back (after the sequence ended)."""
        return "" if self.name is None else self.buf[self.start + self.sent : self._end()]

    def _end(self) -> int:
        """Where the arguments end: before the object's closing brace, if it was written."""
        end = len(self.buf.rstrip())
        try:
            json.loads(self.buf)
            return end - 1
        except ValueError:
            return end
