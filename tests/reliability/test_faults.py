"""Faults on a real conversation server: a model step that raises (injected through POST /debug/fault) fails
only the work it was doing, with an error event, and the next turn is served; a worker that stalls past the
stall timeout leaves its sessions told, not hung; one request's oversized options do not cut another
session's answer; SIGTERM finishes the turns and answers in flight, exits 0, and prints no traceback."""

from __future__ import annotations

import asyncio
import base64
import json
import re
import signal
import time

from rel_helpers import SENTENCES, ServerProcess, append_event, next_event, open_session, pcm24, run, update

from speechrt.models.wer import wer

MANUAL = {"audio": {"input": {"turn_detection": None}}}


async def commit_turn(ws, pcm: bytes) -> dict:
    """Append and commit a turn -> its completed (or failed, or error) event."""
    await ws.send(append_event(pcm))
    await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
    return await next_event(
        ws,
        "conversation.item.input_audio_transcription.completed",
        "conversation.item.input_audio_transcription.failed",
    )


async def ask(ws, text: str, **response) -> tuple[dict, str]:
    """A text question -> (response.done, the answer's transcript)."""
    await ws.send(
        json.dumps(
            {
                "type": "conversation.item.create",
                "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]},
            }
        )
    )
    await ws.send(json.dumps({"type": "response.create", "response": {"output_modalities": ["text"], **response}}))
    answer = ""
    while True:
        ev = json.loads(await asyncio.wait_for(ws.recv(), 120))
        if ev["type"] == "response.output_text.delta":
            answer += ev["delta"]
        if ev["type"] == "response.done":
            return ev, answer


def test_a_failing_transcription_step_fails_only_that_turn(cserver, synth):
    pcm = pcm24(synth(SENTENCES[0]), tail_s=0.2)

    async def main():
        ws, _ = await open_session(cserver, "transcription")
        await update(ws, MANUAL)
        cserver.post("/debug/fault", {"stage": "asr", "count": 1})
        failed = await commit_turn(ws, pcm)
        err = await next_event(ws, "error")
        ok = await commit_turn(ws, pcm)
        await ws.close()
        return failed, err, ok

    failed, err, ok = run(main(), 120)
    assert failed["type"] == "conversation.item.input_audio_transcription.failed", failed
    assert "injected fault" in failed["error"]["message"] and err["error"]["type"] == "server_error"
    assert ok["type"] == "conversation.item.input_audio_transcription.completed"
    assert wer(SENTENCES[0], ok["transcript"]) <= 0.15


def test_a_failing_language_model_step_fails_the_response_and_the_next_one_works(cserver):
    async def main():
        ws, _ = await open_session(cserver, None)
        cserver.post("/debug/fault", {"stage": "lm", "count": 1})
        failed, _ = await ask(ws, "What is the capital of France?")
        done, answer = await ask(ws, "What is the capital of France?")
        await ws.close()
        return failed, done, answer

    failed, done, answer = run(main(), 180)
    r = failed["response"]
    assert r["status"] == "failed" and "injected fault" in r["status_details"]["error"]["message"], r
    assert done["response"]["status"] == "completed" and "Paris" in answer, (done, answer)


def test_a_failing_synthesis_step_fails_the_response_and_the_next_one_works(cserver):
    async def until_done(ws) -> tuple[dict, list[dict]]:
        seen = []
        while (ev := json.loads(await asyncio.wait_for(ws.recv(), 120)))["type"] != "response.done":
            seen.append(ev)
        return ev, seen

    async def main():
        ws, _ = await open_session(cserver, None)
        cserver.post("/debug/fault", {"stage": "tts", "count": 1})
        say = {"type": "response.create", "response": {"speechrt_say": "Hello there, this is a test."}}
        await ws.send(json.dumps(say))
        failed, before = await until_done(ws)
        await ws.send(json.dumps(say))
        done, events = await until_done(ws)
        await ws.close()
        return failed, before, done, events

    failed, before, done, events = run(main(), 180)
    assert failed["response"]["status"] == "failed", failed
    assert any(e["type"] == "error" and "injected fault" in e["error"]["message"] for e in before), before
    assert done["response"]["status"] == "completed"
    audio = [base64.b64decode(e["delta"]) for e in events if e["type"] == "response.output_audio.delta"]
    # streamed (the first window's audio, then the rest: 3 windows for this sentence), and all of it: ~1.5 s of
    # 24 kHz pcm16
    assert len(audio) >= 2 and sum(map(len, audio)) > 24000 * 2, [len(a) for a in audio]


def test_a_stalled_worker_leaves_sessions_told_not_hung(cserver, synth):
    """The engine's speech recognition worker hangs for 15 s in a transcription step; the stall timeout is 10 s:
    the session is told after it (transcription failed: engine_stalled), and once the worker is back the next turn
    is served. The other families' workers go on meanwhile (issue 51): another session's text question is
    answered while the turn waits."""
    pcm = pcm24(synth(SENTENCES[1]), tail_s=0.2)

    async def main():
        ws, _ = await open_session(cserver, "transcription")
        await update(ws, MANUAL)
        batches = cserver.metrics()["asr_batches_total"]
        other, _ = await open_session(cserver, None)
        cserver.post("/debug/fault", {"stage": "asr", "count": 1, "stall_s": 15})
        t0 = time.monotonic()
        turn = asyncio.ensure_future(commit_turn(ws, pcm))
        done, answer = await ask(other, "What is the capital of France?")
        answered_first = not turn.done()
        told = await turn
        waited = time.monotonic() - t0
        await next_event(ws, "error")  # the error event that follows the failed transcription
        # the stall ends: the stalled batch is counted once its step returns (the worker ran nothing meanwhile)
        await asyncio.to_thread(cserver.wait_for, "asr_batches_total", lambda v: v > batches, 30)
        ok = await commit_turn(ws, pcm)
        await ws.close()
        await other.close()
        return told, waited, ok, (done, answer, answered_first)

    told, waited, ok, (done, answer, answered_first) = run(main(), 180)
    assert told["type"] == "conversation.item.input_audio_transcription.failed", told
    assert told["error"]["code"] == "engine_stalled" and 9 <= waited <= 14, (told, waited)
    assert answered_first and done["response"]["status"] == "completed" and "Paris" in answer, (done, answer)
    page = cserver.get("/metrics")  # per family: the stalled step counts for speech recognition only
    fam = {
        f: float(re.search(rf'speechrt_engine_family_busy_seconds_total{{family="{f}"}} (\S+)', page)[1])
        for f in ("asr", "lm", "tts")
    }
    assert fam["asr"] >= 15 > fam["lm"] > 0, fam
    assert abs(sum(fam.values()) - cserver.metrics()["engine_busy_seconds_total"]) < 0.05, fam
    assert ok["type"] == "conversation.item.input_audio_transcription.completed"
    assert wer(SENTENCES[1], ok["transcript"]) <= 0.15


def test_oversized_max_output_tokens_hurt_no_one(cserver):
    """100,000 on response.create is refused naming the range; 4096 on the session (accepted) answers, and
    another session's answer, asked at the same time, is whole."""

    async def main():
        a, _ = await open_session(cserver, None)
        b, _ = await open_session(cserver, None)
        await a.send(json.dumps({"type": "response.create", "response": {"max_output_tokens": 100000}}))
        refused = await next_event(a, "response.created")
        await update(a, {"max_output_tokens": 4096})
        (da, _), (db, answer) = await asyncio.gather(
            ask(a, "Tell me about the moon."), ask(b, "What is the capital of France?")
        )
        await a.close()
        await b.close()
        return refused, da, db, answer

    refused, da, db, answer = run(main(), 240)
    assert refused["type"] == "error" and "from 1 to 4096" in refused["error"]["message"]
    assert da["response"]["status"] in ("completed", "incomplete"), da
    assert db["response"]["status"] == "completed" and "Paris" in answer, (db, answer)


def test_sigterm_finishes_turns_and_answers_in_flight(synth):
    pcm = pcm24(synth(SENTENCES[2]), tail_s=0.2)
    srv = ServerProcess("--drain-seconds", "20")

    async def main():
        t, _ = await open_session(srv, "transcription")
        await update(t, MANUAL)
        c, _ = await open_session(srv, None)
        await t.send(append_event(pcm))
        await t.send(json.dumps({"type": "input_audio_buffer.commit"}))
        await next_event(t, "input_audio_buffer.committed")
        await c.send(
            json.dumps(
                {
                    "type": "response.create",
                    "response": {
                        "speechrt_say": "The quick brown fox jumps over the lazy dog. It was a sunny day in the park."
                    },
                }
            )
        )
        await next_event(c, "response.created")
        srv.proc.send_signal(signal.SIGTERM)
        done = await next_event(t, "conversation.item.input_audio_transcription.completed")
        answer = await next_event(c, "response.done", timeout=60)
        return done, answer

    try:
        done, answer = run(main(), 120)
        rc = srv.proc.wait(60)
    finally:
        srv.stop(signal.SIGKILL, 5)
    assert wer(SENTENCES[2], done["transcript"]) <= 0.15, done
    assert answer["type"] == "response.done" and answer["response"]["status"] == "completed", answer
    assert rc == 0, "".join(srv.err)[-2000:]
    assert "Traceback" not in "".join(srv.err), "".join(srv.err)[-3000:]
