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


@pytest.fixture(scope="module")
def lm():
    import speechrt

    return speechrt.load_lm()


@pytest.fixture(scope="module")
def tts():
    import speechrt

    return speechrt.load_tts()


@pytest.fixture(scope="module")
def server(asr, lm, tts, server_factory):
    from speechrt.streaming.server import ServerOptions

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
            await conn.session.update(session={"type": "realtime", "output_modalities": ["audio"],
                                               "instructions": "You are a helpful assistant. Answer in one short sentence.",
                                               "audio": {"input": {"turn_detection": {"type": "server_vad",
                                                                                      "silence_duration_ms": 300}}}})
            for i in range(0, len(question_pcm), 9600):
                await conn.input_audio_buffer.append(audio=base64.b64encode(question_pcm[i: i + 9600]).decode())
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
                    return types, user, "".join(transcript), bytes(audio), ev.response.status
    types, user, answer, audio, status = asyncio.run(asyncio.wait_for(main(), 240))
    assert wer(QUESTION, user) <= 0.2, user
    assert status == "completed"
    assert "tokyo" in answer.lower(), answer
    for t in ("response.created", "response.output_item.added", "response.content_part.added",
              "response.output_audio.delta", "response.output_audio_transcript.done", "response.output_item.done"):
        assert t in types, t
    pcm = np.frombuffer(audio, "<i2").astype(np.float32) / 32768
    assert len(pcm) > 24000 * 0.5 and np.abs(pcm).max() > 0.05  # real speech, not silence
    # the spoken answer says what its transcript says
    heard = asr.transcribe(pcm, 24000).text
    assert wer(answer, heard) <= 0.35, (answer, heard)


def test_our_sdk_ask_talk_and_say(server, question_pcm, asr):
    from speechrt.client import Client

    with Client(ws_url(server)) as c:
        reply = c.ask(QUESTION)
        assert reply.status == "completed" and "tokyo" in reply.transcript.lower(), reply.transcript
        assert len(reply.audio) > 24000 * 0.5
        q = np.frombuffer(question_pcm, "<i2").astype(np.float32) / 32768
        spoken = c.talk(q, 24000)
        assert wer(QUESTION, spoken.user_transcript) <= 0.2, spoken.user_transcript
        assert spoken.status == "completed" and len(spoken.audio) > 0
        audio = c.say("Good morning, the weather is lovely today.")
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
        await ws.send(json.dumps({"type": "conversation.item.create", "item": {
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": QUESTION}]}}))
        await ws.send(json.dumps({"type": "response.create"}))
        done, seen = await _until(ws, "response.done")
        text = "".join(e["delta"] for e in seen if e["type"] == "response.output_text.delta")
        assert "tokyo" in text.lower() and done["response"]["status"] == "completed"
        assert not any(e["type"] == "response.output_audio.delta" for e in seen)
        # a long answer, cancelled after its first words
        await ws.send(json.dumps({"type": "conversation.item.create", "item": {
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": "Write a long story about a dragon."}]}}))
        await ws.send(json.dumps({"type": "response.create", "response": {"max_output_tokens": 400}}))
        await _until(ws, "response.output_text.delta")
        await ws.send(json.dumps({"type": "response.cancel"}))
        done, _ = await _until(ws, "response.done")
        assert done["response"]["status"] == "cancelled"
        await ws.close()
    asyncio.run(asyncio.wait_for(main(), 240))


def test_barge_in_stops_the_response_and_truncates(server, question_pcm):
    async def main():
        ws = await _conn(server)
        await ws.send(json.dumps({"type": "session.update", "session": {
            "instructions": "You are a storyteller. Tell long, detailed stories.",
            "audio": {"input": {"turn_detection": {"type": "server_vad", "silence_duration_ms": 300}}}}}))
        await _until(ws, "session.updated")
        await ws.send(json.dumps({"type": "conversation.item.create", "item": {
            "type": "message", "role": "user", "content": [{"type": "input_text",
                                                            "text": "Tell me a long story about a dragon and a knight."}]}}))
        await ws.send(json.dumps({"type": "response.create", "response": {"max_output_tokens": 400}}))
        first, _ = await _until(ws, "response.output_audio.delta")
        item_id = first["item_id"]
        # the person talks over the answer
        for i in range(0, len(question_pcm), 9600):
            await ws.send(json.dumps({"type": "input_audio_buffer.append",
                                      "audio": base64.b64encode(question_pcm[i: i + 9600]).decode()}))
        started, seen = await _until(ws, "input_audio_buffer.speech_started")
        done, seen2 = await _until(ws, "response.done")
        assert done["response"]["status"] == "cancelled"
        assert done["response"]["status_details"]["reason"] == "turn_detected"
        received_ms = sum(len(base64.b64decode(e["delta"])) // 2 for e in [first] + seen + seen2
                          if e["type"] == "response.output_audio.delta" and e["item_id"] == item_id) // 24
        assert received_ms > 0
        # the client played half of the audio it got: the item is cut to what was heard
        played = received_ms // 2
        await ws.send(json.dumps({"type": "conversation.item.truncate", "item_id": item_id, "content_index": 0,
                                  "audio_end_ms": played}))
        tr, seen3 = await _until(ws, "conversation.item.truncated")
        assert tr["audio_end_ms"] == played and tr["item_id"] == item_id
        await ws.send(json.dumps({"type": "conversation.item.truncate", "item_id": item_id, "content_index": 0,
                                  "audio_end_ms": received_ms + 5000}))
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
        assert answered["response"]["status"] == "completed"
        await ws.close()
    asyncio.run(asyncio.wait_for(main(), 300))
