"""`bench server`'s load: the benchmark's utterances in the embedded voice, spoken at real-time pace by N
concurrent Realtime sessions (staggered or at once), and each utterance's latencies as the client sees them."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
from pathlib import Path
from typing import NamedTuple

import numpy as np
from websockets.exceptions import WebSocketException

from speechrt.bench.pacing import FINAL_WAIT_S, listen, send_paced
from speechrt.models.wer import normalize

SENTENCES = [
    "Please book a table for two at seven tonight.",
    "The package should arrive on Monday morning.",
    "Turn off the lights in the kitchen.",
    "How long does it take to drive to the airport?",
    "Remind me to call my sister tomorrow.",
    "The concert was moved to next Friday.",
    "I need three tickets for the afternoon show.",
    "Add milk and eggs to the shopping list.",
]
QUESTIONS = [
    "What is the capital of France?",
    "What color is the sky on a clear day?",
    "How many days are in a week?",
    "What is the largest planet in our solar system?",
]
# --long-turn-speech dense: a read passage, every sentence once (a text that loops would be cut as a decoding loop)
MONOLOGUE = [
    "The old lighthouse stood at the edge of the cliff for more than two hundred years.",
    "Every night its keeper climbed the narrow stairs to light the lamp and wind the clock.",
    "Ships coming into the harbour watched for its beam through rain, fog and snow.",
    "When the engineers replaced the lamp with an electric light, the keeper stayed on to paint the railings.",
    "Visitors now come in the summer to walk along the path and look out over the water.",
    "On a clear day you can see the islands to the north and the fishing boats heading out at dawn.",
    "The town turned the keeper's cottage into a small museum with maps, photographs and a brass telescope.",
    "Children like to count the steps on the way up, and most of them lose track somewhere near the top.",
    "In winter the wind is so strong that the gate is locked and the path is closed to everyone.",
    "The lamp still turns every night, although nobody has to climb the stairs to light it anymore.",
    "Last year a storm broke two of the windows, and a crew from the mainland spent a week repairing them.",
    "The museum sells postcards and small models of the tower, and the money pays for the new roof.",
    "Some people say the keeper still walks along the cliff on foggy evenings, but nobody has proved it.",
    "At the end of the season the volunteers close the museum, store the maps and cover the telescope.",
]
DENSE_RATE = 1.1  # the voice's speaking rate for the dense monologue: ~250 words a minute once its pauses are cut
DENSE_PAUSE_S = 0.08  # no quiet stretch in the dense monologue is longer than this
CHUNK_MS = 100
RATE = 24000
STEP = RATE * CHUNK_MS // 1000  # samples a chunk
TICK_S = 0.01  # a process's streams send on a 10-ms grid (pacing.send_paced)


def recording_path(text: str, seed: int) -> Path:
    """Where recordings() keeps the speech of `text` with noise seed `seed` (speechrt's cache; keyed by the text, the
    seed, the rate and the default voice's name: delete the folder after that voice's model changes)."""
    from speechrt.machine import cache_home
    from speechrt.models.registry import DEFAULTS

    key = hashlib.sha256(json.dumps([DEFAULTS["tts"], RATE, seed, text]).encode()).hexdigest()[:24]
    return cache_home() / "bench-speech" / f"{key}.npz"


def recordings(texts):
    """Speech for each text from the embedded voice, pcm16 at 24 kHz, with its speech span. The voice's
    noise is seeded: every run replays the same recordings, synthesized once and then read from speechrt's cache
    (recording_path), so that a machine without the voice can be given them."""
    out, tts = [], None
    for i, t in enumerate(texts):
        path = recording_path(t, i)
        if not path.is_file():
            if tts is None:
                import speechrt

                tts = speechrt.load_tts(backend="torch")  # the same recordings on every machine
            a = np.concatenate(list(tts.synthesize(t, sample_rate=RATE, seed=i)))
            nz = np.flatnonzero(np.abs(a) > 0.01)
            lead = np.zeros(RATE // 2, np.float32)
            tail = np.zeros(RATE * 2, np.float32)  # silence after: the server detects the end of the turn
            pcm = (np.clip(np.concatenate([lead, a, tail]), -1, 1) * 32767).astype("<i2")
            span = np.array([len(lead) + nz[0], len(lead) + nz[-1] + 1])
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp.npz")
            np.savez(tmp, pcm=pcm, span=span)
            os.replace(tmp, path)  # whole or absent, with several processes at once
        with np.load(path) as z:
            pcm, span = z["pcm"], z["span"]
        out.append((t, pcm.tobytes(), int(span[0]) / RATE, int(span[1]) / RATE))
    return out


def long_recording(recs, seconds: float):
    """(text, pcm, speech start s, speech end s): the recordings' speech back to back with 0.15 s gaps (shorter
    than any pause that ends a turn) until `seconds`, with the recordings' lead and tail silence around it."""
    gap = np.zeros(int(0.15 * RATE), "<i2")
    parts, texts, n = [], [], 0
    while n < seconds * RATE:
        text, pcm, s0, s1 = recs[len(texts) % len(recs)]
        speech = np.frombuffer(pcm, "<i2")[int(s0 * RATE) : int(s1 * RATE)]
        parts += [speech, gap]
        texts.append(text)
        n += len(speech) + len(gap)
    speech = np.concatenate(parts[:-1])
    lead, tail = np.zeros(RATE // 2, "<i2"), np.zeros(RATE * 2, "<i2")
    pcm = np.concatenate([lead, speech, tail]).tobytes()
    return " ".join(texts), pcm, len(lead) / RATE, (len(lead) + len(speech)) / RATE


def squeeze(a: np.ndarray, pause_s: float = DENSE_PAUSE_S, floor: float = 0.01) -> np.ndarray:
    """`a` (float32 at RATE) without its lead and tail silence and with every quiet stretch (10-ms hops whose RMS
    is under `floor`) longer than `pause_s` cut to `pause_s` (its two ends kept: the sounds around it fade out and
    in as spoken)."""
    hop = RATE // 100
    n = len(a) // hop
    loud = np.sqrt((a[: n * hop].reshape(n, hop) ** 2).mean(1)) >= floor
    if not loud.any():
        return a[:0]
    first, last = np.flatnonzero(loud)[[0, -1]]
    keep, out, i = int(round(pause_s * 100)), [], first
    while i <= last:
        j = i
        while j <= last and loud[j] == loud[i]:
            j += 1
        if not loud[i] and j - i > keep:  # a pause: its first and last keep/2 hops
            out += [a[i * hop : (i + keep // 2) * hop], a[(j - (keep - keep // 2)) * hop : j * hop]]
        else:
            out.append(a[i * hop : j * hop])
        i = j
    return np.concatenate(out)


def dense_recording(seconds: float, rate: float = DENSE_RATE, pause_s: float = DENSE_PAUSE_S):
    """(text, pcm, speech start s, speech end s) like long_recording's: MONOLOGUE read by the embedded voice at
    `rate` with no pause longer than `pause_s` (squeeze; sentences joined `pause_s` apart) until `seconds` (fast
    read speech, ~250 words a minute: Whisper's segments of it end anywhere, not at pauses), 0.5 s of silence
    before and 2 s after. Seeded: every run replays the same recording."""
    import speechrt

    tts = speechrt.load_tts()
    gap = np.zeros(int(pause_s * RATE), np.float32)
    parts, texts, n = [], [], 0
    while n < seconds * RATE:
        text = MONOLOGUE[len(texts) % len(MONOLOGUE)]
        speech = squeeze(np.concatenate(list(tts.synthesize(text, sample_rate=RATE, seed=len(texts), rate=rate))))
        parts += [speech, gap]
        texts.append(text)
        n += len(speech) + len(gap)
    speech = np.concatenate(parts[:-1])
    lead, tail = np.zeros(RATE // 2, np.float32), np.zeros(RATE * 2, np.float32)
    pcm = (np.clip(np.concatenate([lead, speech, tail]), -1, 1) * 32767).astype("<i2").tobytes()
    return " ".join(texts), pcm, len(lead) / RATE, (len(lead) + len(speech)) / RATE


class Spoken(NamedTuple):
    """A recording as a stream sends it: its text, its pcm16 cut into CHUNK_MS chunks already written as the
    `input_audio_buffer.append` messages that carry them (base64 and JSON made once, shared by every stream that
    speaks it), its speech span in seconds and its length in samples."""

    text: str
    messages: tuple[str, ...]
    s0: float
    s1: float
    samples: int


def spoken(recs) -> list[Spoken]:
    """recordings()' (text, pcm16 bytes, speech start s, speech end s) -> what the streams send (Spoken)."""
    step = 2 * STEP  # bytes a chunk
    return [
        Spoken(
            text,
            tuple(
                json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm[i : i + step]).decode()})
                for i in range(0, len(pcm), step)
            ),
            s0,
            s1,
            len(pcm) // 2,
        )
        for text, pcm, s0, s1 in recs
    ]


async def long_level(url, recs, long_rec, args):
    """One session speaks `long_rec`; another, starting 5 s later, speaks its utterances. -> (the long turn's
    result, the other's results)."""
    long_res, short_res = [], []
    td = turn_detection(args)
    await asyncio.gather(
        stream_session(url, spoken([long_rec]), 0, 1, td, False, long_res),
        stream_session(url, spoken(recs), 1, args.utterances, td, False, short_res, 5.0),
    )
    return long_res[0], short_res


def turn_detection(args) -> dict:
    if args.turn_detection == "semantic_vad":
        return {"type": "semantic_vad", "eagerness": args.eagerness}
    return {"type": "server_vad", "silence_duration_ms": args.silence_duration_ms}


async def stream_session(url, recs, idx, n_utt, turn_detection, conversation, results, delay=0.0, wait=FINAL_WAIT_S):
    """Stream `idx` speaks n_utt of `recs` (Spoken) from recs[idx] on, one after another, each once the last one's
    final transcript (or answer) came; a result per utterance into `results`. A session the server refuses
    (`session_limit_reached`) or that cannot connect gets its utterances as results without a final (`refused`:
    why), as does an utterance whose final did not come within `wait` seconds: lost, not a crash."""
    from websockets.asyncio.client import connect

    await asyncio.sleep(delay)
    try:
        ws = await connect(url + ("" if conversation else "?intent=transcription"), max_size=None)
        first = json.loads(await ws.recv())
    except (OSError, asyncio.TimeoutError, WebSocketException) as e:
        ws, first = None, {"type": "error", "error": {"message": f"{type(e).__name__}: {e}"}}
    if first["type"] == "error":  # refused (the server is full) or unreachable
        if ws is not None:
            await ws.close()
        why = first["error"].get("code") or first["error"].get("message", "")
        results += [
            {"stream": idx, "utterance": u, "text": recs[(idx + u) % len(recs)].text, "refused": why}
            for u in range(n_utt)
        ]
        return
    async with ws:
        session = {"audio": {"input": {"turn_detection": turn_detection}}}
        if conversation:
            session["instructions"] = "You are a helpful assistant. Answer in one short sentence."
        else:
            session["type"] = "transcription"
        await ws.send(json.dumps({"type": "session.update", "session": session}))
        while json.loads(await ws.recv())["type"] != "session.updated":
            pass
        events, rd = listen(ws)
        try:
            for u in range(n_utt):
                rec = recs[(idx + u) % len(recs)]

                async def send(a, b, messages=rec.messages):  # samples a..b: their chunk's message, made already
                    await ws.send(messages[a // STEP])

                t_speech_start, t_speech_end = await send_paced(
                    send, rec.samples, RATE, CHUNK_MS / 1000, (rec.s0, rec.s1), TICK_S
                )
                r, deltas = {"stream": idx, "utterance": u, "text": rec.text}, []
                t_response = None
                while True:
                    try:
                        t, ev = await asyncio.wait_for(events.get(), wait)
                    except asyncio.TimeoutError:  # an overloaded server: counted as lost, not a crash
                        results += [r] + [
                            {"stream": idx, "utterance": v, "text": recs[(idx + v) % len(recs)].text}
                            for v in range(u + 1, n_utt)
                        ]
                        return
                    et = ev["type"]
                    if et == "error":
                        raise RuntimeError(ev["error"])
                    if et == "conversation.item.input_audio_transcription.delta":
                        r.setdefault("partial", t - t_speech_start)
                        deltas.append(ev["delta"])
                    elif et == "conversation.item.input_audio_transcription.completed":
                        r["final"] = t - t_speech_end
                        r["transcript"] = ev["transcript"]
                        r["live_text"] = "".join(deltas)
                        r["live_consistent"] = normalize(r["live_text"]) == normalize(ev["transcript"])
                        if not conversation:
                            break
                    elif et == "response.created":
                        t_response = t
                    elif et == "response.output_audio.delta" and "v2v" not in r:
                        r["v2v"] = t - t_speech_end
                        if t_response is not None:
                            r["first_audio"] = t - t_response
                    elif et == "response.done":
                        break
                results.append(r)
        finally:
            rd.cancel()


def start_delays(recs, n, conversation, stagger) -> list[float]:
    """Start offsets: stream i starts i/n of an utterance cycle (the mean recording, plus the answer's time
    in conversations) after the first; all at once without stagger."""
    cycle = sum(len(pcm) / 2 / RATE for _, pcm, _, _ in recs) / len(recs) + (1.5 if conversation else 0.3)
    return [cycle * i / n if stagger else 0.0 for i in range(n)]


async def run_streams(url, recs, streams, n_utt, td, conversation, wait=FINAL_WAIT_S) -> list[dict]:
    """The streams `streams` ((index, start delay s) each) on this event loop, speaking `recs` (Spoken) -> their
    results, one per utterance."""
    results: list = []
    await asyncio.gather(
        *(stream_session(url, recs, i, n_utt, td, conversation, results, delay, wait) for i, delay in streams)
    )
    return results


def utterances_per_stream(args, recs, n) -> int:
    """Utterances per stream at level n: a single stream speaks every recording (at least --utterances)."""
    return max(args.utterances, len(recs)) if n == 1 else args.utterances
