"""The Realtime server over noise and music-like tones: no transcription with invented text.

A turn without speech is still a committed item of the conversation, so it gets its
`conversation.item.input_audio_transcription.completed` event — with an empty transcript (as OpenAI's
API does for a committed buffer without speech). Under server_vad, noise that Silero never takes for
speech opens no turn at all: no event."""

from __future__ import annotations

import asyncio
import base64
import json

import numpy as np
import pytest
from nonspeech import pink, tones, white  # tests/nonspeech.py: the signals of the pipeline tests

from speechrt.models.audio import resample

COMPLETED = "conversation.item.input_audio_transcription.completed"


def pcm24(audio16k: np.ndarray) -> bytes:
    return (np.clip(resample(audio16k, 16000, 24000), -1, 1) * 32767).astype("<i2").tobytes()


async def session_events(srv, audio16k: np.ndarray, turn_detection, commit: bool, quiet_s: float = 4.0) -> list[dict]:
    """Every event of a transcription session that is sent `audio16k` (then 1 s of silence), until the
    server has been quiet for `quiet_s` seconds after a completed event (or after the audio)."""
    from websockets.asyncio.client import connect

    ws = await connect(f"ws://127.0.0.1:{srv.port}/v1/realtime?intent=transcription", max_size=None)
    await ws.recv()
    await ws.send(
        json.dumps(
            {
                "type": "session.update",
                "session": {"type": "transcription", "audio": {"input": {"turn_detection": turn_detection}}},
            }
        )
    )
    pcm = pcm24(np.concatenate([audio16k, np.zeros(16000, np.float32)]))
    for i in range(0, len(pcm), 9600):
        await ws.send(
            json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm[i : i + 9600]).decode()})
        )
    if commit:
        await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
    events = []
    try:
        while True:
            events.append(json.loads(await asyncio.wait_for(ws.recv(), quiet_s if not commit else 60)))
            if commit and events[-1]["type"] in (COMPLETED, "error"):
                break
    except asyncio.TimeoutError:
        pass
    await ws.close()
    return events


def test_noise_and_tones_never_complete_with_invented_text(transcription_server):
    signals = {
        "white": white(10),
        "pink": pink(10),
        "tones": tones(10),
        "loud tones": tones(10, seed=7, amp=0.5),
        "silence": np.zeros(16000 * 5, np.float32),
    }

    async def server_vad(name, audio):
        """server_vad: whatever turns Silero opens end with an empty transcript -> how many it opened."""
        events = await session_events(transcription_server, audio, {"type": "server_vad"}, commit=False)
        assert not [e for e in events if e["type"] == "error"], (name, events)
        done = [e["transcript"] for e in events if e["type"] == COMPLETED]
        deltas = [e["delta"] for e in events if e["type"].endswith("transcription.delta")]
        assert all(t == "" for t in done) and not "".join(deltas).strip(), (name, done, deltas)
        return len(done)

    async def manual_commit(name, audio):
        """manual commit: the turn is transcribed whatever it holds; the guards leave its text empty."""
        events = await session_events(transcription_server, audio[: 16000 * 5], None, commit=True)
        done = [e for e in events if e["type"] == COMPLETED]
        assert len(done) == 1 and done[0]["transcript"] == "", (name, events[-3:])

    async def main():
        # each signal in its own session, the sessions at once (each waits for the server to go quiet): the
        # server_vad sessions first, then the committed ones
        vad = {name: audio for name, audio in signals.items() if name != "silence"}
        opened = await asyncio.gather(*(server_vad(name, audio) for name, audio in vad.items()))
        await asyncio.gather(*(manual_commit(name, audio) for name, audio in signals.items()))
        return dict(zip(vad, opened))

    seen = asyncio.run(asyncio.wait_for(main(), 240))
    assert seen["white"] == 0 and seen["pink"] == 0, seen  # Silero opens no turn in noise


def test_rest_transcription_with_vad_filter(transcription_server):
    """POST /v1/audio/transcriptions with the vad_filter form field: 5 s of leading silence are skipped and
    the segments keep the upload's times; a value that is not a boolean is refused."""
    import io

    import soundfile as sf

    openai = pytest.importorskip("openai")
    from speechrt.cli_asr import sample_path

    speech, sr = sf.read(sample_path(), dtype="float32")
    buf = io.BytesIO()
    sf.write(buf, np.concatenate([np.zeros(5 * sr, np.float32), speech]), sr, format="WAV")
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{transcription_server.port}/v1", api_key="x", max_retries=0)
    out = client.audio.transcriptions.create(
        model="whisper-1",
        file=("gap.wav", buf.getvalue()),
        response_format="verbose_json",
        extra_body={"vad_filter": "true"},
    )
    assert out.text.strip() and out.segments[0].start >= 4.5, [(s.start, s.end) for s in out.segments]
    with pytest.raises(openai.BadRequestError, match="vad_filter 'maybe' is not a boolean"):
        client.audio.transcriptions.create(
            model="whisper-1", file=("gap.wav", buf.getvalue()), extra_body={"vad_filter": "maybe"}
        )
