"""Tool calls in prompts and back: the tools reach a chat template that knows tools as `tools` (transformers'
convention; Qwen2.5's template) and the system message of one that does not (SmolLM2's); calls' text (bare JSON, or
in the <tool_call> tags of the templates that ask for them; one call or several) is read back as names and
arguments' deltas, which add up to the arguments; tool_choice picks the grammar; a tiny random Qwen2 model with
Qwen2.5's own template writes tagged calls whose arguments validate, one or several."""

from __future__ import annotations

import json

import pytest
from lm_archs import QWEN25  # tests/lm_archs.py: chat templates written after the models' own

from speechrt.models.chat_templates import GEMMA3
from speechrt.models.lm_text import ChatTemplate
from speechrt.pipelines.call_reader import CallReader
from speechrt.pipelines.grammar import GrammarError
from speechrt.pipelines.tool_calls import BARE, TAGGED, call_format, call_grammar, parse_choice, parse_tools, with_tools

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
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    history = ASK + [{"role": "assistant", "content": None, "tool_calls": [call]}, {"role": "tool", "content": "Sun"}]
    msgs, extra = with_tools(history, TOOLS, QWEN25)
    text = ChatTemplate(QWEN25).render(msgs, **extra)
    assert "<tools>" in text and '"name": "get_weather"' in text and msgs[0] == ASK[0]
    # the call as the model writes it (arguments an object, not JSON text in a string), in Qwen2.5's tags
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in text
    assert call_format(QWEN25) == TAGGED and call_format(SMOL) == BARE and call_format(None) == BARE
    msgs, extra = with_tools(history, TOOLS, SMOL)
    text = ChatTemplate(SMOL).render(msgs, **extra)
    assert extra == {} and msgs[0]["role"] == "system" and '"name": "get_weather"' in msgs[0]["content"]
    assert '{"name": "get_weather", "arguments": {"city": "Paris"}}' in text and "<|im_start|>tool\nSun" in text
    # Gemma 3's template wants user and model turns in turn: parallel calls are one model turn, their outputs the
    # user's next (it raised "Conversation roles must alternate" on the tool messages before)
    two = {**call, "id": "c2", "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}
    history = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "assistant", "content": None, "tool_calls": [two]},
        {"role": "tool", "content": "Sun"},
        {"role": "tool", "content": "Rain"},
    ]
    msgs, extra = with_tools(history, TOOLS, GEMMA3)
    text = ChatTemplate(GEMMA3).render(msgs, add_generation_prompt=True, **extra)
    assert '"arguments": {"city": "Paris"}}\n{"name": "get_weather", "arguments": {"city": "Rome"}}' in text
    assert "Function output: Sun\nFunction output: Rain<end_of_turn>" in text


@pytest.mark.parametrize("fmt", [BARE, TAGGED], ids=["bare", "tagged"])
def test_call_reader_splits_calls_and_passes_text(fmt):
    calls = [("get_weather", '{"city": "P}a\\"ris", "days": [1, {"n": 2}]}'), ("get_time", "{}")]
    text = fmt.sep.join(f'{fmt.open}{{"name": "{n}", "arguments": {a}}}{fmt.close}' for n, a in calls)
    for step in (1, 5, len(text)):  # character by character, in pieces, whole
        r = CallReader(fmt)
        got: dict[int, list[str]] = {}
        for i in range(0, len(text), step):
            content, news = r.push(text[i : i + step])
            assert content == ""
            for k, name, delta in news:
                assert (name is not None) == (k not in got)  # a call's name comes with its first news, once
                got.setdefault(k, [name, ""])[1] += delta
        assert r.finish() == calls and [tuple(v) for _, v in sorted(got.items())] == calls
    cut = CallReader(fmt)  # cut short by max_tokens: what was written
    cut.push(text[: text.index("P}a") + 2])
    assert cut.finish() == [("get_weather", '{"city": "P}')]
    t = CallReader(fmt)
    assert t.push("  ") == ("", []) and t.push("It is sunny.") == ("  It is sunny.", []) and t.finish() is None


def test_choices_and_their_grammars():
    """(What the grammars accept, token by token with the embedded model: tests/streaming/test_tool_calls.py.)"""
    assert parse_choice(None, TOOLS) == "auto" and parse_choice(None, ()) == "none"
    with pytest.raises(GrammarError, match="not in tools") as e:
        parse_choice({"type": "function", "function": {"name": "x"}}, TOOLS)
    assert e.value.param == "tool_choice"
    assert call_grammar(TOOLS, "none") is None
    assert call_grammar(TOOLS, "required").kind == "tool_call"
    assert call_grammar(TOOLS, "auto").kind == "tool_call_or_text"
    assert call_grammar(TOOLS, "required", parallel=True, fmt=TAGGED).kind == "tool_call"


WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 4}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def qwen2(tmp_path_factory):
    """A tiny random Qwen2 model (tests/lm_archs.py) in a Hugging Face folder with Qwen2.5's own chat template."""
    import torch
    from lm_archs import byte_bpe, hf_model, save_hf

    from speechrt.backends.torch import lm as torch_lm
    from speechrt.models import registry
    from speechrt.pipelines.lm import LMPipeline

    model = hf_model("qwen2")
    model.config.max_position_embeddings = 1024  # Qwen2.5's tools prompt is ~700 tokens of the tiny vocabulary
    d = save_hf(tmp_path_factory.mktemp("qwen2"), "qwen2", model, byte_bpe())
    return LMPipeline(torch_lm.build(registry.resolve(str(d), "lm"), torch.device("cpu"), "float32"))


@pytest.mark.parametrize("parallel", [False, True], ids=["one", "parallel"])
def test_qwen2_writes_tagged_calls_that_validate(qwen2, parallel, one_cpu_thread):
    """The format comes from the model's own template; the grammar holds random weights to it: `<tool_call>` tags
    around each call, arguments valid against the schema; one call, or with parallel calls one or more."""
    jsonschema = pytest.importorskip("jsonschema")
    tools = parse_tools([{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}])
    assert qwen2.call_format == TAGGED
    ids = qwen2.encode_chat(ASK, tools=tools)
    assert "<tool_call>" in qwen2.tokenizer.decode(ids)  # the template's own instructions
    g = call_grammar(tools, "required", parallel, qwen2.call_format)
    text = "".join(qwen2.stream_ids(ids, max_tokens=160, temperature=1.0, seed=int(parallel), grammar=g))
    assert text.startswith("<tool_call>\n") and text.endswith("\n</tool_call>"), text
    r = CallReader(qwen2.call_format)
    r.push(text)
    calls = r.finish()
    assert parallel or len(calls) == 1
    for name, args in calls:
        assert name == "get_weather"
        jsonschema.validate(json.loads(args), WEATHER)
