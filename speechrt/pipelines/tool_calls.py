"""Function calling with the language model: the tools checked, their grammar for a tool_choice, and the tools put
in the prompt (call_reader.py reads the calls back from what the model wrote).

A call is written as one JSON object, {"name": <tool>, "arguments": {...}}, constrained by the grammar (grammar.py)
so that the name is one of the tools and the arguments are valid against that tool's parameters schema; where the
chat template wraps calls in tags (Qwen2.5's, Qwen3's, Hermes': `<tool_call>\n{...}\n</tool_call>`), in those tags
(CallFormat). Parallel calls (parallel_tool_calls) are several such calls, one per line, until the model stops. A chat
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


@dataclass(frozen=True)
class CallFormat:
    """How the model writes a call: `open` + the call's JSON + `close`; parallel calls joined by `sep`."""

    open: str = ""
    close: str = ""
    sep: str = "\n"

    @property
    def first(self) -> str:
        """The first character of any answer that calls (a text answer starts with another)."""
        return (self.open or "{")[0]


BARE = CallFormat()
TAGGED = CallFormat("<tool_call>\n", "\n</tool_call>")  # Qwen2.5's, Qwen3's, Hermes' templates
MAX_CALLS = 8  # calls in one answer with parallel_tool_calls: a model that repeats a call stops there


def call_format(template_source: str | None) -> CallFormat:
    """The calls' form that a chat template expects: TAGGED where it writes `<tool_call>` tags, else BARE."""
    return TAGGED if template_source and "<tool_call>" in template_source else BARE


def call_grammar(
    tools: tuple[Tool, ...], choice: str, parallel: bool = False, fmt: CallFormat = BARE
) -> Grammar | None:
    """The grammar of the model's answer: None for 'none' (free text); for 'required' a call of any of the tools,
    for a name a call of that one, for 'auto' either a call or a plain text answer (one that does not start
    as a call does). `parallel`: up to MAX_CALLS calls, joined by fmt.sep, until the model stops (with 'auto' and
    'required'; a named tool_choice is one call of that tool, whatever `parallel` says); `fmt`: the calls' form
    (the chat template's, call_format)."""
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
    call = " ".join(
        [json.dumps(fmt.open)] * bool(fmt.open)
        + ["%json " + json.dumps(json_grammar(schema))]
        + [json.dumps(fmt.close)] * bool(fmt.close)
    )
    more = f" ({json.dumps(fmt.sep)} call){{0,{MAX_CALLS - 1}}}" if parallel and choice in ("auto", "required") else ""
    rules = f"calls: call{more}\ncall: {call}"
    if choice != "auto":
        return Grammar.lark(f"start: calls\n{rules}", "tool_call", "tools")
    text = f"[^{re.escape(fmt.first)}](.|\\n)*"
    return Grammar.lark(f"start: TEXT | calls\nTEXT: /{text}/\n{rules}", "tool_call_or_text", "tools")


def knows_tools(template_source: str | None) -> bool:
    """Does a chat template render `tools` itself (transformers passes them to it as `tools`)?"""
    return bool(template_source) and re.search(r"\btools\b", template_source) is not None


def with_tools(messages: list[dict], tools: tuple[Tool, ...], template_source: str | None) -> tuple[list[dict], dict]:
    """(messages, extra template variables) for a prompt with `tools`: given to a template that knows tools as
    `tools`; else written into the system message (TOOLS_PROMPT), and the calls in the conversation written as
    the JSON the model answers with (for a template that wants user and assistant in turn, _alternating)."""
    if knows_tools(template_source):  # the calls' arguments as objects, as transformers gives them (`| tojson`)
        messages = [
            {
                **m,
                "content": m.get("content") or "",
                "tool_calls": [{**c, "function": {**c["function"], "arguments": _args(c)}} for c in m["tool_calls"]],
            }
            if m.get("tool_calls")
            else m
            for m in messages
        ]
        return messages, ({"tools": [t.as_openai() for t in tools]} if tools else {})
    out = []
    for m in messages:
        calls = m.get("tool_calls")
        if calls:
            text = "\n".join(json.dumps({"name": c["function"]["name"], "arguments": _args(c)}) for c in calls)
            m = {"role": m["role"], "content": ((m.get("content") or "") + "\n" + text).strip()}
        out.append({k: v for k, v in m.items() if k in ("role", "content")})
    if template_source and "must alternate" in template_source:  # Gemma's, Mistral's: user / assistant turns only
        out = _alternating(out)
    if tools:
        sig = "\n".join(json.dumps(t.as_openai()["function"]) for t in tools)
        note = TOOLS_PROMPT.format(tools=sig)
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": out[0]["content"] + "\n\n" + note}
        else:
            out.insert(0, {"role": "system", "content": note})
    return out, {}


def _alternating(messages: list[dict]) -> list[dict]:
    """Messages for a template that wants user and assistant turns in turn: a function's output ('tool') is given as
    the user's turn, and turns of one role in a row (parallel calls, their outputs) are joined into one."""
    out: list[dict] = []
    for m in messages:
        role, text = m["role"], m.get("content") or ""
        if role == "tool":
            role, text = "user", f"Function output: {text}"
        if out and out[-1]["role"] == role and role != "system":
            out[-1] = {"role": role, "content": out[-1]["content"] + "\n" + text}
        else:
            out.append({"role": role, "content": text})
    return out


def _args(call: dict):
    a = call["function"].get("arguments")
    try:
        return json.loads(a) if isinstance(a, str) else a
    except ValueError:
        return a
