"""Protocol abuse against a real transcription server: every malformed, absurd or out-of-order client event
gets an error naming what was wrong (or is accepted where the API says so), the session goes on, its audio
is not lost, and other sessions do not notice."""

from __future__ import annotations

import asyncio
import json
import time

import numpy as np
import pytest
from rel_helpers import SENTENCES, append_event, next_event, open_session, pcm24, run, update

from speechrt.models.wer import wer

DEEP = "[" * 100_000 + "]" * 100_000
TD = "session.audio.input.turn_detection"

# (case id, message sent, expected: ("error", code, text in message or param) | ("ok", event type))
CASES = [
    ("not-json", "{not json", ("error", "invalid_json", "not valid JSON")),
    ("binary-frame", b"\x00\x01binary", ("error", "invalid_json", "binary frames")),
    ("json-list", json.dumps(["a", "list"]), ("error", "invalid_event", "JSON object")),
    ("json-number", "42", ("error", "invalid_event", "JSON object")),
    ("missing-type", json.dumps({"audio": "AAAA"}), ("error", "invalid_event", "string 'type'")),
    ("type-not-string", json.dumps({"type": 5}), ("error", "invalid_event", "string 'type'")),
    (
        "unknown-type",
        json.dumps({"type": "input_audio_buffer.frobnicate"}),
        ("error", "invalid_event_type", "valid client events"),
    ),
    ("nested-100k-deep", DEEP, ("error", "invalid_json", "not valid JSON")),
    (
        "5000-digit-integer",
        '{"type": "session.update", "session": {"x": ' + "9" * 5000 + "}}",
        ("error", "invalid_json", "not valid JSON"),
    ),
    (
        "append-no-audio",
        json.dumps({"type": "input_audio_buffer.append"}),
        ("error", "missing_required_parameter", "audio"),
    ),
    (
        "append-audio-number",
        json.dumps({"type": "input_audio_buffer.append", "audio": 5}),
        ("error", "invalid_audio", "base64 string"),
    ),
    (
        "append-bad-base64",
        json.dumps({"type": "input_audio_buffer.append", "audio": "@@@not base64@@@"}),
        ("error", "invalid_audio", "not valid base64"),
    ),
    ("append-odd-pcm", append_event(b"\x01\x02\x03"), ("error", "invalid_audio", "")),
    (
        "session-not-object",
        json.dumps({"type": "session.update", "session": "x"}),
        ("error", "invalid_value", "'session' must be an object"),
    ),
    (
        "audio-input-string",
        json.dumps({"type": "session.update", "session": {"audio": {"input": "x"}}}),
        ("error", "invalid_value", "session.audio.input"),
    ),
    (
        "audio-output-list",
        json.dumps({"type": "session.update", "session": {"audio": {"output": [1]}}}),
        ("error", "invalid_value", "session.audio.output"),
    ),
    (
        "transcription-number",
        json.dumps({"type": "session.update", "session": {"audio": {"input": {"transcription": 5}}}}),
        ("error", "invalid_value", "transcription"),
    ),
    (
        "transcription-model-number",
        json.dumps({"type": "session.update", "session": {"audio": {"input": {"transcription": {"model": 5}}}}}),
        ("error", "invalid_value", "transcription.model"),
    ),
    (
        "unknown-transcription-model",
        json.dumps(
            {"type": "session.update", "session": {"audio": {"input": {"transcription": {"model": "no-such-model"}}}}}
        ),
        ("error", "invalid_value", "transcription models: whisper-tiny.en, speechrt, whisper-1"),
    ),
    (
        "unknown-session-model",
        json.dumps({"type": "session.update", "session": {"model": "no-such-model"}}),
        ("error", "model_not_found", "gpt-realtime"),
    ),
    (
        "openai-realtime-model",
        json.dumps({"type": "session.update", "session": {"model": "gpt-realtime"}}),
        ("ok", "session.updated"),
    ),
    (
        "session-tool-bad-schema",
        json.dumps(
            {
                "type": "session.update",
                "session": {"tools": [{"type": "function", "name": "f", "parameters": {"type": "objekt"}}]},
            }
        ),
        ("error", "invalid_value", "session.tools[0].parameters is not a schema"),
    ),
    (
        "session-tool-choice-unknown-function",
        json.dumps({"type": "session.update", "session": {"tool_choice": {"type": "function", "name": "f"}}}),
        ("error", "invalid_value", "not in tools (valid: none are given)"),
    ),
    (
        "unknown-voice",
        json.dumps({"type": "session.update", "session": {"audio": {"output": {"voice": "robot"}}}}),
        ("error", "invalid_value", "alloy"),
    ),
    (
        "unsupported-language",
        json.dumps({"type": "session.update", "session": {"audio": {"input": {"transcription": {"language": "fr"}}}}}),
        ("error", "invalid_value", "valid: en"),
    ),
    (
        "eagerness-object",
        json.dumps(
            {
                "type": "session.update",
                "session": {"audio": {"input": {"turn_detection": {"type": "semantic_vad", "eagerness": {}}}}},
            }
        ),
        ("error", "invalid_value", f"{TD}.eagerness"),
    ),
    (
        "eagerness-unknown",
        json.dumps(
            {
                "type": "session.update",
                "session": {"audio": {"input": {"turn_detection": {"type": "semantic_vad", "eagerness": "eager"}}}},
            }
        ),
        ("error", "invalid_value", "low, medium, high, auto"),
    ),
    (
        "negative-threshold",
        json.dumps({"type": "session.update", "session": {"audio": {"input": {"turn_detection": {"threshold": -1}}}}}),
        ("error", "invalid_value", f"{TD}.threshold"),
    ),
    (
        "silence-1e9-ms",
        json.dumps(
            {
                "type": "session.update",
                "session": {"audio": {"input": {"turn_detection": {"silence_duration_ms": 10**9}}}},
            }
        ),
        ("error", "invalid_value", "from 0 to 10000"),
    ),
    (
        "silence-0-ms",
        json.dumps(
            {"type": "session.update", "session": {"audio": {"input": {"turn_detection": {"silence_duration_ms": 0}}}}}
        ),
        ("ok", "session.updated"),
    ),
    (
        "padding-as-string",
        json.dumps(
            {
                "type": "session.update",
                "session": {"audio": {"input": {"turn_detection": {"prefix_padding_ms": "300"}}}},
            }
        ),
        ("error", "invalid_value", f"{TD}.prefix_padding_ms"),
    ),
    (
        "turn-detection-type",
        json.dumps(
            {"type": "session.update", "session": {"audio": {"input": {"turn_detection": {"type": "magic_vad"}}}}}
        ),
        ("error", "invalid_value", "server_vad, semantic_vad"),
    ),
    (
        "rate-96k",
        json.dumps(
            {
                "type": "session.update",
                "session": {"audio": {"input": {"format": {"type": "audio/pcm", "rate": 96000}}}},
            }
        ),
        ("error", "invalid_audio_format", "8000 to 48000"),
    ),
    (
        "rate-4k",
        json.dumps(
            {"type": "session.update", "session": {"audio": {"input": {"format": {"type": "audio/pcm", "rate": 4000}}}}}
        ),
        ("error", "invalid_audio_format", "8000 to 48000"),
    ),
    (
        "format-flac",
        json.dumps({"type": "session.update", "session": {"audio": {"input": {"format": {"type": "audio/flac"}}}}}),
        ("error", "invalid_audio_format", "audio/pcm"),
    ),
    (
        "beta-format-mp3",
        json.dumps({"type": "session.update", "session": {"input_audio_format": "mp3"}}),
        ("error", "invalid_audio_format", "pcm16"),
    ),
    (
        "instructions-number",
        json.dumps({"type": "session.update", "session": {"instructions": 5}}),
        ("error", "invalid_value", "session.instructions"),
    ),
    (
        "max-tokens-huge",
        json.dumps({"type": "session.update", "session": {"max_output_tokens": 100000}}),
        ("error", "invalid_value", "from 1 to 4096"),
    ),
    (
        "unknown-fields-ignored",
        json.dumps({"type": "session.update", "session": {"tools": [], "tracing": "auto", "frobnicate": 1}}),
        ("ok", "session.updated"),
    ),
    (
        "commit-empty-buffer",
        json.dumps({"type": "input_audio_buffer.commit"}),
        ("error", "input_audio_buffer_commit_empty", "100 ms"),
    ),
    ("clear-empty-buffer", json.dumps({"type": "input_audio_buffer.clear"}), ("ok", "input_audio_buffer.cleared")),
    ("cancel-nothing", json.dumps({"type": "response.cancel"}), ("error", "response_cancel_not_active", "")),
    ("response-in-transcription", json.dumps({"type": "response.create"}), ("error", "invalid_value", "transcription")),
    (
        "delete-unknown-id",
        json.dumps({"type": "conversation.item.delete", "item_id": "item_nope"}),
        ("error", "item_not_found", "item_nope"),
    ),
    (
        "retrieve-unknown-id",
        json.dumps({"type": "conversation.item.retrieve", "item_id": "item_nope"}),
        ("error", "item_not_found", "item_nope"),
    ),
    (
        "truncate-unknown-id",
        json.dumps({"type": "conversation.item.truncate", "item_id": "item_nope", "audio_end_ms": 5}),
        ("error", "item_not_found", "item_nope"),
    ),
    (
        "delete-id-number",
        json.dumps({"type": "conversation.item.delete", "item_id": 7}),
        ("error", "invalid_value", "item_id"),
    ),
    (
        "create-oversized-text",
        json.dumps(
            {
                "type": "conversation.item.create",
                "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "x" * 200_000}]},
            }
        ),
        ("error", "invalid_value", "at most 32768"),
    ),
    (
        "create-bad-role",
        json.dumps(
            {
                "type": "conversation.item.create",
                "item": {"type": "message", "role": "robot", "content": [{"type": "input_text", "text": "hi"}]},
            }
        ),
        ("error", "invalid_value", "item.role"),
    ),
    (
        "create-after-unknown",
        json.dumps(
            {
                "type": "conversation.item.create",
                "previous_item_id": "item_nope",
                "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
            }
        ),
        ("error", "item_not_found", "item_nope"),
    ),
    (
        "event-10MB",
        json.dumps({"type": "input_audio_buffer.append", "audio": "A" * (10 << 20)}),
        ("error", "message_too_large", "limit"),
    ),
]


@pytest.mark.parametrize("message, expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_abuse_gets_a_clear_answer_and_the_session_lives(tserver, message, expected):
    async def main():
        ws, _ = await open_session(tserver)
        await ws.send(message)
        ev = await next_event(ws, expected[1] if expected[0] == "ok" else "error", timeout=30)
        # the session still answers afterwards
        await ws.send(json.dumps({"type": "input_audio_buffer.clear"}))
        after = await next_event(ws, "input_audio_buffer.cleared", timeout=30)
        await ws.close()
        return ev, after

    ev, after = run(main(), 60)
    if expected[0] == "ok":
        assert ev["type"] == expected[1], ev
    else:
        _, code, text = expected
        err = ev.get("error") or {}
        assert ev["type"] == "error" and err.get("code") == code, ev
        assert text in (err.get("message") or "") + " " + str(err.get("param")), ev
        assert err.get("type") in ("invalid_request_error", "server_error")
    assert after["type"] == "input_audio_buffer.cleared"


def test_abuse_loses_no_audio_and_bystanders_do_not_notice(tserver, synth):
    """Every abuse case sent into one session between two halves of its speech: its transcript is whole;
    a bystander streaming at the same time gets its own transcript too."""
    pcm = pcm24(synth(SENTENCES[3]), tail_s=0.2)
    other = pcm24(synth(SENTENCES[4]), tail_s=0.2)
    half = len(pcm) // 2 & ~1

    async def bystander():
        ws, _ = await open_session(tserver)
        await update(ws, {"audio": {"input": {"turn_detection": None}}})
        for i in range(0, len(other), 4800):
            await ws.send(append_event(other[i : i + 4800]))
            await asyncio.sleep(0.05)
        await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
        ev = await next_event(ws, "conversation.item.input_audio_transcription.completed")
        await ws.close()
        return ev["transcript"]

    async def abuser():
        ws, _ = await open_session(tserver)
        await update(ws, {"audio": {"input": {"turn_detection": None}}})
        await ws.send(append_event(pcm[:half]))
        errors = 0
        for _, message, expected in CASES:
            if expected[0] == "ok" or expected[1] == "input_audio_buffer_commit_empty":
                continue  # valid events (they may change the session) and commits act on the buffer
            await ws.send(message)
            ev = await next_event(ws, "error", timeout=30)
            errors += ev["type"] == "error"
        await ws.send(append_event(pcm[half:]))
        await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
        ev = await next_event(ws, "conversation.item.input_audio_transcription.completed")
        await ws.close()
        return errors, ev["transcript"]

    async def main():
        return await asyncio.gather(abuser(), bystander())

    (errors, text), other_text = run(main(), 180)
    assert errors >= 35
    assert wer(SENTENCES[3], text) <= 0.15, text
    assert wer(SENTENCES[4], other_text) <= 0.15, other_text


def test_a_flood_of_2000_events_in_a_second(tserver, synth):
    """2,000 appends of 10 ms (20 s of speech and silence) sent as fast as possible: nothing is lost (the
    committed turn has the whole speech), and a bystander's session keeps answering within a second."""
    speech = pcm24(synth(SENTENCES[5]), tail_s=0.0)
    pcm = (speech * 20)[: 2000 * 480]  # 10 ms at 24 kHz = 480 bytes
    pcm += b"\x00" * (2000 * 480 - len(pcm))

    async def main():
        ws, _ = await open_session(tserver)
        await update(ws, {"audio": {"input": {"turn_detection": None}}})
        probe, _ = await open_session(tserver)
        t0 = time.monotonic()
        for i in range(2000):
            await ws.send(append_event(pcm[i * 480 : (i + 1) * 480]))
        sent = time.monotonic() - t0
        t1 = time.monotonic()
        await probe.send(json.dumps({"type": "input_audio_buffer.clear"}))
        await next_event(probe, "input_audio_buffer.cleared", timeout=30)
        probe_s = time.monotonic() - t1
        await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
        committed = await next_event(ws, "input_audio_buffer.committed", timeout=60)
        done = await next_event(ws, "conversation.item.input_audio_transcription.completed", timeout=120)
        await ws.close()
        await probe.close()
        return sent, probe_s, committed, done

    sent, probe_s, committed, done = run(main(), 240)
    assert committed["type"] == "input_audio_buffer.committed"
    assert done["usage"]["seconds"] == pytest.approx(20.0, abs=0.05)  # all 2,000 chunks are in the turn
    assert "piano" in done["transcript"].lower(), done
    assert probe_s < 1.0, (sent, probe_s)


def test_conversation_abuse(cserver):
    """On a conversation session: truncating past the audio or a part that does not exist, speaking text the
    voice cannot read, instructions of the wrong type, cancelling another response: each is refused naming
    the field, and the session goes on to answer."""

    async def main():
        ws, _ = await open_session(cserver, None)
        await ws.send(json.dumps({"type": "response.create", "response": {"speechrt_say": "Good morning to you."}}))
        created = await next_event(ws, "response.created")
        done = await next_event(ws, "response.done")
        item = done["response"]["output"][0]["id"]
        answers = {}
        for name, ev in {
            "past-the-audio": {
                "type": "conversation.item.truncate",
                "item_id": item,
                "content_index": 0,
                "audio_end_ms": 10**7,
            },
            "negative-offset": {
                "type": "conversation.item.truncate",
                "item_id": item,
                "content_index": 0,
                "audio_end_ms": -5,
            },
            "no-such-part": {
                "type": "conversation.item.truncate",
                "item_id": item,
                "content_index": 3,
                "audio_end_ms": 10,
            },
            "emoji-to-say": {"type": "response.create", "response": {"speechrt_say": "Hello 😀"}},
            "instructions-number": {"type": "response.create", "response": {"instructions": 5}},
            "modalities-bad": {"type": "response.create", "response": {"output_modalities": ["video"]}},
            "cancel-other": {"type": "response.cancel", "response_id": "resp_nope"},
        }.items():
            await ws.send(json.dumps(ev))
            answers[name] = await next_event(ws, "conversation.item.truncated", "response.created")
        await ws.send(
            json.dumps({"type": "conversation.item.truncate", "item_id": item, "content_index": 0, "audio_end_ms": 200})
        )
        truncated = await next_event(ws, "conversation.item.truncated")
        await ws.close()
        return created, answers, truncated

    created, answers, truncated = run(main(), 120)
    assert created["type"] == "response.created"
    params = {
        "past-the-audio": "audio_end_ms",
        "negative-offset": "audio_end_ms",
        "no-such-part": "content_index",
        "emoji-to-say": "response.speechrt_say",
        "instructions-number": "response.instructions",
        "modalities-bad": "response.output_modalities",
        "cancel-other": None,
    }
    for name, param in params.items():
        ev = answers[name]
        assert ev["type"] == "error" and ev["error"]["message"], (name, ev)
        assert param is None or ev["error"]["param"] == param, (name, ev)
    assert "U+1F600" in answers["emoji-to-say"]["error"]["message"]
    assert truncated["type"] == "conversation.item.truncated" and truncated["audio_end_ms"] == 200


def test_huge_conversation_items_are_refused_without_blocking_others(cserver):
    """Twenty 900 KB items: each refused at once (the per-item cap); meanwhile another session's events are
    answered within a second."""
    big = {
        "type": "conversation.item.create",
        "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "word " * 180_000}]},
    }

    async def main():
        ws, _ = await open_session(cserver, None)
        probe, _ = await open_session(cserver, None)
        codes = []
        t0 = time.monotonic()
        for _ in range(20):
            await ws.send(json.dumps(big))
            codes.append((await next_event(ws, "conversation.item.added"))["error"]["code"])
        spent = time.monotonic() - t0
        t1 = time.monotonic()
        await probe.send(json.dumps({"type": "input_audio_buffer.clear"}))
        await next_event(probe, "input_audio_buffer.cleared")
        probe_s = time.monotonic() - t1
        await ws.close()
        await probe.close()
        return codes, spent, probe_s

    codes, spent, probe_s = run(main(), 120)
    assert codes == ["invalid_value"] * 20
    assert spent < 20 and probe_s < 1.0, (spent, probe_s)


def test_a_transcription_only_server_makes_transcription_sessions(tserver):
    """Without ?intent=transcription, a session of a server with no language model or voice is a transcription
    session (it was 'realtime', and every turn it ended then failed with an internal error); asking for a
    conversation says why not."""

    async def main():
        ws, created = await open_session(tserver, intent=None)
        await ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime"}}))
        ev = await next_event(ws, "session.updated", timeout=30)
        await ws.close()
        return created, ev

    created, ev = run(main(), 60)
    assert created["session"]["type"] == "transcription"
    assert ev["type"] == "error" and "transcription only" in ev["error"]["message"], ev
    from speechrt.client import Client, RealtimeError  # the SDK says so too, instead of waiting for a reply

    with Client(tserver.url) as c, pytest.raises(RealtimeError, match="transcription session"):
        c.talk(np.zeros(16000, np.float32), 16000)
