"""`speechrt bench server`: replay speech at real-time pace over N concurrent Realtime sessions against
a `speechrt serve` process, and report latencies per utterance:

- partial ("first live" in the table): speech START -> the first live transcript delta (it includes the
  time the person has been speaking, about a live interval or more, so it can exceed the final latency,
  which is timed from the END of speech);
- final: end of speech (the last speech sample sent) -> `...input_audio_transcription.completed`;
- first audio (conversation mode): `response.created` -> first `response.output_audio.delta` (the answer's
  language model and speech synthesis, after the transcript);
- voice-to-voice (conversation mode): end of speech -> first `response.output_audio.delta`.

`--streams 1,2,4,8,16,32` is a load sweep: each level in turn, up to the first level whose p95 final
latency passes one second (`--keep-going` runs them all); the highest level that keeps it is reported.
Side by side, level by level, the same streams run against a peer streaming server on the same Whisper
weights (WhisperLive, `whisper_live.py`; transcription only). Streams are staggered by default (stream i
starts i/N of an utterance cycle later), as independent speakers are; --no-stagger starts them together,
so every turn ends in the same instant (the burst case: N transcripts asked for at once).
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import numpy as np

from speechrt.bench import whisper_live
from speechrt.bench.fingerprint import usable_cores
from speechrt.bench.pacing import FINAL_WAIT_S, listen, send_paced
from speechrt.bench.record import Record, Repeats, Results, percentile
from speechrt.bench.server_load import LOAD, LevelLoad
from speechrt.models.wer import normalize, wer

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
CHUNK_MS = 100
RATE = 24000
KEYS = ("partial", "final", "first_audio", "v2v")  # latencies per utterance; the last two in conversations
BOUND_S = 1.0  # the p95 final-transcript latency a level must keep
# issue 14's capacity: besides p95 final <= BOUND_S, live text p50 <= 1 s and WER within 1 point of the same
# utterances spoken alone
LIVE_BOUND_S = 1.0
RAMP = (1, 2, 4, 6, 8, 10, 12, 16, 20, 24, 32, 48, 64, 96, 128, 192, 256)  # --find-max levels; the server admits 256
WER_SLACK = 0.01


def add_arguments(p):
    p.add_argument(
        "--streams",
        default="1",
        help="concurrent sessions: a number, or a comma list of levels for a "
        "load sweep (e.g. 1,2,4,8,16,32; default 1)",
    )
    p.add_argument(
        "--mode",
        choices=["transcription", "conversation", "both"],
        default="transcription",
        help="transcription sessions, conversation turns (ASR -> LM -> voice), or both, one after the other",
    )
    p.add_argument("--utterances", type=int, default=4, help="utterances per stream (default 4)")
    p.add_argument(
        "--no-stagger",
        dest="stagger",
        action="store_false",
        help="start every stream at once, so that all turns end together (a burst); by default stream i "
        "starts i/N of an utterance cycle later, as independent speakers would",
    )
    p.add_argument(
        "--find-max",
        action="store_true",
        help="ramp streams up (1, 2, 4, 6, 8, 10, 12, 16, 20, 24, "
        "32, then 48, 64, 96, 128, 192, 256 for a GPU) to find the largest N with p95 final <= 1 s "
        "(reported too: the largest that also keeps live p50 <= 1 s and WER within a point of the same "
        "utterances alone)",
    )
    p.add_argument("--max-streams", type=int, default=24, help="upper end of the --find-max ramp")
    p.add_argument("--keep-going", action="store_true", help="run every level even after one missed p95 final <= 1 s")
    p.add_argument(
        "--peer",
        choices=["auto", "whisper-live", "none"],
        default="auto",
        help="streaming server run side by side on the same weights (transcription): whisper-live; "
        "auto (default): whisper-live when its virtual environment exists",
    )
    p.add_argument(
        "--peer-venv",
        default=str(whisper_live.DEFAULT_VENV),
        help="the peer's virtual environment (default: $SPEECHRT_PEER_VENV or %(default)s)",
    )
    p.add_argument("--setup-peer", action="store_true", help="create the peer's virtual environment with pip and exit")
    p.add_argument(
        "--turn-detection",
        choices=["server_vad", "semantic_vad"],
        default="server_vad",
        help="server_vad: a fixed pause ends a turn; semantic_vad: the pause needed depends on whether "
        "the words so far read as finished",
    )
    p.add_argument(
        "--silence-duration-ms", type=int, default=200, help="server_vad pause that ends a turn (default 200)"
    )
    p.add_argument(
        "--eagerness", choices=["low", "medium", "high", "auto"], default="auto", help="semantic_vad eagerness"
    )
    p.add_argument(
        "--url", default=None, help="an already running server (ws://host:port/v1/realtime); default: start one"
    )
    p.add_argument(
        "--also-url",
        action="append",
        default=[],
        metavar="NAME=URL",
        help="another running speechrt server measured side by side, level by level in the same run "
        "(e.g. ray=ws://127.0.0.1:8000/v1/realtime for `speechrt serve --ray`; repeatable)",
    )
    p.add_argument("--threads", type=int, default=None, help="PyTorch threads of the started server (and the peer's)")
    p.add_argument("--backend", default="auto", help="the started server's --backend (default auto, as serve)")
    p.add_argument("--device", default="cpu", help="the started server's --device")
    p.add_argument("--asr-loop-threads", type=int, default=1, help="the started server's --asr-loop-threads")
    p.add_argument("--lm-threads", type=int, default=0, help="the started server's --lm-threads (default 0, as serve)")
    p.add_argument(
        "--max-batch", type=int, default=None, help="the started server's --max-batch (default: the server's)"
    )
    p.add_argument(
        "--partial-interval",
        type=float,
        default=1.0,
        help="the started server's --partial-interval (0: no live deltas)",
    )
    p.add_argument(
        "--final-margin",
        type=float,
        default=None,
        metavar="SECONDS",
        help="the started server's --final-margin (default: the server's)",
    )
    p.add_argument(
        "--loaded-final-margin",
        type=float,
        default=None,
        metavar="SECONDS",
        help="the started server's --loaded-final-margin (default: the server's; 0: the full margin always)",
    )
    p.add_argument(
        "--no-speculative-replies",
        dest="speculative_replies",
        action="store_false",
        help="start the server with --no-speculative-replies (replies begun only once the turn ends)",
    )
    p.add_argument(
        "--long-turn",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="transcription: after the sweep, one session speaks SECONDS of speech without a pause while "
        "another speaks its utterances; records the long turn's final latency and the other's",
    )
    p.add_argument("--json", default=None, help="also write the results (speechrt.bench.record schema) to this file")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(args, conversation: bool):
    """`speechrt serve` started in its own process with `bench server`'s options `args` (a conversation server, or
    transcription only) -> (process, its Realtime URL, its /healthz)."""
    port = _free_port()
    cmd = [
        sys.executable,
        "-m",
        "speechrt",
        "serve",
        "--port",
        str(port),
        "--max-sessions",
        "256",
        "--backend",
        args.backend,
        "--device",
        args.device,
    ]
    if not conversation:
        cmd.append("--transcription-only")
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    cmd += [
        "--partial-interval",
        str(args.partial_interval),
        "--asr-loop-threads",
        str(args.asr_loop_threads),
        "--lm-threads",
        str(args.lm_threads),
    ]
    if args.max_batch is not None:
        cmd += ["--max-batch", str(args.max_batch)]
    if args.final_margin is not None:
        cmd += ["--final-margin", str(args.final_margin)]
    if args.loaded_final_margin is not None:
        cmd += ["--loaded-final-margin", str(args.loaded_final_margin)]
    if not args.speculative_replies:
        cmd.append("--no-speculative-replies")
    log = tempfile.TemporaryFile("w+")  # (a pipe nobody reads could fill up and stall the server)
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 300
    while time.time() < deadline:
        if proc.poll() is not None:
            log.seek(0)
            raise SystemExit(f"server exited: {log.read()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as r:
                health = json.load(r)
            return proc, f"ws://127.0.0.1:{port}/v1/realtime", health
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


def _long_recording(recs, seconds: float):
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


async def _long_level(url, recs, long_rec, args):
    """One session speaks `long_rec`; another, starting 5 s later, speaks its utterances. -> (the long turn's
    result, the other's results)."""
    long_res, short_res = [], []
    td = _turn_detection(args)
    await asyncio.gather(
        _stream(url, [long_rec], 0, 1, td, False, long_res),
        _stream(url, recs, 1, args.utterances, td, False, short_res, 5.0),
    )
    return long_res[0], short_res


def _long_turn(engine, recs, args, out: Results) -> None:
    """--long-turn: the long turn's final latency and WER and the other session's finals, printed and recorded."""
    from speechrt.models.registry import resolve

    # every sentence once before any repeats (a text that loops would be cut as a decoding loop)
    long_rec = _long_recording(_recordings(SENTENCES), args.long_turn)
    r, others = asyncio.run(_long_level(engine.url, recs, long_rec, args))
    row = _summary(1, others, False)
    seconds = long_rec[3] - long_rec[2]
    print(
        f"long turn: {seconds:.1f} s without a pause beside 1 stream: final "
        + (
            f"{1000 * r['final']:.0f} ms after its speech ended, WER {100 * wer(r['text'], r['transcript']):.1f}%"
            if "final" in r
            else "never came"
        )
        + "; the other stream:"
    )
    _print(engine.name, row, False)
    workload = f"long turn {seconds:.0f} s beside 1 stream"
    common = dict(
        family="server",
        model=resolve(None, "asr").name,
        engine=engine.name,
        backend=engine.backend,
        precision=engine.precision,
        device=engine.device,
        workload=workload,
        params={"long_turn_s": round(seconds, 1), "utterances": row["utterances"], "lost": row["lost"]},
    )
    if "final" in r:
        out.records += [
            Record(metric="long_turn_final_s", unit="s", value=r["final"], better="lower", **common),
            Record(metric="long_turn_wer", unit="%", value=100 * wer(r["text"], r["transcript"]), better="", **common),
        ]
    if row["final"]["p95"] is not None:
        out.records += [
            Record(
                metric=f"final_{q}_s",
                unit="s",
                value=row["final"][q],
                better="lower",
                repeats=Repeats.of(row["final"]["samples"]),
                **common,
            )
            for q in ("p50", "p95")
        ]


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
        events, rd = listen(ws)
        try:
            for u in range(n_utt):
                text, pcm, s0, s1 = recs[(idx + u) % len(recs)]

                async def send(a, b, pcm=pcm):  # samples a..b of pcm16
                    await ws.send(
                        json.dumps(
                            {
                                "type": "input_audio_buffer.append",
                                "audio": base64.b64encode(pcm[2 * a : 2 * b]).decode(),
                            }
                        )
                    )

                t_speech_start, t_speech_end = await send_paced(send, len(pcm) // 2, RATE, CHUNK_MS / 1000, (s0, s1))
                r, deltas = {"stream": idx, "text": text}, []
                t_response = None
                while True:
                    try:
                        t, ev = await asyncio.wait_for(events.get(), FINAL_WAIT_S)
                    except asyncio.TimeoutError:  # an overloaded server: counted as lost, not a crash
                        results.append(r)
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


def _delays(recs, n, conversation, stagger) -> list[float]:
    """Start offsets: stream i starts i/n of an utterance cycle (the mean recording, plus the answer's time
    in conversations) after the first; all at once without stagger."""
    cycle = sum(len(pcm) / 2 / RATE for _, pcm, _, _ in recs) / len(recs) + (1.5 if conversation else 0.3)
    return [cycle * i / n if stagger else 0.0 for i in range(n)]


async def _level(url, recs, n, args, conversation):
    """n streams, each speaking _utterances(): so each level's WER has the same utterances spoken alone to compare
    with (_summary's wer_alone)."""
    results: list = []
    delays = _delays(recs, n, conversation, args.stagger)
    utterances, td = _utterances(args, recs, n), _turn_detection(args)
    await asyncio.gather(*(_stream(url, recs, i, utterances, td, conversation, results, delays[i]) for i in range(n)))
    return results


def _utterances(args, recs, n) -> int:
    """Utterances per stream at level n: a single stream speaks every recording (at least --utterances)."""
    return max(args.utterances, len(recs)) if n == 1 else args.utterances


def _summary(n, results, conversation, alone: dict | None = None) -> dict:
    """One level: p50/p95 of each latency over its utterances (None where none had it), the utterances
    that got no final transcript, the word error rate, and (given `alone`, the single-stream level's row) the
    word error rate of the same utterances spoken alone; how many utterances' live deltas did not add up to
    their final transcript (words sent live that the final transcript does not begin with)."""
    row = {"streams": n, "utterances": len(results), "lost": sum("final" not in r for r in results)}
    for key in KEYS if conversation else KEYS[:2]:
        xs = [r[key] for r in results if key in r]
        row[key] = {
            "p50": percentile(xs, 0.5) if xs else None,
            "p95": percentile(xs, 0.95) if xs else None,
            "samples": xs,
        }
    row["pairs"] = [(r["text"], r.get("transcript", "")) for r in results]
    refs = [t for t, _ in row["pairs"]]
    row["wer"] = wer(refs, [h for _, h in row["pairs"]])
    heard = dict(alone["pairs"]) if alone else {}
    if alone and all(t in heard for t in refs):
        row["wer_alone"] = wer(refs, [heard[t] for t in refs])
    row["live_inconsistent"] = sum(r.get("live_consistent") is False for r in results)
    row["ok"] = row["lost"] == 0 and row["final"]["p95"] is not None and row["final"]["p95"] <= BOUND_S
    live = row["partial"]["p50"]  # None where the server sent no live text (--partial-interval 0)
    row["meets"] = (
        row["ok"]
        and (live is None or live <= LIVE_BOUND_S)
        and row["wer"] <= row.get("wer_alone", row["wer"]) + WER_SLACK
    )
    return row


def _print(name, row, conversation):
    def f(d):
        return " ".join(f"{1000 * d[q]:7.0f}" if d[q] is not None else f"{'-':>7}" for q in ("p50", "p95"))

    line = f"{name:14} {row['streams']:7d} {f(row['partial'])}  {f(row['final'])}"
    if conversation:
        line += f"  {f(row['first_audio'])}  {f(row['v2v'])}"
    lost = f"  ({row['lost']} without a final)" if row["lost"] else ""
    alone = f" (alone {100 * row['wer_alone']:.1f}%)" if "wer_alone" in row and row["streams"] > 1 else ""
    live = f"  {row['live_inconsistent']} with live text unlike the final" if row.get("live_inconsistent") else ""
    loaded = f"  {row['loaded_margin']} finals with the loaded margin" if row.get("loaded_margin") else ""
    load = "".join(f", {what} {fmt.format(row[k])}" for k, what, fmt in LOAD if k in row)
    print(
        line + f"  {100 * row['wer']:5.1f}%" + alone + lost + live + loaded + (f"  ({load[2:]})" if load else ""),
        flush=True,
    )


def _also_urls(args) -> list[tuple[str, str]]:
    from speechrt.errors import UserError

    out = []
    for spec in args.also_url:
        name, _, url = spec.partition("=")
        if not name or not url.startswith(("ws://", "wss://")) or name == "speechrt":
            raise UserError(
                f"--also-url wants NAME=ws://host:port/v1/realtime with a NAME other than 'speechrt', got {spec!r}"
            )
        out.append((name, url))
    return out


def _levels(args) -> list[int]:
    from speechrt.errors import UserError

    if args.find_max:
        return [n for n in RAMP if n <= args.max_streams]
    try:
        levels = [int(x) for x in str(args.streams).split(",") if x.strip()]
    except ValueError:
        levels = []
    if not levels or min(levels) < 1:
        raise UserError(f"--streams must be a positive number or a comma list of them (1,2,4,8), got {args.streams!r}")
    return sorted(set(levels))


def http_base(url: str) -> str:
    """ws://host:port/v1/realtime -> http://host:port (wss -> https)."""
    return url.replace("ws://", "http://").replace("wss://", "https://").split("/v1/")[0]


class _Speechrt:
    """speechrt's server: started here (one per mode) or the one at --url."""

    name = "speechrt"

    def __init__(self, args, conversation, url=None, name="speechrt"):
        self.proc, self.args, self.conversation, self.name = None, args, conversation, name
        if url or args.url:
            self.url = url or args.url
            with urllib.request.urlopen(http_base(self.url) + "/healthz", timeout=10) as r:
                health = json.load(r)
        else:
            self.proc, self.url, health = start_server(args, conversation)
        # RunnerInfo's text: "whisper-tiny.en (ct2-whisper) as float32 on torch/cpu, ..."
        m = re.search(r" as (\S+) on ([^/\s]+)/([^,\s]+)", health.get("runners", {}).get("asr", ""))
        self.backend, self.precision, self.device = (
            (m.group(2), m.group(1), m.group(3)) if m else (args.backend, "?", args.device)
        )

    def level(self, recs, n):
        with LevelLoad(http_base(self.url), self.device) as load:
            results = asyncio.run(_level(self.url, recs, n, self.args, self.conversation))
        self.last = load.row
        return results

    def close(self):
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(30)


class _WhisperLive:
    name = whisper_live.NAME

    def __init__(self, args, venv, recs):
        from speechrt.models.registry import resolve

        self.args = args
        self.model_dir = resolve(None, "asr").path
        self.server = whisper_live.Server(venv, self.model_dir, args.threads or usable_cores())
        self.url = self.server.url
        self.backend, self.device = "ctranslate2", "cpu"
        self.precision = "int8"  # what its faster-whisper backend picks on the CPU
        self.version = whisper_live.version(venv)
        self.server.warm_up(recs[0][1])

    def level(self, recs, n):
        delays = _delays(recs, n, False, self.args.stagger)
        return asyncio.run(
            whisper_live.level(self.url, str(self.model_dir), recs, n, _utterances(self.args, recs, n), delays)
        )

    def close(self):
        self.server.close()


def _peer_venv(args, out: Results):
    """The peer's virtual environment, or None (with the reason recorded) when it will not run."""
    from pathlib import Path

    from speechrt.errors import UserError

    if args.peer == "none":
        return None
    venv = Path(args.peer_venv)
    problem = whisper_live.unavailable(venv)
    if problem:
        if args.peer == "whisper-live":
            raise UserError(f"peer whisper-live: {problem}")
        out.skip("server", whisper_live.NAME, problem)
        print(f"(peer {whisper_live.NAME} skipped: {problem})")
        return None
    return venv


def _records(engine, mode, rows, peer_label, levels) -> list[Record]:
    from speechrt.models.registry import resolve

    model = resolve(None, "asr").name
    out = []
    for row in rows:
        n = row["streams"]
        common = dict(
            family="server",
            model=model,
            engine=engine.name,
            backend=engine.backend,
            precision=engine.precision,
            device=engine.device,
            workload=f"{mode}, {n} streams",
            peer=peer_label if engine.name == "speechrt" else "",
            params={"streams": n, "mode": mode, "utterances": row["utterances"], "lost": row["lost"]},
        )
        for key, d in row.items():
            if key not in KEYS or d["p50"] is None:
                continue
            rep = Repeats.of(d["samples"])
            out += [
                Record(metric=f"{key}_{q}_s", unit="s", value=d[q], better="lower", repeats=rep, **common)
                for q in ("p50", "p95")
            ]
        out.append(Record(metric="wer", unit="%", value=100 * row["wer"], better="", **common))
        if "wer_alone" in row:
            out.append(
                Record(metric="wer_same_utterances_alone", unit="%", value=100 * row["wer_alone"], better="", **common)
            )
        out.append(
            Record(
                metric="live_text_unlike_final",
                unit="utterances",
                value=row["live_inconsistent"],
                better="lower",
                **common,
            )
        )
        if "loaded_margin" in row:
            out.append(
                Record(
                    metric="finals_with_loaded_margin",
                    unit="transcripts",
                    value=row["loaded_margin"],
                    better="",
                    **common,
                )
            )
        out += [
            Record(metric=metric, unit=unit, value=row[k], better="", **common)
            for k, metric, unit in (
                ("server_cpu_cores", "server_cpu_cores", "cores"),
                ("engine_busy", "engine_busy_fraction", "fraction"),
                ("vad_cores", "vad_cores", "cores"),
                ("gpu_busy", "gpu_busy_fraction", "fraction"),
            )
            if k in row
        ]
    for metric, key in (("max_streams_p95_final_le_1s", "ok"), ("max_streams_meeting_targets", "meets")):
        if rows:
            out.append(
                Record(
                    family="server",
                    model=model,
                    engine=engine.name,
                    backend=engine.backend,
                    precision=engine.precision,
                    device=engine.device,
                    workload=f"{mode} sweep {','.join(map(str, levels))}",
                    metric=metric,
                    unit="streams",
                    value=max([r["streams"] for r in rows if r[key]], default=0),
                    better="higher",
                    peer=peer_label if engine.name == "speechrt" else "",
                    params={"mode": mode},
                )
            )
    return out


def _sweep(engines, recs, levels, conversation, keep_going, out: Results) -> dict:
    """Every level on every engine in turn (so both see the same background load); an engine stops after
    its first level over the bound unless keep_going. -> {engine name: [rows]}"""
    rows = {e.name: [] for e in engines}
    active = list(engines)
    for n in levels:
        for e in list(active):
            try:
                alone = next((r for r in rows[e.name] if r["streams"] == 1), None)
                row = _summary(n, e.level(recs, n), conversation, alone)
                row.update(getattr(e, "last", {}))
            except (OSError, RuntimeError, asyncio.TimeoutError) as ex:
                if e.name == "speechrt":
                    raise
                out.skip("server", f"{e.name} {n} streams", f"failed: {type(ex).__name__}: {ex}")
                active.remove(e)
                continue
            rows[e.name].append(row)
            _print(e.name, row, conversation)
            if not row["ok"] and not keep_going:
                active.remove(e)
                rest = [m for m in levels if m > n]
                if rest:
                    out.skip(
                        "server",
                        f"{e.name} {','.join(map(str, rest))} streams",
                        f"p95 final latency passed {BOUND_S:g} s at {n} streams",
                    )
        if not active:
            break
    return rows


def run(args):
    out = Results()
    if args.setup_peer:
        from pathlib import Path

        whisper_live.setup(Path(args.peer_venv))
        return 0
    levels = _levels(args)
    modes = ["transcription", "conversation"] if args.mode == "both" else [args.mode]
    venv = _peer_venv(args, out) if "transcription" in modes else None
    settings = (
        f"{args.utterances} utterances per stream, real-time pace, {CHUNK_MS} ms chunks, streams "
        f"{'staggered' if args.stagger else 'started at once'}; turn detection: "
        f"{', '.join(f'{k}={v}' for k, v in _turn_detection(args).items())}; cores: {usable_cores()}"
        + ("" if args.speculative_replies else "; no speculative replies")
    )
    out.notes.append(f"bench server: {settings}")
    for mode in modes:
        conversation = mode == "conversation"
        # stream i speaks recordings i, i+1, ...: synthesize only those the highest level uses
        texts = QUESTIONS if conversation else SENTENCES
        recs = _recordings(texts[: max(levels) + args.utterances - 1])
        engines = [_Speechrt(args, conversation)] + [
            _Speechrt(args, conversation, url, name) for name, url in _also_urls(args)
        ]
        try:
            if venv is not None and not conversation:
                engines.append(_WhisperLive(args, venv, recs))
                out.notes.append(
                    f"peer: {whisper_live.NAME} {engines[-1].version} on the same model.bin "
                    f"(faster-whisper backend, {engines[-1].precision}, one shared model)"
                )
            print(f"\nmode: {mode}; servers: {', '.join(f'{e.name} {e.url}' for e in engines)}; {settings}")
            head = f"{'server':14} {'streams':>7} {'first live p50':>7} {'p95':>7}  {'final p50':>7} {'p95':>7}"
            if conversation:
                head += f"  {'1st audio p50':>7} {'p95':>7}  {'v2v p50':>7} {'p95':>7}"
            print(
                head + "    WER   (latencies in ms; first live: speech start -> first live delta; final: end of "
                "speech -> completed)"
            )
            rows = _sweep(engines, recs, levels, conversation, args.keep_going, out)
            if args.long_turn > 0 and not conversation:
                _long_turn(engines[0], recs, args, out)
        finally:
            for e in engines:
                e.close()
        peer = next((e for e in engines if isinstance(e, _WhisperLive)), None)
        peer_label = f"{peer.name} {peer.precision}" if peer else ""
        for e in engines:
            ok = [r["streams"] for r in rows[e.name] if r["ok"]]
            meets = [r["streams"] for r in rows[e.name] if r["meets"]]
            print(
                f"{e.name}: highest level with p95 final-transcript latency <= {BOUND_S:g} s: {max(ok, default=0)}"
                + ("" if ok else " (none)")
                + f"; with live p50 <= {LIVE_BOUND_S:g} s and WER <= alone + "
                f"{100 * WER_SLACK:g} point too: {max(meets, default=0)}" + ("" if meets else " (none)")
            )
            out.records += _records(e, mode, rows[e.name], peer_label, levels)
    if args.json:
        out.write(args.json)
    return 0
