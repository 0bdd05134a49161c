"""Conversation sessions (ASR -> language model -> TTS) over loopback with real clients and the
embedded models: the official openai SDK, our SDK, text responses, cancel and barge-in."""

from __future__ import annotations

import asyncio
import base64
import json

import numpy as np
import pytest

from speechrt.models.wer import wer

# The spoken question: tiny.en hears the embedded voice's "France" as "friends" in 12 of 36 decodes (6 noise
# seeds x 2 context margins x 3 cut points, the server's trimmed-context options); "Japan" in none of them.
QUESTION = "What is the capital of Japan?"
INSTRUCTIONS = "You are a helpful assistant. Answer in one short sentence."


@pytest.fixture(scope="module")
def lm():
    import speechrt

    return speechrt.load_lm(backend="torch")


@pytest.fixture(scope="module")
def tts():
    import speechrt

    return speechrt.load_tts(backend="torch")


@pytest.fixture(scope="module")
def server(asr, lm, tts, server_factory):
    from speechrt.streaming.config import ServerOptions

    with server_factory(ServerOptions(port=0, silence_duration_ms=300), asr, lm, tts) as srv:
        yield srv


@pytest.fixture(scope="module")
def question_pcm(tts):
    """The question spoken by the embedded voice (its noise seeded: the same recording every run), pcm16 at
    24 kHz, with silence after it."""
    a = np.concatenate(list(tts.synthesize(QUESTION, sample_rate=24000, seed=0)))
    a = np.concatenate([np.zeros(4800, np.float32), a, np.zeros(24000, np.float32)])
    return (np.clip(a, -1, 1) * 32767).astype("<i2").tobytes()


def ws_url(srv):
    return f"ws://127.0.0.1:{srv.port}/v1/realtime"


def test_openai_sdk_conversation(server, question_pcm, asr):
    openai = pytest.importorskip("openai")

    async def main():
        client = openai.AsyncOpenAI(api_key="unused", websocket_base_url=f"ws://127.0.0.1:{server.port}/v1")
        types, user, transcript, audio = [], None, [], bytearray()
        async with client.realtime.connect(model="speechrt") as conn:
            await conn.session.update(
                session={
                    "type": "realtime",
                    "output_modalities": ["audio"],
                    "instructions": "You are a helpful assistant. Answer in one short sentence.",
                    "audio": {"input": {"turn_detection": {"type": "server_vad", "silence_duration_ms": 300}}},
                }
            )
            for i in range(0, len(question_pcm), 9600):
                await conn.input_audio_buffer.append(audio=base64.b64encode(question_pcm[i : i + 9600]).decode())
                await asyncio.sleep(0.05)
            async for ev in conn:
                types.append(ev.type)
                if ev.type == "conversation.item.input_audio_transcription.completed":
                    user = ev.transcript
                elif ev.type == "response.output_audio_transcript.delta":
                    transcript.append(ev.delta)
                elif ev.type == "response.output_audio.delta":
                    audio += base64.b64decode(ev.delta)
                elif ev.type == "response.done":
                    return types, user, "".join(transcript), bytes(audio), ev.response.status, ev.response.usage

    types, user, answer, audio, status, usage = asyncio.run(asyncio.wait_for(main(), 240))
    assert wer(QUESTION, user) <= 0.2, user
    assert status == "completed"
    assert "tokyo" in answer.lower(), answer
    for t in (
        "response.created",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_audio.delta",
        "response.output_audio_transcript.done",
        "response.output_item.done",
    ):
        assert t in types, t
    pcm = np.frombuffer(audio, "<i2").astype(np.float32) / 32768
    assert len(pcm) > 24000 * 0.5 and np.abs(pcm).max() > 0.05  # real speech, not silence
    # the spoken answer says what its transcript says
    heard = asr.transcribe(pcm, 24000).text
    assert wer(answer, heard) <= 0.35, (answer, heard)
    # usage, in OpenAI's shape (docs/realtime.md): the language model's tokens in and out, audio in 20-ms tokens
    # (the turn's audio in: the question's speech at least, the recording at most; the answer's audio out)
    inp, out = usage.input_token_details, usage.output_token_details
    assert inp.text_tokens > 10 and out.text_tokens > 0 and 0 <= inp.cached_tokens <= inp.text_tokens
    speech_s = len(question_pcm) / 2 / 24000
    assert (speech_s - 1.2) * 50 <= inp.audio_tokens <= speech_s * 50, (inp.audio_tokens, speech_s)
    assert abs(out.audio_tokens - len(pcm) / 24000 * 50) <= 1, (out.audio_tokens, len(pcm))
    assert usage.input_tokens == inp.text_tokens + inp.audio_tokens
    assert usage.output_tokens == out.text_tokens + out.audio_tokens
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens


def test_our_sdk_ask_talk_and_say(server, question_pcm, asr):
    from speechrt.client import Client, RealtimeError

    with Client(ws_url(server)) as c:
        reply = c.ask(QUESTION)
        assert reply.status == "completed" and "tokyo" in reply.transcript.lower(), reply.transcript
        assert len(reply.audio) > 24000 * 0.5
        q = np.frombuffer(question_pcm, "<i2").astype(np.float32) / 32768
        spoken = c.talk(q, 24000)
        assert wer(QUESTION, spoken.user_transcript) <= 0.2, spoken.user_transcript
        assert spoken.status == "completed" and len(spoken.audio) > 0
        audio = c.say("Good morning, the weather is lovely today.")
        # refusals raise, and leave nothing behind for the next call: a message over the item limit (no
        # response is asked for), then a response that fails (instructions over the context)
        with pytest.raises(RealtimeError, match="at most 32768"):
            c.ask("word " * 7000)
        c.update_session({"instructions": "Answer briefly and politely. " * 600})
        with pytest.raises(RealtimeError, match="context_length_exceeded"):
            c.ask(QUESTION)
        c.update_session({"instructions": INSTRUCTIONS})
        again = c.ask(QUESTION)
        assert again.status == "completed" and "tokyo" in again.transcript.lower(), again.transcript
    assert wer("Good morning, the weather is lovely today.", asr.transcribe(audio, 24000).text) <= 0.15


async def _conn(srv):
    from websockets.asyncio.client import connect

    ws = await connect(ws_url(srv), max_size=None)
    assert json.loads(await ws.recv())["type"] == "session.created"
    return ws


async def _until(ws, *types, timeout=120):
    """Events up to the first of `types`; an error event fails the test with its message."""
    seen = []
    while True:
        ev = json.loads(await asyncio.wait_for(ws.recv(), timeout))
        seen.append(ev)
        assert ev["type"] != "error", ev["error"]
        if ev["type"] in types:
            return ev, seen


def test_text_response_and_cancel(server):
    async def main():
        ws = await _conn(server)
        await ws.send(json.dumps({"type": "session.update", "session": {"output_modalities": ["text"]}}))
        await _until(ws, "session.updated")
        await ws.send(
            json.dumps(
                {
                    "type": "conversation.item.create",
                    "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": QUESTION}]},
                }
            )
        )
        await ws.send(json.dumps({"type": "response.create"}))
        done, seen = await _until(ws, "response.done")
        text = "".join(e["delta"] for e in seen if e["type"] == "response.output_text.delta")
        assert "tokyo" in text.lower() and done["response"]["status"] == "completed"
        assert not any(e["type"] == "response.output_audio.delta" for e in seen)
        # a long answer, cancelled after its first words
        await ws.send(
            json.dumps(
                {
                    "type": "conversation.item.create",
                    "item": {
                        "type": "message",
                        "role": "user",
                        "content": [{"type": "input_text", "text": "Write a long story about a dragon."}],
                    },
                }
            )
        )
        await ws.send(json.dumps({"type": "response.create", "response": {"max_output_tokens": 400}}))
        await _until(ws, "response.output_text.delta")
        await ws.send(json.dumps({"type": "response.cancel"}))
        done, _ = await _until(ws, "response.done")
        assert done["response"]["status"] == "cancelled"
        await ws.close()

    asyncio.run(asyncio.wait_for(main(), 240))


def test_a_prompt_over_the_context_fails_the_response_and_says_why(server):
    """Instructions that with the latest message do not fit the language model's context: the response fails
    with context_length_exceeded and the numbers (nothing is cut inside a message), and the session goes
    on: with short instructions the same question is answered."""

    async def main():
        ws = await _conn(server)
        await ws.send(
            json.dumps(
                {
                    "type": "session.update",
                    "session": {"output_modalities": ["text"], "instructions": "Answer briefly and politely. " * 600},
                }
            )
        )
        await _until(ws, "session.updated")
        await ws.send(
            json.dumps(
                {
                    "type": "conversation.item.create",
                    "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": QUESTION}]},
                }
            )
        )
        await ws.send(json.dumps({"type": "response.create"}))
        seen = []
        while not seen or seen[-1]["type"] != "response.done":
            seen.append(json.loads(await asyncio.wait_for(ws.recv(), 120)))
        errors = [e["error"] for e in seen if e["type"] == "error"]
        assert len(errors) == 1 and errors[0]["code"] == "context_length_exceeded", errors
        room = server.engine.prompt_room(256)  # the session's max_output_tokens
        assert f"over the {room} that" in errors[0]["message"] and "shorten the instructions" in errors[0]["message"]
        done = seen[-1]["response"]
        assert done["status"] == "failed" and done["status_details"]["error"]["code"] == "context_length_exceeded"
        assert not any(e["type"] == "response.output_text.delta" for e in seen)
        await ws.send(json.dumps({"type": "session.update", "session": {"instructions": INSTRUCTIONS}}))
        await _until(ws, "session.updated")
        await ws.send(json.dumps({"type": "response.create"}))
        done, seen = await _until(ws, "response.done")
        assert done["response"]["status"] == "completed"
        assert "tokyo" in "".join(e["delta"] for e in seen if e["type"] == "response.output_text.delta").lower()
        await ws.close()

    asyncio.run(asyncio.wait_for(main(), 240))


def test_push_to_talk_response_answers_the_audio_just_committed(server, question_pcm):
    """Turn detection off, the question's audio committed and a response asked for at once (OpenAI's push to
    talk): the response waits for that item's transcript and answers it (it answered without it before)."""

    async def main():
        ws = await _conn(server)
        await ws.send(
            json.dumps(
                {
                    "type": "session.update",
                    "session": {
                        "output_modalities": ["text"],
                        "instructions": INSTRUCTIONS,
                        "audio": {"input": {"turn_detection": None}},
                    },
                }
            )
        )
        await _until(ws, "session.updated")
        for i in range(0, len(question_pcm), 9600):
            await ws.send(
                json.dumps(
                    {
                        "type": "input_audio_buffer.append",
                        "audio": base64.b64encode(question_pcm[i : i + 9600]).decode(),
                    }
                )
            )
        await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
        await ws.send(json.dumps({"type": "response.create"}))
        done, seen = await _until(ws, "response.done")
        heard = next(e for e in seen if e["type"] == "conversation.item.input_audio_transcription.completed")
        assert "japan" in heard["transcript"].lower()
        assert seen.index(heard) < next(i for i, e in enumerate(seen) if e["type"] == "response.output_text.delta")
        assert "tokyo" in done["response"]["output"][0]["content"][0]["text"].lower(), done
        # an out-of-band response whose input names the item just committed reads its transcript too
        for i in range(0, len(question_pcm), 9600):
            await ws.send(
                json.dumps(
                    {
                        "type": "input_audio_buffer.append",
                        "audio": base64.b64encode(question_pcm[i : i + 9600]).decode(),
                    }
                )
            )
        await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
        committed, _ = await _until(ws, "input_audio_buffer.committed")
        await ws.send(
            json.dumps(
                {
                    "type": "response.create",
                    "response": {
                        "conversation": "none",
                        "input": [{"type": "item_reference", "id": committed["item_id"]}],
                    },
                }
            )
        )
        done, _ = await _until(ws, "response.done")
        assert "tokyo" in done["response"]["output"][0]["content"][0]["text"].lower(), done
        await ws.close()

    asyncio.run(asyncio.wait_for(main(), 240))


def test_an_audio_item_is_transcribed_and_answered(server, question_pcm):
    """conversation.item.create with an input_audio part (base64 in the session's input format): the item is
    added at once, its transcript follows (transcription.completed, then item.done), and a response asked for
    meanwhile answers it. Audio the format cannot hold, too short, or in an assistant item is refused."""

    async def main():
        ws = await _conn(server)
        await ws.send(
            json.dumps(
                {"type": "session.update", "session": {"output_modalities": ["text"], "instructions": INSTRUCTIONS}}
            )
        )
        await _until(ws, "session.updated")
        clip = {"type": "input_audio", "audio": base64.b64encode(question_pcm).decode()}
        await ws.send(
            json.dumps(
                {"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [clip]}}
            )
        )
        await ws.send(json.dumps({"type": "response.create"}))
        done, seen = await _until(ws, "response.done")
        added = next(e for e in seen if e["type"] == "conversation.item.added")
        heard = next(e for e in seen if e["type"] == "conversation.item.input_audio_transcription.completed")
        assert heard["item_id"] == added["item"]["id"] and "japan" in heard["transcript"].lower()
        assert added["item"]["content"] == [{"type": "input_audio", "transcript": None}]
        assert "tokyo" in done["response"]["output"][0]["content"][0]["text"].lower(), done
        for content, says in (
            ([{"type": "input_audio", "audio": "@@"}], "not valid base64"),
            ([{"type": "input_audio", "audio": base64.b64encode(b"\1\2\3").decode()}], "even number"),
            ([{"type": "input_audio", "audio": base64.b64encode(b"\0\0" * 240).decode()}], "0.1 to"),
        ):
            await ws.send(
                json.dumps(
                    {
                        "type": "conversation.item.create",
                        "item": {"type": "message", "role": "user", "content": content},
                    }
                )
            )
            err = json.loads(await asyncio.wait_for(ws.recv(), 30))
            assert (
                err["type"] == "error" and err["error"]["code"] == "invalid_audio" and says in err["error"]["message"]
            )
        await ws.send(
            json.dumps(
                {
                    "type": "conversation.item.create",
                    "item": {"type": "message", "role": "assistant", "content": [clip]},
                }
            )
        )
        err = json.loads(await asyncio.wait_for(ws.recv(), 30))
        assert err["type"] == "error" and "user items" in err["error"]["message"]
        await ws.close()

    asyncio.run(asyncio.wait_for(main(), 240))


def test_out_of_band_responses_and_their_own_input(server):
    """response.conversation 'none': the answer comes in response events only (no conversation.item.*), with
    conversation_id null and the client's metadata, and the conversation does not hold it; response.input:
    the prompt is those items (messages, or references to the conversation's), not the conversation."""

    async def main():
        ws = await _conn(server)
        await ws.send(
            json.dumps(
                {"type": "session.update", "session": {"output_modalities": ["text"], "instructions": INSTRUCTIONS}}
            )
        )
        await _until(ws, "session.updated")
        await ws.send(
            json.dumps(
                {
                    "type": "conversation.item.create",
                    "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": QUESTION}]},
                }
            )
        )
        question, _ = await _until(ws, "conversation.item.done")
        await ws.send(
            json.dumps(
                {
                    "type": "response.create",
                    "response": {
                        "conversation": "none",
                        "metadata": {"purpose": "check"},
                        "input": [{"type": "item_reference", "id": question["item"]["id"]}],
                    },
                }
            )
        )
        done, seen = await _until(ws, "response.done")
        r = done["response"]
        assert r["conversation_id"] is None and r["metadata"] == {"purpose": "check"} and r["status"] == "completed"
        assert not any(e["type"].startswith("conversation.item") for e in seen)
        assert "tokyo" in r["output"][0]["content"][0]["text"].lower()
        await ws.send(json.dumps({"type": "conversation.item.retrieve", "item_id": r["output"][0]["id"]}))
        err = json.loads(await asyncio.wait_for(ws.recv(), 30))
        assert err["type"] == "error" and err["error"]["code"] == "item_not_found"
        # its own input: another question than the conversation's, answered in the conversation (auto)
        other = {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "What is the capital of France?"}],
        }
        await ws.send(json.dumps({"type": "response.create", "response": {"input": [other]}}))
        done, seen = await _until(ws, "response.done")
        assert "paris" in done["response"]["output"][0]["content"][0]["text"].lower()
        assert done["response"]["conversation_id"] is not None
        assert any(e["type"] == "conversation.item.added" for e in seen)
        for bad, code in (
            ({"input": [{"type": "item_reference", "id": "item_nope"}]}, "item_not_found"),
            ({"conversation": "other"}, "invalid_value"),
            ({"metadata": {"k": 5}}, "invalid_value"),
        ):
            await ws.send(json.dumps({"type": "response.create", "response": bad}))
            err = json.loads(await asyncio.wait_for(ws.recv(), 30))
            assert err["type"] == "error" and err["error"]["code"] == code, err
        await ws.close()

    asyncio.run(asyncio.wait_for(main(), 240))


def test_a_response_in_its_own_audio_format(server):
    """response.audio.output.format: this response's audio in that format (G.711 mu-law at 8 kHz: one byte a sample,
    the same speech, which the session's pcm16 at 24 kHz sends in 6x the bytes), the next one in the session's
    again; a bad format or voice there is an error naming the field."""
    import base64

    from speechrt.streaming.realtime.audio_codec import AudioFormat, InputDecoder

    async def speak(ws, extra):
        await ws.send(
            json.dumps({"type": "response.create", "response": {"speechrt_say": "Hello there, friend.", **extra}})
        )
        _, seen = await _until(ws, "response.done")
        return b"".join(base64.b64decode(e["delta"]) for e in seen if e["type"] == "response.output_audio.delta")

    async def main():
        ws = await _conn(server)
        ulaw = await speak(ws, {"audio": {"output": {"format": {"type": "audio/pcmu"}, "voice": "alloy"}}})
        pcm = await speak(ws, {})
        for bad, code, param in (
            ({"format": {"type": "audio/mp3"}}, "invalid_audio_format", "response.audio.output.format"),
            ({"voice": "robot"}, "invalid_value", "response.audio.output.voice"),
        ):
            await ws.send(json.dumps({"type": "response.create", "response": {"audio": {"output": bad}}}))
            err = json.loads(await asyncio.wait_for(ws.recv(), 30))
            assert err["type"] == "error" and (err["error"]["code"], err["error"]["param"]) == (code, param), err
        await ws.close()
        return ulaw, pcm

    ulaw, pcm = asyncio.run(asyncio.wait_for(main(), 120))
    # (each synthesis draws its own durations: the lengths agree roughly, the words exactly)
    assert len(pcm) == pytest.approx(6 * len(ulaw), rel=0.2) and len(ulaw) > 0.8 * 8000
    for raw, fmt in ((ulaw, AudioFormat("audio/pcmu", 8000)), (pcm, AudioFormat("audio/pcm", 24000))):
        heard = server.asr.transcribe(InputDecoder(fmt).decode(raw, last=True)).text  # 16 kHz float32
        assert wer("Hello there, friend.", heard) <= 0.34, (fmt, heard)


def test_a_spoken_reply_is_bounded_to_about_30_s_unless_the_client_sets_max_output_tokens(server):
    """An audio response of a session that set no max_output_tokens stops at AUDIO_MAX_OUTPUT_TOKENS (about 30 s of
    the voice's speech; a text response keeps 256), incomplete for max_output_tokens; the client's value, in the
    response or the session ("inf" included), overrides it."""
    from speechrt.streaming.realtime.config import SessionConfig, apply_session_update
    from speechrt.streaming.realtime.response_options import AUDIO_MAX_OUTPUT_TOKENS, response_options

    story = "Tell me a very long and detailed story about a dragon, a knight and a village, with many chapters."

    async def main():
        ws = await _conn(server)
        await ws.send(
            json.dumps({"type": "session.update", "session": {"instructions": "You tell long, detailed stories."}})
        )
        upd, _ = await _until(ws, "session.updated")
        assert upd["session"]["max_output_tokens"] == AUDIO_MAX_OUTPUT_TOKENS
        item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": story}]}
        await ws.send(json.dumps({"type": "conversation.item.create", "item": item}))
        dones = []
        for extra in ({}, {"max_output_tokens": 12}):  # the default bound, then the response's own
            await ws.send(json.dumps({"type": "response.create", "response": {"conversation": "none", **extra}}))
            done, seen = await _until(ws, "response.done")
            assert any(e["type"] == "response.output_audio.delta" for e in seen)
            dones.append(done["response"])
        await ws.close()
        return dones

    for r, n in zip(asyncio.run(asyncio.wait_for(main(), 240)), (AUDIO_MAX_OUTPUT_TOKENS, 12)):
        assert (r["status"], r["status_details"]["reason"]) == ("incomplete", "max_output_tokens"), r
        assert r["usage"]["output_token_details"]["text_tokens"] == n
    # the same choice without a server: a session's value ("inf": 1024) overrides the default for audio and text
    cfg = SessionConfig()
    assert 100 <= AUDIO_MAX_OUTPUT_TOKENS <= 130 and response_options({}, cfg).max_tokens == AUDIO_MAX_OUTPUT_TOKENS
    assert response_options({"output_modalities": ["text"]}, cfg).max_tokens == 256
    inf = apply_session_update(cfg, {"max_output_tokens": "inf"}, {})
    assert (
        response_options({}, inf).max_tokens == 1024
        and response_options({"max_output_tokens": 300}, cfg).max_tokens == 300
    )


def test_session_model_and_voice_names(server):
    """A session may name the loaded language model, 'speechrt' or an OpenAI realtime model (in the URL or
    in session.update), and the loaded voice or an OpenAI voice; any other name is an error that lists the
    valid ones (a bad one in the URL ends the connection: nothing would answer for it)."""
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed

    async def main():
        for good in (server.lm.name, "gpt-realtime", "gpt-4o-realtime-preview-2024-12-17"):
            ws = await connect(f"{ws_url(server)}?model={good}")
            created = json.loads(await ws.recv())
            assert created["type"] == "session.created" and created["session"]["model"] == good
            await ws.close()
        ws = await connect(f"{ws_url(server)}?model=gpt-9")
        err = json.loads(await ws.recv())
        assert err["type"] == "error" and err["error"]["code"] == "model_not_found", err
        assert server.lm.name in err["error"]["message"] and err["error"]["param"] == "model"
        with pytest.raises(ConnectionClosed) as closed:
            await ws.recv()
        assert closed.value.rcvd.code == 1008
        ws = await _conn(server)
        for session, code, param in (
            ({"model": "llama-70b"}, "model_not_found", "session.model"),
            ({"voice": "nope"}, "invalid_value", "session.audio.output.voice"),
            ({"audio": {"output": {"voice": "robot"}}}, "invalid_value", "session.audio.output.voice"),
        ):
            await ws.send(json.dumps({"type": "session.update", "session": session}))
            ev = json.loads(await asyncio.wait_for(ws.recv(), 30))
            assert ev["type"] == "error" and (ev["error"]["code"], ev["error"]["param"]) == (code, param), ev
        assert server.tts.name in ev["error"]["message"] and "alloy" in ev["error"]["message"]
        await ws.send(json.dumps({"type": "session.update", "session": {"voice": "marin", "model": "speechrt"}}))
        updated, _ = await _until(ws, "session.updated")
        assert updated["session"]["audio"]["output"]["voice"] == server.tts.name  # OpenAI's names: the loaded voice
        await ws.close()

    asyncio.run(asyncio.wait_for(main(), 120))


def test_barge_in_stops_the_response_and_truncates(server, question_pcm):
    async def main():
        ws = await _conn(server)
        await ws.send(
            json.dumps(
                {
                    "type": "session.update",
                    "session": {
                        "instructions": "You are a storyteller. Tell long, detailed stories.",
                        "audio": {"input": {"turn_detection": {"type": "server_vad", "silence_duration_ms": 300}}},
                    },
                }
            )
        )
        await _until(ws, "session.updated")
        await ws.send(
            json.dumps(
                {
                    "type": "conversation.item.create",
                    "item": {
                        "type": "message",
                        "role": "user",
                        "content": [
                            {"type": "input_text", "text": "Tell me a long story about a dragon and a knight."}
                        ],
                    },
                }
            )
        )
        await ws.send(json.dumps({"type": "response.create", "response": {"max_output_tokens": 400}}))
        first, _ = await _until(ws, "response.output_audio.delta")
        item_id = first["item_id"]
        # the person talks over the answer
        for i in range(0, len(question_pcm), 9600):
            await ws.send(
                json.dumps(
                    {
                        "type": "input_audio_buffer.append",
                        "audio": base64.b64encode(question_pcm[i : i + 9600]).decode(),
                    }
                )
            )
        started, seen = await _until(ws, "input_audio_buffer.speech_started")
        done, seen2 = await _until(ws, "response.done")
        assert done["response"]["status"] == "cancelled"
        assert done["response"]["status_details"]["reason"] == "turn_detected"
        received_ms = (
            sum(
                len(base64.b64decode(e["delta"])) // 2
                for e in [first] + seen + seen2
                if e["type"] == "response.output_audio.delta" and e["item_id"] == item_id
            )
            // 24
        )
        assert received_ms > 0
        # the client played half of the audio it got: the item is cut to what was heard
        played = received_ms // 2
        await ws.send(
            json.dumps(
                {"type": "conversation.item.truncate", "item_id": item_id, "content_index": 0, "audio_end_ms": played}
            )
        )
        tr, seen3 = await _until(ws, "conversation.item.truncated")
        assert tr["audio_end_ms"] == played and tr["item_id"] == item_id
        await ws.send(
            json.dumps(
                {
                    "type": "conversation.item.truncate",
                    "item_id": item_id,
                    "content_index": 0,
                    "audio_end_ms": received_ms + 5000,
                }
            )
        )
        skipped = []
        err = json.loads(await asyncio.wait_for(ws.recv(), 60))
        while err["type"] != "error":
            skipped.append(err)
            err = json.loads(await asyncio.wait_for(ws.recv(), 60))
        assert "past the item's audio" in err["error"]["message"]
        await ws.send(json.dumps({"type": "conversation.item.retrieve", "item_id": item_id}))
        got, _ = await _until(ws, "conversation.item.retrieved")
        full = done["response"]["output"][0]["content"][0]["transcript"]
        cut = got["item"]["content"][0]["transcript"]
        assert len(cut) < len(full) or full == ""
        # the interrupting question is then transcribed and answered
        answered = next((e for e in skipped if e["type"] == "response.done"), None)
        if answered is None:
            answered, _ = await _until(ws, "response.done", timeout=180)
        # answered in full, or (the storyteller's instructions) up to a spoken reply's default bound (120 tokens)
        r = answered["response"]
        assert r["status"] == "completed" or (r["status"], r["status_details"]["reason"]) == (
            "incomplete",
            "max_output_tokens",
        )
        assert r["output"][0]["content"][0]["transcript"].strip()
        await ws.close()

    asyncio.run(asyncio.wait_for(main(), 300))


def _spoken(tts, *parts, gap_s=0.0, tail_s=2.5):
    """`parts` spoken by the embedded voice (seeded), `gap_s` of silence between them, pcm16 at 24 kHz."""
    gap = np.zeros(int(24000 * gap_s), np.float32)
    pieces = [np.zeros(4800, np.float32)]
    for i, text in enumerate(parts):
        pieces += ([gap] if i else []) + [np.concatenate(list(tts.synthesize(text, sample_rate=24000, seed=i)))]
    pieces.append(np.zeros(int(24000 * tail_s), np.float32))
    return (np.clip(np.concatenate(pieces), -1, 1) * 32767).astype("<i2").tobytes()


async def _speak_paced(ws, pcm: bytes):
    """Send `pcm` (pcm16, 24 kHz) at real-time pace, 100 ms a chunk."""
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    for k, i in enumerate(range(0, len(pcm), 4800)):
        await asyncio.sleep(max(0.0, t0 + k * 0.1 - loop.time()))
        await ws.send(
            json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm[i : i + 4800]).decode()})
        )


def _turn(server, pcm, silence_ms):
    """One spoken turn in a new conversation session -> (events up to response.done, the engine's speculation
    counters' increase: begun, taken over)."""
    m = server.engine.metrics

    async def main():
        ws = await _conn(server)
        await ws.send(
            json.dumps(
                {
                    "type": "session.update",
                    "session": {
                        "instructions": INSTRUCTIONS,
                        "audio": {
                            "input": {"turn_detection": {"type": "server_vad", "silence_duration_ms": silence_ms}}
                        },
                    },
                }
            )
        )
        await _until(ws, "session.updated")
        sender = asyncio.create_task(_speak_paced(ws, pcm))
        done, seen = await _until(ws, "response.done", timeout=180)
        await sender
        await ws.close()
        return seen

    before = m.replies_speculated, m.replies_speculation_used
    seen = asyncio.run(asyncio.wait_for(main(), 240))
    return seen, (m.replies_speculated - before[0], m.replies_speculation_used - before[1])


def test_the_reply_begun_in_the_final_pause_is_the_response(server, tts, asr):
    """The pause that ends the turn (1.2 s) is long enough for its transcript and a reply to it to begin
    before it ends: the response takes that reply over, with the usual events in the usual order."""
    seen, (begun, used) = _turn(server, _spoken(tts, QUESTION), 1200)
    assert (begun, used) == (1, 1)
    types = [e["type"] for e in seen]
    assert types.index("conversation.item.input_audio_transcription.completed") < types.index("response.created")
    user = next(e["transcript"] for e in seen if e["type"] == "conversation.item.input_audio_transcription.completed")
    assert wer(QUESTION, user) <= 0.2, user
    done = seen[-1]["response"]
    assert done["status"] == "completed"
    answer = done["output"][0]["content"][0]["transcript"]
    assert "tokyo" in answer.lower(), answer
    pcm = (
        np.concatenate(
            [
                np.frombuffer(base64.b64decode(e["delta"]), "<i2")
                for e in seen
                if e["type"] == "response.output_audio.delta"
            ]
        ).astype(np.float32)
        / 32768
    )
    assert wer(answer, asr.transcribe(pcm, 24000).text) <= 0.35


def test_speech_after_a_pause_drops_the_reply_begun_in_it(server, tts):
    """A 1-s pause inside a turn (2.5 s ends one) begins a reply to the question so far; speech resuming
    drops it, and the one response answers the whole turn (the reply begun in the final pause, which
    answered the final transcript: a reply is only taken over for the very messages it answered)."""
    pcm = _spoken(tts, "What is the capital of Japan?", "Answer with one word.", gap_s=1.0)
    seen, (begun, used) = _turn(server, pcm, 2500)
    assert (begun, used) == (2, 1)
    assert [e["type"] for e in seen].count("response.created") == 1
    user = next(e["transcript"] for e in seen if e["type"] == "conversation.item.input_audio_transcription.completed")
    assert wer("What is the capital of Japan? Answer with one word.", user) <= 0.2, user
    answer = seen[-1]["response"]["output"][0]["content"][0]["transcript"]
    assert "tokyo" in answer.lower(), answer


def test_the_reply_prompt_is_read_while_the_turn_is_spoken(server, tts, lm):
    """The turn's live words prime the reply's prompt while it is spoken: the reply, the first request of a
    new session, finds the instructions and the words so far already in the language model's cache
    (positions reused, not read again), and answers as before. (A turn of about 4 s, so that live rounds
    agree on words before it ends even on a loaded machine.)"""
    m = server.engine.metrics
    before = m.prompts_primed, m.prompt_tokens_reused, m.prompt_tokens
    seen, _ = _turn(server, _spoken(tts, "Please tell me,", QUESTION, "Answer with one word.", gap_s=0.25), 800)
    assert m.prompts_primed > before[0]
    instructions = lm.encode_chat([{"role": "system", "content": INSTRUCTIONS}])
    assert m.prompt_tokens_reused - before[1] > len(instructions)  # and some of the question's words
    assert m.prompt_tokens - before[2] > m.prompt_tokens_reused - before[1]  # (its last token is always read)
    answer = seen[-1]["response"]["output"][0]["content"][0]["transcript"]
    assert "tokyo" in answer.lower(), answer
