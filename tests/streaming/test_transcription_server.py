"""Transcription sessions over loopback with real clients: the official openai SDK, our SDK, raw
websockets for the bad-input suite."""

from __future__ import annotations

import asyncio
import base64
import json
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

from speechrt.models.audio import resample
from speechrt.models.wer import wer

SENTENCES = [
    "The weather will be sunny tomorrow with a light breeze.",
    "Please remember to close the windows.",
    "She bought three apples and a loaf of bread.",
    "The meeting has been moved to Thursday afternoon.",
    "Our train was delayed because of a signal problem.",
    "He plays the piano every evening.",
    "The museum opens at nine and closes at five.",
    "Can you tell me the way to the post office?",
    "The children built a sand castle on the beach.",
    "Turn left at the traffic lights.",
    "My sister is studying chemistry at the university.",
    "The library has thousands of books.",
    "We watched a documentary about whales last night.",
    "The restaurant on the corner serves pasta.",
    "Dogs need regular exercise and a healthy diet.",
    "The river flows quietly through the valley.",
    "I would like a cup of coffee with sugar.",
    "The new phone has a bigger screen.",
    "Farmers are worried about the lack of rain.",
    "The pilot said we would land in twenty minutes.",
]


def pcm24(audio16k: np.ndarray, tail_s: float = 1.0) -> bytes:
    a = resample(np.concatenate([audio16k, np.zeros(int(16000 * tail_s), np.float32)]), 16000, 24000)
    return (np.clip(a, -1, 1) * 32767).astype("<i2").tobytes()


def url(srv, path="/v1/realtime"):
    return f"ws://127.0.0.1:{srv.port}{path}"


def test_openai_sdk_transcription_session(transcription_server, synth):
    openai = pytest.importorskip("openai")
    text = SENTENCES[0]
    pcm = pcm24(synth(text))

    async def main():
        client = openai.AsyncOpenAI(
            api_key="unused", websocket_base_url=f"ws://127.0.0.1:{transcription_server.port}/v1"
        )
        seen, deltas = [], []
        async with client.realtime.connect(model="speechrt", extra_query={"intent": "transcription"}) as conn:
            await conn.session.update(
                session={
                    "type": "transcription",
                    "audio": {
                        "input": {
                            "format": {"type": "audio/pcm", "rate": 24000},
                            "turn_detection": {
                                "type": "server_vad",
                                "threshold": 0.5,
                                "prefix_padding_ms": 300,
                                "silence_duration_ms": 300,
                            },
                        }
                    },
                }
            )

            async def send():
                for i in range(0, len(pcm), 9600):  # 200 ms chunks, paced at 4x real time
                    await conn.input_audio_buffer.append(audio=base64.b64encode(pcm[i : i + 9600]).decode())
                    await asyncio.sleep(0.05)

            sender = asyncio.create_task(send())
            async for ev in conn:
                seen.append(ev.type)
                if ev.type == "conversation.item.input_audio_transcription.delta":
                    deltas.append(ev.delta)
                if ev.type == "conversation.item.input_audio_transcription.completed":
                    await sender
                    return seen, deltas, ev.transcript

    seen, deltas, transcript = asyncio.run(asyncio.wait_for(main(), 120))
    assert seen[:2] == ["session.created", "session.updated"]
    for t in (
        "input_audio_buffer.speech_started",
        "input_audio_buffer.speech_stopped",
        "input_audio_buffer.committed",
        "conversation.item.added",
    ):
        assert t in seen
    assert seen.index("input_audio_buffer.speech_started") < seen.index("input_audio_buffer.speech_stopped")
    assert wer(text, transcript) <= 0.1, transcript
    assert deltas and wer(text, "".join(deltas)) <= 0.2


def test_our_sdk_sync_client(transcription_server, synth, tmp_path):
    import soundfile as sf

    from speechrt.client import Client, SpeechStarted, TranscriptCompleted

    p = tmp_path / "q.wav"
    sf.write(p, synth(SENTENCES[1]), 16000)
    with Client(url(transcription_server), transcription=True) as c:
        assert wer(SENTENCES[1], c.transcribe_file(p)) <= 0.1
        audio = synth(SENTENCES[2])
        chunks = [audio[i : i + 3200] for i in range(0, len(audio), 3200)] + [np.zeros(16000, np.float32)]
        events = []
        for ev in c.transcribe_stream(chunks, 16000):
            events.append(ev)
            if isinstance(ev, TranscriptCompleted):
                break
    assert isinstance(events[0], SpeechStarted)
    # 0.25: batch composition changes rounding, which can flip one borderline word of nine
    assert wer(SENTENCES[2], events[-1].transcript) <= 0.25


async def _raw(srv, headers=None, path="/v1/realtime?intent=transcription"):
    from websockets.asyncio.client import connect

    ws = await connect(url(srv, path), additional_headers=headers or {}, max_size=None)
    first = json.loads(await ws.recv())
    return ws, first


async def _next(ws, type_, timeout=60):
    while True:
        ev = json.loads(await asyncio.wait_for(ws.recv(), timeout))
        if ev["type"] == type_ or ev["type"] == "error":
            return ev


def test_bad_inputs_get_errors_and_lose_nothing(transcription_server, synth):
    pcm = pcm24(synth(SENTENCES[3]), tail_s=0.2)

    async def main():
        ws, created = await _raw(transcription_server)
        other, _ = await _raw(transcription_server)  # a bystander session that must be unaffected
        assert created["type"] == "session.created"
        await ws.send(json.dumps({"type": "session.update", "session": {"audio": {"input": {"turn_detection": None}}}}))
        assert (await _next(ws, "session.updated"))["type"] == "session.updated"
        errors = {}

        async def expect(msg, code):
            await ws.send(msg)
            ev = await _next(ws, "error")
            assert ev["type"] == "error" and ev["error"]["code"] == code, ev
            assert ev["error"]["message"]
            errors[code] = ev["error"]["message"]

        # half of the audio before the errors, half after: nothing may be lost in between
        half = len(pcm) // 2 & ~1
        await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm[:half]).decode()}))
        await expect("{not json", "invalid_json")
        await expect(json.dumps({"type": "input_audio_buffer.frobnicate"}), "invalid_event_type")
        await expect(json.dumps(["a", "list"]), "invalid_event")
        await expect(json.dumps({"type": "input_audio_buffer.append", "audio": "@@@not base64@@@"}), "invalid_audio")
        await expect(
            json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(b"\x01\x02\x03").decode()}),
            "invalid_audio",
        )
        await expect(
            json.dumps({"type": "session.update", "session": {"audio": {"input": {"format": {"type": "audio/flac"}}}}}),
            "invalid_audio_format",
        )
        await expect(
            json.dumps({"type": "session.update", "session": {"input_audio_format": "mp3"}}), "invalid_audio_format"
        )
        await expect(json.dumps({"type": "input_audio_buffer.append", "audio": "A" * (2 << 20)}), "message_too_large")
        await expect(json.dumps({"type": "response.cancel"}), "response_cancel_not_active")
        await expect(json.dumps({"type": "response.create"}), "invalid_value")
        await expect(
            json.dumps({"type": "conversation.item.truncate", "item_id": "item_nope", "audio_end_ms": 5}),
            "item_not_found",
        )
        await expect(
            json.dumps(
                {
                    "type": "session.update",
                    "session": {"audio": {"input": {"turn_detection": {"type": "server_vad", "threshold": 7}}}},
                }
            ),
            "invalid_value",
        )
        await expect(json.dumps({"type": "session.update", "session": {"voice": "nope"}}), "invalid_value")
        assert "voice 'nope' is not available" in errors["invalid_value"]
        # OpenAI's voice names still pass on a server that loaded no voice
        await ws.send(json.dumps({"type": "session.update", "session": {"voice": "alloy"}}))
        assert (await _next(ws, "session.updated"))["type"] == "session.updated"
        assert "valid client events" in errors["invalid_event_type"]
        assert "audio/pcm" in errors["invalid_audio_format"]
        await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm[half:]).decode()}))
        await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
        done = await _next(ws, "conversation.item.input_audio_transcription.completed")
        assert wer(SENTENCES[3], done["transcript"]) <= 0.1, done
        # out of order: committing an empty buffer
        await expect(json.dumps({"type": "input_audio_buffer.commit"}), "input_audio_buffer_commit_empty")
        # the bystander still works
        await other.send(
            json.dumps({"type": "session.update", "session": {"audio": {"input": {"turn_detection": None}}}})
        )
        await _next(other, "session.updated")
        await other.send(json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm).decode()}))
        await other.send(json.dumps({"type": "input_audio_buffer.commit"}))
        done = await _next(other, "conversation.item.input_audio_transcription.completed")
        assert wer(SENTENCES[3], done["transcript"]) <= 0.1
        await ws.close()
        await other.close()

    asyncio.run(asyncio.wait_for(main(), 180))


def test_api_key_session_cap_and_http_endpoints(asr, server_factory):
    from websockets.exceptions import InvalidStatus

    from speechrt.streaming.config import ServerOptions

    with server_factory(ServerOptions(port=0, api_key="sekrit", max_sessions=2), asr) as srv:

        async def main():
            with pytest.raises(InvalidStatus) as e:
                await _raw(srv, {"Authorization": "Bearer wrong"})
            assert e.value.response.status_code == 401
            with pytest.raises(InvalidStatus):
                await _raw(srv)
            a, ca = await _raw(srv, {"Authorization": "Bearer sekrit"})
            b, cb = await _raw(srv, {"Authorization": "Bearer sekrit"})
            assert ca["type"] == cb["type"] == "session.created"
            c, cc = await _raw(srv, {"Authorization": "Bearer sekrit"})  # third: over the cap
            assert cc["type"] == "error" and cc["error"]["code"] == "session_limit_reached"
            assert "2 sessions" in cc["error"]["message"]
            await asyncio.wait_for(c.wait_closed(), 10)
            assert c.close_code == 1013
            with pytest.raises(InvalidStatus) as e:  # a browser page from elsewhere
                await _raw(srv, {"Authorization": "Bearer sekrit", "Origin": "http://evil.example"})
            assert e.value.response.status_code == 403
            await a.close()
            await b.close()

        asyncio.run(main())
        health = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{srv.port}/healthz").read())
        assert health["status"] == "ok" and health["max_sessions"] == 2
        # the models loaded, no other: speech recognition only here (the voice was listed though none was loaded)
        assert health["models"] == {"asr": [asr.name], "lm": [], "tts": []} and health["conversation"] is False
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{srv.port}/metrics").read().decode()
        assert "speechrt_sessions_rejected_total 1" in metrics and "speechrt_auth_failures_total 2" in metrics
        assert "# TYPE speechrt_final_transcript_latency_seconds summary" in metrics
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(f"http://127.0.0.1:{srv.port}/nope")
        assert e.value.code == 404


def test_graceful_shutdown_finishes_turns_in_flight(asr, synth):
    """A turn committed just before shutdown still gets its transcript; new sessions are refused."""
    from websockets.asyncio.client import connect

    from speechrt.streaming.config import ServerOptions
    from speechrt.streaming.server import SpeechServer

    pcm = pcm24(synth(SENTENCES[4]), tail_s=0.2)

    async def main():
        srv = await SpeechServer(ServerOptions(port=0), asr).start()
        ws = await connect(url(srv, "/v1/realtime?intent=transcription"), max_size=None)
        await ws.recv()
        await ws.send(json.dumps({"type": "session.update", "session": {"audio": {"input": {"turn_detection": None}}}}))
        await _next(ws, "session.updated")
        await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm).decode()}))
        await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
        await _next(ws, "input_audio_buffer.committed")
        stopping = asyncio.create_task(srv.shutdown(graceful=True))
        await asyncio.sleep(0.05)
        late, first = await _raw(srv)  # while draining: refused with a clear error
        assert first["type"] == "error" and "shutting down" in first["error"]["message"]
        done = await _next(ws, "conversation.item.input_audio_transcription.completed")
        assert wer(SENTENCES[4], done["transcript"]) <= 0.15
        await asyncio.wait_for(stopping, 60)
        await asyncio.wait_for(ws.wait_closed(), 10)

    asyncio.run(asyncio.wait_for(main(), 120))


def test_semantic_vad_ends_a_finished_turn_before_the_long_pause(transcription_server, synth):
    """semantic_vad: speech followed by 500 ms of silence — shorter than the 800 ms an unfinished-sounding
    turn waits at eagerness high, and than the 2 s at medium — ends the turn when its transcript reads as
    finished; the same audio under server_vad with a 1 s pause does not end it. Bad eagerness: an error."""
    pcm = pcm24(synth(SENTENCES[7]), tail_s=0.5)

    took = []  # seconds from the last append to a turn's transcript

    async def turn(td, timeout=8.0):
        ws, _ = await _raw(transcription_server)
        await ws.send(
            json.dumps(
                {
                    "type": "session.update",
                    "session": {"type": "transcription", "audio": {"input": {"turn_detection": td}}},
                }
            )
        )
        upd = await _next(ws, "session.updated")
        assert upd["type"] == "session.updated", upd
        for i in range(0, len(pcm), 9600):
            await ws.send(
                json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm[i : i + 9600]).decode()})
            )
        t0 = time.monotonic()
        try:
            done = await _next(ws, "conversation.item.input_audio_transcription.completed", timeout=timeout)
            took.append(time.monotonic() - t0)
        except asyncio.TimeoutError:
            done = None
        await ws.close()
        return upd["session"]["audio"]["input"]["turn_detection"], done

    async def main():
        td, done = await turn({"type": "semantic_vad", "eagerness": "high"})
        assert td == {"type": "semantic_vad", "eagerness": "high", "create_response": True, "interrupt_response": True}
        assert done is not None and done["type"] != "error", done
        assert wer(SENTENCES[7], done["transcript"]) <= 0.15, done["transcript"]
        _, done = await turn({"type": "semantic_vad"})  # auto = medium
        assert done is not None and wer(SENTENCES[7], done["transcript"]) <= 0.15
        print(f"semantic turns came back in {took}")
        # no turn end: waited three times as long as the slower semantic turn took to come back (4 s at least)
        _, none = await turn({"type": "server_vad", "silence_duration_ms": 1000}, max(4.0, 3 * max(took)))
        assert none is None
        ws, _ = await _raw(transcription_server)
        await ws.send(
            json.dumps(
                {
                    "type": "session.update",
                    "session": {"audio": {"input": {"turn_detection": {"type": "semantic_vad", "eagerness": "eager"}}}},
                }
            )
        )
        err = await _next(ws, "session.updated")
        assert err["type"] == "error" and "eagerness" in err["error"]["message"]
        assert "low, medium, high, auto" in err["error"]["message"]
        await ws.close()

    asyncio.run(asyncio.wait_for(main(), 120))


def test_early_transcript_becomes_the_final_one(asr, server_factory, synth):
    """Speech streamed at real-time pace, then silence: the turn's transcript begins when the input goes
    quiet, before Silero confirms the pause, and is the final transcript (counted in /metrics); the
    speech_stopped time is still Silero's, within the recording's trailing silence."""
    from speechrt.streaming.config import ServerOptions

    audio = synth(SENTENCES[12])
    pcm = pcm24(audio, tail_s=0.8)
    speech_end_ms = 1000 * (np.flatnonzero(np.abs(audio) > 0.01)[-1] + 1) / 16000

    with server_factory(ServerOptions(port=0, partial_interval=0, silence_duration_ms=200), asr) as srv:

        async def main():
            ws, _ = await _raw(srv)
            stopped = None
            for i in range(0, len(pcm), 4800):  # 100 ms chunks at real-time pace
                await ws.send(
                    json.dumps(
                        {"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm[i : i + 4800]).decode()}
                    )
                )
                await asyncio.sleep(0.1)
            while True:
                ev = json.loads(await asyncio.wait_for(ws.recv(), 30))
                if ev["type"] == "input_audio_buffer.speech_stopped":
                    stopped = ev
                if ev["type"] == "conversation.item.input_audio_transcription.completed":
                    await ws.close()
                    return stopped, ev

        stopped, done = asyncio.run(asyncio.wait_for(main(), 60))
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{srv.port}/metrics").read().decode()
    assert wer(SENTENCES[12], done["transcript"]) <= 0.1, done["transcript"]
    assert speech_end_ms - 50 <= stopped["audio_end_ms"] <= speech_end_ms + 300, (stopped, speech_end_ms)
    assert "speechrt_asr_early_finals_total 1" in metrics
    # every 32 ms frame of the 16 kHz audio went through voice activity detection (the resampler may hold back a
    # few samples), in well under the audio's duration
    values = dict(line.rsplit(" ", 1) for line in metrics.splitlines() if line.startswith("speechrt_vad_"))
    frames = len(pcm) // 2 * 2 // 3 // 512
    assert frames - 2 <= int(values["speechrt_vad_frames_total"]) <= frames, (values, frames)
    assert 0 < float(values["speechrt_vad_seconds_total"]) < len(pcm) / 2 / 24000 / 2, values
    # the chunks ran in batched ticks (at most one per chunk here: one stream), and the event loop's CPU per session
    # is shown: the session was open at least as long as its audio took to stream, the loop spent some CPU on it
    assert 0 < int(values["speechrt_vad_ticks_total"]) <= -(-len(pcm) // 4800), values
    values = dict(line.rsplit(" ", 1) for line in metrics.splitlines() if line.startswith("speechrt_"))
    streamed_s = len(pcm) // 4800 * 0.1
    assert float(values["speechrt_session_seconds_total"]) >= streamed_s, values
    loop_cpu = float(values["speechrt_event_loop_cpu_seconds_total"])
    assert 0 < loop_cpu and float(values["speechrt_event_loop_cpu_per_session"]) == pytest.approx(
        loop_cpu / float(values["speechrt_session_seconds_total"]), rel=0.05, abs=1e-5
    ), values
    assert float(values["speechrt_host_cpu_per_session"]) > float(values["speechrt_event_loop_cpu_per_session"])


def test_session_language_and_prompt_reach_the_transcriber(transcription_server, asr, synth):
    """A language the model does not recognize is refused naming the valid ones; the session's prompt is
    the transcriber's initial prompt: the committed turn's transcript is the pipeline's with that prompt."""
    from speechrt.pipelines.asr import TranscribeOptions

    audio = synth(SENTENCES[6])
    prompt = "Opening hours of the city museum, nine to five."
    want = asr.transcribe_batch([audio], TranscribeOptions(without_timestamps=True, initial_prompt=prompt))[0].text
    plain = asr.transcribe_batch([audio], TranscribeOptions(without_timestamps=True))[0].text
    assert plain.split() != want.split()  # the prompt changes this transcript (numbers in words, not digits)

    async def main():
        ws, _ = await _raw(transcription_server)
        await ws.send(
            json.dumps(
                {
                    "type": "session.update",
                    "session": {"audio": {"input": {"turn_detection": None, "transcription": {"language": "fr"}}}},
                }
            )
        )
        err = await _next(ws, "session.updated")
        assert err["type"] == "error" and err["error"]["code"] == "invalid_value", err
        assert "valid: en" in err["error"]["message"]
        assert err["error"]["param"] == "session.audio.input.transcription.language"
        await ws.send(
            json.dumps(
                {
                    "type": "session.update",
                    "session": {
                        "audio": {
                            "input": {"turn_detection": None, "transcription": {"language": "en", "prompt": prompt}}
                        }
                    },
                }
            )
        )
        updated = await _next(ws, "session.updated")
        assert updated["session"]["audio"]["input"]["transcription"] == {
            "model": asr.name,
            "language": "en",
            "prompt": prompt,
            "speechrt_word_timestamps": False,
        }, updated
        await ws.send(
            json.dumps(
                {"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm24(audio, tail_s=0.0)).decode()}
            )
        )
        await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
        done = await _next(ws, "conversation.item.input_audio_transcription.completed")
        await ws.close()
        return done["transcript"]

    got = asyncio.run(asyncio.wait_for(main(), 120))
    assert wer(SENTENCES[6], got) <= 0.1, got
    # the wire audio went through 24 kHz and back: the same words as the pipeline's, with the prompt
    assert got.split() == want.split(), (got, want)


def test_final_margin_is_a_server_option():
    """`serve --final-margin` sets how much padding after a turn its final transcript encodes (default
    FINAL_MARGIN_S; live transcripts keep 1 s); out of [1, 30] s it is refused naming the range."""
    import argparse

    from speechrt import cli_serve
    from speechrt.errors import UserError
    from speechrt.streaming.asr_options import FINAL_MARGIN_S, asr_options
    from speechrt.streaming.config import ServerOptions
    from speechrt.streaming.realtime.config import SessionConfig

    p = argparse.ArgumentParser()
    cli_serve.add_arguments(p)
    assert cli_serve.options(p.parse_args([])).final_margin == FINAL_MARGIN_S
    assert cli_serve.options(p.parse_args(["--final-margin", "4"])).final_margin == 4
    with pytest.raises(UserError, match=r"final_margin must be in \[1, 30\]"):
        cli_serve.options(p.parse_args(["--final-margin", "0.5"]))
    cfg = SessionConfig(type="transcription")
    assert asr_options(cfg).trim_margin == FINAL_MARGIN_S and asr_options(cfg, live=True).trim_margin == 1.0
    assert asr_options(cfg, final_margin=4).trim_margin == 4 and ServerOptions().final_margin == FINAL_MARGIN_S


def test_loaded_final_margin_is_a_server_option():
    """`serve --loaded-final-margin`: the final margin while the engine is loaded (default 3 s, at most the final
    margin; 0: never less than the final margin); out of [1, 30] s it is refused naming the range."""
    import argparse

    from speechrt import cli_serve
    from speechrt.errors import UserError
    from speechrt.streaming.asr_options import LOADED_FINAL_MARGIN_S
    from speechrt.streaming.config import ServerOptions

    p = argparse.ArgumentParser()
    cli_serve.add_arguments(p)
    assert cli_serve.options(p.parse_args([])).loaded_final_margin == LOADED_FINAL_MARGIN_S == 3
    assert cli_serve.options(p.parse_args(["--final-margin", "2"])).loaded_final_margin == 2
    assert cli_serve.options(p.parse_args(["--loaded-final-margin", "5"])).loaded_final_margin == 5
    assert cli_serve.options(p.parse_args(["--loaded-final-margin", "0"])).loaded_final_margin is None
    # a GPU's encoder has time for the full margin: none by default there (3 s lost words of short questions)
    assert cli_serve.options(p.parse_args(["--device", "cuda"])).loaded_final_margin is None
    assert (
        cli_serve.options(p.parse_args(["--device", "cuda:1", "--loaded-final-margin", "5"])).loaded_final_margin == 5
    )
    with pytest.raises(UserError, match=r"loaded_final_margin must be in \[1, 30\]"):
        ServerOptions(loaded_final_margin=0.5)
    assert ServerOptions(final_margin=2).loaded_final_margin == 3  # no more than a final's own margin is applied


def test_max_batch_is_a_server_option():
    """`serve --max-batch`: transcripts of one kind run together in one model step at most (default 8 on a CPU,
    32 on a GPU); under 1 it is refused, saying so."""
    import argparse

    from speechrt import cli_serve
    from speechrt.errors import UserError
    from speechrt.streaming.config import ServerOptions

    p = argparse.ArgumentParser()
    cli_serve.add_arguments(p)
    assert cli_serve.options(p.parse_args([])).max_batch == ServerOptions().max_batch == 8
    assert cli_serve.options(p.parse_args(["--max-batch", "32"])).max_batch == 32
    assert cli_serve.options(p.parse_args(["--device", "cuda"])).max_batch == 32
    assert cli_serve.options(p.parse_args(["--device", "cuda", "--max-batch", "4"])).max_batch == 4
    with pytest.raises(UserError, match="max_batch must be >= 1, got 0"):
        cli_serve.options(p.parse_args(["--max-batch", "0"]))


def test_a_client_that_closed_frees_its_slot_while_its_last_audio_is_still_processed(asr, synth, server_factory):
    """--max-sessions counts open connections: a client that sent audio and closed does not hold its slot while
    that audio's voice activity detection is still running (slowed here to 3 s, as under load), so the next
    client is admitted at once; the late work is dropped with the session."""
    import time

    from speechrt.models.silero import VadStream
    from speechrt.streaming.config import ServerOptions

    with server_factory(ServerOptions(port=0, max_sessions=1), asr) as srv:
        real = srv.vad.vad

        class SlowVad:
            def stream(self):
                return VadStream(self)

            calls = 0

            def run_batch(self, windows, states):  # what each tick of chunks calls, on the worker's thread
                SlowVad.calls += 1
                time.sleep(3.0)
                return real.run_batch(windows, states)

        srv.vad.vad = SlowVad()
        pcm = pcm24(synth(SENTENCES[0]))[: 24000 * 2]  # 1 s

        async def main():
            a, ca = await _raw(srv)
            assert ca["type"] == "session.created"
            await a.send(json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm).decode()}))
            await asyncio.sleep(0.3)  # the server is inside that audio's slow VAD now
            await a.close()
            t0 = time.monotonic()
            while True:  # at once: well before the 3-s VAD returns (a refused client retries)
                b, cb = await _raw(srv)
                if cb["type"] == "session.created":
                    break
                assert cb["error"]["code"] == "session_limit_reached"
                await b.close()
                assert time.monotonic() - t0 < 1.5, "the closed client still held the only slot"
                await asyncio.sleep(0.05)
            assert time.monotonic() - t0 < 1.5
            c, cc = await _raw(srv)  # the slot is b's now: the cap still holds
            assert cc["type"] == "error" and cc["error"]["code"] == "session_limit_reached"
            await c.close()
            await b.close()

        asyncio.run(asyncio.wait_for(main(), 60))
        assert SlowVad.calls >= 1  # the slow detection was under way when the client closed


def test_a_file_and_a_turn_of_the_same_recording(transcription_server, asr):
    """The recorded sample as a file (REST) and as a committed turn (Realtime, 24 kHz on the wire, turn detection
    off): each is its endpoint's one decoding setup (streaming/asr_options.py: a file with timestamp tokens over whole
    windows, a turn without them over its audio plus the final margin), and the two give the same words; they
    differ in casing and punctuation only, as docs/realtime.md says ("voice. And" / "voice and"). (The turn's margin
    is the loaded one if the engine was busy, as after the file's transcription: engine/load.py, LoadedMargins.)"""

    openai = pytest.importorskip("openai")
    from speechrt.cli_asr import sample_path
    from speechrt.models.audio import load_audio
    from speechrt.models.wer import normalize
    from speechrt.streaming.asr_options import LOADED_FINAL_MARGIN_S, asr_options, rest_options
    from speechrt.streaming.realtime.audio_codec import AudioFormat, InputDecoder

    sample = sample_path()
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{transcription_server.port}/v1", api_key="-", max_retries=0)
    file_text = client.audio.transcriptions.create(
        model="whisper-1", file=("sample.wav", sample.read_bytes()), response_format="text"
    ).strip()
    wire = pcm24(load_audio(sample), tail_s=0.0)

    async def main():
        ws, _ = await _raw(transcription_server)
        await ws.send(json.dumps({"type": "session.update", "session": {"audio": {"input": {"turn_detection": None}}}}))
        await _next(ws, "session.updated")
        for i in range(0, len(wire), 9600):
            await ws.send(
                json.dumps(
                    {"type": "input_audio_buffer.append", "audio": base64.b64encode(wire[i : i + 9600]).decode()}
                )
            )
        await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
        done = await _next(ws, "conversation.item.input_audio_transcription.completed")
        await ws.close()
        return done["transcript"].strip()

    loaded_before = transcription_server.engine.metrics.finals_loaded_margin
    turn_text = asyncio.run(asyncio.wait_for(main(), 120))
    loaded = transcription_server.engine.metrics.finals_loaded_margin > loaded_before
    steps = asr.transcribe_steps(load_audio(sample), asr.options(**rest_options("transcribe", None, None, None)))
    while True:
        try:
            next(steps)
        except StopIteration as end:
            assert file_text == end.value.text.strip()
            break
    heard = InputDecoder(AudioFormat("audio/pcm", 24000)).decode(wire, last=True)
    final = asr_options(None, final_margin=LOADED_FINAL_MARGIN_S if loaded else None)
    assert turn_text == asr.transcribe_batch([heard], final)[0].text.strip(), (loaded, turn_text)
    assert normalize(file_text) == normalize(turn_text), (file_text, turn_text)
