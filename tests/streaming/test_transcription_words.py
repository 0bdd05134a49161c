"""A transcription session's extras over loopback: token logprobs (session.include) and word times (the
speechrt_word_timestamps extension) on the final transcript, only when asked."""

from __future__ import annotations

import asyncio
import base64
import json

import numpy as np

from speechrt.cli_asr import sample_path
from speechrt.models.audio import load_audio, resample
from speechrt.models.wer import wer

SAMPLE_TEXT = sample_path().with_suffix(".txt").read_text()


def _pcm24(audio16k: np.ndarray) -> str:
    a = resample(audio16k, 16000, 24000)
    return base64.b64encode((np.clip(a, -1, 1) * 32767).astype("<i2").tobytes()).decode()


async def _session(srv, session: dict):
    from websockets.asyncio.client import connect

    ws = await connect(f"ws://127.0.0.1:{srv.port}/v1/realtime?intent=transcription", max_size=None)
    await ws.recv()  # session.created
    await ws.send(json.dumps({"type": "session.update", "session": session}))
    return ws, json.loads(await ws.recv())


async def _completed(ws, audio_b64: str) -> dict:
    await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": audio_b64}))
    await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
    while True:
        ev = json.loads(await asyncio.wait_for(ws.recv(), 120))
        assert ev["type"] != "error", ev
        if ev["type"] == "conversation.item.input_audio_transcription.completed":
            return ev


def test_final_transcript_carries_logprobs_and_words_when_asked(transcription_server, asr):
    audio = load_audio(sample_path())
    pcm = _pcm24(audio)
    asking = {
        "type": "transcription",
        "include": ["item.input_audio_transcription.logprobs"],
        "audio": {"input": {"turn_detection": None, "transcription": {"speechrt_word_timestamps": True}}},
    }

    async def main():
        ws, updated = await _session(transcription_server, asking)
        assert updated["type"] == "session.updated", updated
        s = updated["session"]
        assert s["include"] == ["item.input_audio_transcription.logprobs"]
        assert s["audio"]["input"]["transcription"]["speechrt_word_timestamps"] is True
        done = await _completed(ws, pcm)
        # a session that did not ask gets the plain event
        plain, _ = await _session(
            transcription_server, {"type": "transcription", "audio": {"input": {"turn_detection": None}}}
        )
        bare = await _completed(plain, pcm)
        # bad values are named
        await ws.send(json.dumps({"type": "session.update", "session": {"include": ["item.frobnicate"]}}))
        while (err := json.loads(await asyncio.wait_for(ws.recv(), 30)))["type"] != "error":
            pass  # the item's conversation.item.done
        await ws.close()
        await plain.close()
        return done, bare, err

    done, bare, err = asyncio.run(asyncio.wait_for(main(), 240))

    text = done["transcript"]
    assert wer(SAMPLE_TEXT, text) <= 0.15, text
    lp = done["logprobs"]
    assert "".join(t["token"] for t in lp).strip() == text
    assert all(t["logprob"] <= 0 and bytes(t["bytes"]).decode() == t["token"] for t in lp)
    words = done["speechrt"]["words"]
    assert "".join(w["word"] for w in words).strip() == text
    assert all(0 <= w["start"] <= w["end"] <= len(audio) / 16000 + 0.5 for w in words)
    # the same words and times as the offline alignment of the same audio and tokens
    offline, _ = asr.align(audio, asr.transcribe_batch([audio])[0].tokens)
    if [w.word for w in offline] == [w["word"] for w in words]:
        diffs = np.abs([w.start - v["start"] for w, v in zip(offline, words)])
        assert np.median(diffs) <= 0.1
    assert "logprobs" not in bare and "speechrt" not in bare and wer(SAMPLE_TEXT, bare["transcript"]) <= 0.15
    assert err["type"] == "error" and err["error"]["param"] == "session.include"
    assert "item.input_audio_transcription.logprobs" in err["error"]["message"]
