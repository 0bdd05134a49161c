"""Tool calls without a model: the tools reach a chat template that knows tools as `tools` (transformers' convention;
Qwen2.5's template) and the system message of one that does not (SmolLM2's); a call's text is read back as its name
and its arguments' deltas, which add up to the arguments; tool_choice picks the grammar."""

from __future__ import annotations

import pytest
from lm_archs import QWEN25  # tests/lm_archs.py: chat templates written after the models' own

from speechrt.models.lm_text import ChatTemplate
from speechrt.pipelines.grammar import GrammarError
from speechrt.pipelines.tool_calls import CallReader, call_grammar, parse_choice, parse_tools, with_tools

SMOL = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
TOOLS = parse_tools(
    [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "The weather.",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
            },
        }
    ]
)
ASK = [{"role": "user", "content": "Weather in Paris?"}]


def test_tools_reach_the_template_or_the_system_message():
    msgs, extra = with_tools(ASK, TOOLS, QWEN25)
    text = ChatTemplate(QWEN25).render(msgs, **extra)
    assert "<tools>" in text and '"name": "get_weather"' in text and msgs == ASK
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    history = ASK + [{"role": "assistant", "content": None, "tool_calls": [call]}, {"role": "tool", "content": "Sun"}]
    msgs, extra = with_tools(history, TOOLS, SMOL)
    text = ChatTemplate(SMOL).render(msgs, **extra)
    assert extra == {} and msgs[0]["role"] == "system" and '"name": "get_weather"' in msgs[0]["content"]
    assert '{"name": "get_weather", "arguments": {"city": "Paris"}}' in text and "<|im_start|>tool\nSun" in text


def test_call_reader_splits_a_call_and_passes_text():
    r = CallReader()
    text = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
    deltas = [r.push(text[i : i + 5])[1] for i in range(0, len(text), 5)]
    assert r.name == "get_weather" and "".join(deltas) + r.rest() == '{"city": "Paris"}'
    assert r.finish() == ("get_weather", '{"city": "Paris"}')
    t = CallReader()
    assert t.push("  ") == ("", "") and t.push("It is sunny.") == ("  It is sunny.", "") and t.finish() is None


def test_choices_and_their_grammars():
    """(What the grammars accept, token by token with the embedded model: tests/streaming/test_tool_calls.py.)"""
    assert parse_choice(None, TOOLS) == "auto" and parse_choice(None, ()) == "none"
    with pytest.raises(GrammarError, match="not in tools") as e:
        parse_choice({"type": "function", "function": {"name": "x"}}, TOOLS)
    assert e.value.param == "tool_choice"
    assert call_grammar(TOOLS, "none") is None
    assert call_grammar(TOOLS, "required").kind == "tool_call"
    assert call_grammar(TOOLS, "auto").kind == "tool_call_or_text"
