"""`speechrt bench server`: replay speech at real-time pace over N concurrent Realtime sessions against
a `speechrt serve` process, and report latencies measured from the end of each utterance's speech:

- partial: time from speech start until the first live transcript delta;
- final: end of speech (the last speech sample sent) -> `...input_audio_transcription.completed`;
- voice-to-voice (conversation mode): end of speech -> first `response.output_audio.delta`.

With --find-max, N ramps up until p95 final latency passes one second; the largest N that stays under
it is reported. Streams are staggered by default (stream i starts i/N of an utterance cycle later), as
independent speakers are; --no-stagger starts them together, so every turn ends in the same instant
(the burst case: N transcripts asked for at once).
"""
from __future__ import annotations

import asyncio
import base64
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

import numpy as np

SENTENCES = [
    "Please book a table for two at seven tonight.", "The package should arrive on Monday morning.",
    "Turn off the lights in the kitchen.", "How long does it take to drive to the airport?",
    "Remind me to call my sister tomorrow.", "The concert was moved to next Friday.",
    "I need three tickets for the afternoon show.", "Add milk and eggs to the shopping list.",
]
QUESTIONS = ["What is the capital of France?", "What color is the sky on a clear day?",
             "How many days are in a week?", "What is the largest planet in our solar system?"]
CHUNK_MS = 100
RATE = 24000


def add_arguments(p):
    p.add_argument("--streams", type=int, default=1, help="concurrent sessions (default 1)")
    p.add_argument("--mode", choices=["transcription", "conversation"], default="transcription")
    p.add_argument("--utterances", type=int, default=4, help="utterances per stream (default 4)")
    p.add_argument("--no-stagger", dest="stagger", action="store_false",
                   help="start every stream at once, so that all turns end together (a burst); by default stream i "
                        "starts i/N of an utterance cycle later, as independent speakers would")
    p.add_argument("--find-max", action="store_true", help="ramp streams up to find the largest N with p95 final < 1 s")
    p.add_argument("--max-streams", type=int, default=24, help="upper end of the --find-max ramp")
    p.add_argument("--turn-detection", choices=["server_vad", "semantic_vad"], default="server_vad",
                   help="server_vad: a fixed pause ends a turn; semantic_vad: the pause needed depends on whether "
                        "the words so far read as finished")
    p.add_argument("--silence-duration-ms", type=int, default=200, help="server_vad pause that ends a turn (default 200)")
    p.add_argument("--eagerness", choices=["low", "medium", "high", "auto"], default="auto", help="semantic_vad eagerness")
    p.add_argument("--url", default=None, help="an already running server (ws://host:port/v1/realtime); default: start one")
    p.add_argument("--threads", type=int, default=None, help="PyTorch threads of the started server")
    p.add_argument("--asr-loop-threads", type=int, default=1, help="the started server's --asr-loop-threads")
    p.add_argument("--lm-threads", type=int, default=1, help="the started server's --lm-threads")
    p.add_argument("--partial-interval", type=float, default=1.0, help="the started server's --partial-interval (0: no live deltas)")
    p.add_argument("--json", default=None, help="write the results to this JSON file")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_server(args, conversation: bool):
    port = _free_port()
    cmd = [sys.executable, "-m", "speechrt", "serve", "--port", str(port), "--max-sessions", "64"]
    if not conversation:
        cmd.append("--transcription-only")
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    cmd += ["--partial-interval", str(args.partial_interval), "--asr-loop-threads", str(args.asr_loop_threads),
            "--lm-threads", str(args.lm_threads)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 300
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited: {proc.stdout.read()}")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1)
            return proc, f"ws://127.0.0.1:{port}/v1/realtime"
        except OSError:
            time.sleep(0.3)
    proc.kill()
    raise SystemExit("server did not start in 300 s")


def _recordings(texts):
    """Speech for each text from the embedded voice, pcm16 at 24 kHz, with its speech span. The voice's
    noise is seeded: every run replays the same recordings."""
    import speechrt

    tts = speechrt.load_tts()
    out = []
    for i, t in enumerate(texts):
        a = np.concatenate(list(tts.synthesize(t, sample_rate=RATE, seed=i)))
        nz = np.flatnonzero(np.abs(a) > 0.01)
        lead = np.zeros(RATE // 2, np.float32)
        tail = np.zeros(RATE * 2, np.float32)  # silence after: the server detects the end of the turn
        pcm = (np.clip(np.concatenate([lead, a, tail]), -1, 1) * 32767).astype("<i2").tobytes()
        out.append((t, pcm, (len(lead) + nz[0]) / RATE, (len(lead) + nz[-1] + 1) / RATE))
    return out


def _turn_detection(args) -> dict:
    if args.turn_detection == "semantic_vad":
        return {"type": "semantic_vad", "eagerness": args.eagerness}
    return {"type": "server_vad", "silence_duration_ms": args.silence_duration_ms}


async def _stream(url, recs, idx, n_utt, turn_detection, conversation, results, delay=0.0):
    from websockets.asyncio.client import connect

    await asyncio.sleep(delay)
    async with connect(url + ("" if conversation else "?intent=transcription"), max_size=None) as ws:
        await ws.recv()
        session = {"audio": {"input": {"turn_detection": turn_detection}}}
        if conversation:
            session["instructions"] = "You are a helpful assistant. Answer in one short sentence."
        else:
            session["type"] = "transcription"
        await ws.send(json.dumps({"type": "session.update", "session": session}))
        while json.loads(await ws.recv())["type"] != "session.updated":
            pass
        events: asyncio.Queue = asyncio.Queue()

        async def reader():
            async for m in ws:
                events.put_nowait((time.perf_counter(), json.loads(m)))
        rd = asyncio.create_task(reader())
        try:
            for u in range(n_utt):
                text, pcm, s0, s1 = recs[(idx + u) % len(recs)]
                step = RATE * CHUNK_MS // 1000 * 2
                t_start = time.perf_counter()
                t_speech_start = t_speech_end = None
                for k, i in enumerate(range(0, len(pcm), step)):
                    target = t_start + k * CHUNK_MS / 1000  # real-time pace
                    await asyncio.sleep(max(0.0, target - time.perf_counter()))
                    await ws.send(json.dumps({"type": "input_audio_buffer.append",
                                              "audio": base64.b64encode(pcm[i: i + step]).decode()}))
                    sent_until = (i + step) / 2 / RATE
                    if t_speech_start is None and sent_until >= s0:
                        t_speech_start = time.perf_counter()
                    if t_speech_end is None and sent_until >= s1:
                        t_speech_end = time.perf_counter()
                r = {"stream": idx, "text": text}
                while True:
                    t, ev = await asyncio.wait_for(events.get(), 60)
                    et = ev["type"]
                    if et == "error":
                        raise RuntimeError(ev["error"])
                    if et == "conversation.item.input_audio_transcription.delta" and "partial" not in r:
                        r["partial"] = t - t_speech_start
                    elif et == "conversation.item.input_audio_transcription.completed":
                        r["final"] = t - t_speech_end
                        r["transcript"] = ev["transcript"]
                        if not conversation:
                            break
                    elif et == "response.output_audio.delta" and "v2v" not in r:
                        r["v2v"] = t - t_speech_end
                    elif et == "response.done":
                        break
                results.append(r)
        finally:
            rd.cancel()


def _pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))] if xs else float("nan")


async def _level(url, recs, n, args, conversation):
    results: list = []
    # stagger: stream i starts i/n of an utterance cycle (the mean recording, plus the answer's time in
    # conversations) after the first
    cycle = sum(len(pcm) / 2 / RATE for _, pcm, _, _ in recs) / len(recs) + (1.5 if conversation else 0.3)
    await asyncio.gather(*(_stream(url, recs, i, args.utterances, _turn_detection(args), conversation, results,
                                   cycle * i / n if args.stagger else 0.0)
                           for i in range(n)))
    return results


def _summary(n, results, conversation):
    from speechrt.models.wer import wer

    row = {"streams": n, "utterances": len(results)}
    for key in ("partial", "final") + (("v2v",) if conversation else ()):
        xs = [r[key] for r in results if key in r]
        row[key] = {"p50": _pct(xs, 0.5), "p95": _pct(xs, 0.95), "n": len(xs)}
    row["wer"] = wer([r["text"] for r in results], [r.get("transcript", "") for r in results])
    return row


def _print(row, conversation):
    f = lambda d: f"{1000 * d['p50']:7.0f} {1000 * d['p95']:7.0f}"  # noqa: E731
    line = f"{row['streams']:7d} {f(row['partial'])}  {f(row['final'])}"
    if conversation:
        line += f"  {f(row['v2v'])}"
    print(line + f"  {100 * row['wer']:5.1f}%", flush=True)


def run(args):
    conversation = args.mode == "conversation"
    recs = _recordings(QUESTIONS if conversation else SENTENCES)
    proc = None
    url = args.url
    if url is None:
        proc, url = _start_server(args, conversation)
    try:
        print(f"server: {url}; mode: {args.mode}; {args.utterances} utterances per stream, real-time pace, "
              f"{CHUNK_MS} ms chunks, streams {'staggered' if args.stagger else 'started at once'}; turn detection: {', '.join(f'{k}={v}' for k, v in _turn_detection(args).items())}; "
              f"cores: {os.cpu_count()}")
        head = f"{'streams':>7} {'partial p50':>7} {'p95':>7}  {'final p50':>7} {'p95':>7}"
        if conversation:
            head += f"  {'v2v p50':>7} {'p95':>7}"
        print(head + "    WER   (latencies in ms)")
        levels = [args.streams]
        if args.find_max:
            levels = [n for n in (1, 2, 4, 6, 8, 10, 12, 16, 20, 24, 32) if n <= args.max_streams]
        rows, best = [], 0
        for n in levels:
            row = _summary(n, asyncio.run(_level(url, recs, n, args, conversation)), conversation)
            rows.append(row)
            _print(row, conversation)
            if row["final"]["p95"] < 1.0:
                best = max(best, n)
            elif args.find_max:
                break
        if args.find_max:
            print(f"largest N with p95 final-transcript latency under 1 s: {best}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"mode": args.mode, "turn_detection": _turn_detection(args), "levels": rows,
                           "max_streams_under_1s": best if args.find_max else None}, f, indent=2)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(30)
    return 0
