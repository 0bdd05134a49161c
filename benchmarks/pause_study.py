"""`python -m benchmarks.pause_study`: conversation turns with a pause inside each ("What is the capital of
Japan?", half a second of silence, "Answer with one word."), spoken at real-time pace to a `speechrt serve` started
as `bench server` starts it (or the one at --url), one session, turn after turn.

A reply begun in the pause inside a turn is dropped when speech resumes; the turn's response is the reply begun in
its final pause. Per turn: the final transcript's and the answer's first audio's latency after the end of speech.
Over the run: the replies begun in pauses and taken over, and how much of the replies' prompts the language model
found in its cache (the conversation so far, which the dropped replies had read: their positions stay,
speechrt/pipelines/lm_batching.py). `bench server --mode conversation` speaks each question without a pause.

    python -m benchmarks.pause_study [--turns 6] [--gap 0.5] [--silence-ms 800] [--url ws://...]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import statistics
import time

import numpy as np

from speechrt.bench.pacing import FINAL_WAIT_S, send_paced
from speechrt.bench.server_load import counters

RATE = 24000
TURNS = [
    ("What is the capital of Japan?", "Answer with one word."),
    ("How many legs does a spider have?", "Just the number, please."),
    ("What is the tallest mountain on Earth?", "Keep it short."),
    ("Which planet is closest to the sun?", "One word, please."),
    ("What language is spoken in Brazil?", "Answer briefly."),
    ("What is the boiling point of water?", "In Celsius, please."),
]
INSTRUCTIONS = "You are a helpful assistant. Answer in one short sentence."
# /metrics counters read before and after the run
COUNTERS = (
    "replies_speculated_total",
    "replies_speculation_used_total",
    "lm_prompt_tokens_reused_total",
    "lm_prompt_tokens_total",
)


def recordings(turns: int, gap_s: float, tail_s: float) -> list[tuple[str, np.ndarray, float, float]]:
    """(text, float32 audio at 24 kHz, speech start s, speech end s) per turn: its two parts in the embedded voice
    (seeded), `gap_s` of silence between them, half a second before and `tail_s` after."""
    import speechrt

    tts = speechrt.load_tts()

    def spoken(text, seed):
        a = np.concatenate(list(tts.synthesize(text, sample_rate=RATE, seed=seed)))
        nz = np.flatnonzero(np.abs(a) > 0.01)
        return a[nz[0] : nz[-1] + 1]

    out = []
    for i in range(turns):
        first, then = TURNS[i % len(TURNS)]
        lead = np.zeros(RATE // 2, np.float32)
        speech = np.concatenate([spoken(first, i), np.zeros(int(gap_s * RATE), np.float32), spoken(then, i)])
        audio = np.concatenate([lead, speech, np.zeros(int(tail_s * RATE), np.float32)])
        out.append((f"{first} {then}", audio, len(lead) / RATE, (len(lead) + len(speech)) / RATE))
    return out


async def _turn(client, text: str, audio: np.ndarray, speech: tuple[float, float]) -> dict:
    """Speak one turn and read the server's events until its response is done -> its latencies and transcript."""
    pcm = (np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes()

    async def send(a, b):
        await client.send({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm[2 * a : 2 * b]).decode()})

    sender = asyncio.create_task(send_paced(send, len(audio), RATE, 0.1, speech))
    r, times = {"text": text}, {}
    while True:
        ev = await client.next_event(FINAL_WAIT_S)
        t = time.perf_counter()
        if ev is None:
            raise ConnectionError("the server closed the connection")
        if ev.type == "error":
            raise RuntimeError(ev.raw.get("error"))
        if ev.type == "conversation.item.input_audio_transcription.completed":
            times["final"], r["transcript"] = t, ev.raw["transcript"]
        elif ev.type == "response.output_audio.delta":
            times.setdefault("v2v", t)
        elif ev.type == "response.done":
            break
    _, t_end = await sender
    r.update({k: v - t_end for k, v in times.items()})
    return r


async def _session(url: str, recs, silence_ms: int) -> list[dict]:
    from speechrt.client import AsyncClient

    session = {
        "instructions": INSTRUCTIONS,
        "audio": {"input": {"turn_detection": {"type": "server_vad", "silence_duration_ms": silence_ms}}},
    }
    async with AsyncClient(url, session=session) as client:
        return [await _turn(client, text, audio, (s0, s1)) for text, audio, s0, s1 in recs]


def main(argv=None) -> list[dict]:
    from speechrt.bench import server as bench_server
    from speechrt.bench.server_engines import http_base, start_server
    from speechrt.models.wer import wer

    ap = argparse.ArgumentParser(prog="python -m benchmarks.pause_study", description=__doc__.split("\n\n")[0])
    ap.add_argument("--turns", type=int, default=6, help="turns of the one session (default 6)")
    ap.add_argument("--gap", type=float, default=0.5, help="seconds of silence inside each turn (default 0.5)")
    ap.add_argument("--silence-ms", type=int, default=800, help="server_vad pause that ends a turn (default 800)")
    ap.add_argument("--url", default=None, help="a running server (ws://host:port/v1/realtime); default: start one")
    ap.add_argument("--backend", default="auto", help="the started server's --backend (default auto)")
    args = ap.parse_args(argv)
    if not 0 < args.gap * 1000 < args.silence_ms:
        ap.error("--gap must be shorter than the pause that ends a turn (--silence-ms)")
    recs = recordings(args.turns, args.gap, args.silence_ms / 1000 + 2.0)
    proc, url = None, args.url
    if url is None:
        server_args = argparse.ArgumentParser()
        bench_server.add_arguments(server_args)
        proc, url, _ = start_server(server_args.parse_args(["--backend", args.backend]), True)
    try:
        base = http_base(url)
        before = counters(base, COUNTERS)
        rows = asyncio.run(_session(url, recs, args.silence_ms))
        after = counters(base, COUNTERS)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(30)
    print(f"{len(rows)} turns, each with {args.gap:.2f} s of silence inside; server_vad {args.silence_ms} ms")
    print(f"{'turn':>4} {'final ms':>9} {'voice-to-voice ms':>18}  WER   transcript")
    for i, r in enumerate(rows, 1):  # ('-': no transcript, or no answer audio)
        final, v2v = (f"{1000 * r[k]:.0f}" if k in r else "-" for k in ("final", "v2v"))
        said = r.get("transcript", "")
        print(f"{i:>4} {final:>9} {v2v:>18}  {100 * wer(r['text'], said):3.0f}%  {said}")
    d = {k: after.get(k, 0) - before.get(k, 0) for k in COUNTERS}
    spoken = [r["v2v"] for r in rows if "v2v" in r]
    share = d["lm_prompt_tokens_reused_total"] / d["lm_prompt_tokens_total"] if d["lm_prompt_tokens_total"] else 0.0
    v2v = (
        f"p50 {1000 * statistics.median(spoken):.0f} ms, max {1000 * max(spoken):.0f} ms"
        if spoken
        else "no answer audio"
    )
    print(
        f"voice-to-voice {v2v}; replies begun "
        f"in pauses {d['replies_speculated_total']:.0f}, taken over {d['replies_speculation_used_total']:.0f}; "
        f"replies' prompt tokens found in the cache: {d['lm_prompt_tokens_reused_total']:.0f} of "
        f"{d['lm_prompt_tokens_total']:.0f} ({share:.0%})"
    )
    return rows


if __name__ == "__main__":
    main()
