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
import time

from speechrt.bench import whisper_live
from speechrt.bench.fingerprint import usable_cores
from speechrt.bench.pacing import FINAL_WAIT_S
from speechrt.bench.record import Results
from speechrt.bench.server_clients import STREAMS_PER_PROCESS, ClientPool
from speechrt.bench.server_engines import Speechrt, WhisperLive, client_processes
from speechrt.bench.server_results import BOUND_S, LIVE_BOUND_S, WER_SLACK, long_turn, print_row, records, summary
from speechrt.bench.server_streams import CHUNK_MS, QUESTIONS, SENTENCES, recordings, spoken, turn_detection
from speechrt.cli_paths import output_file

# --find-max levels: to 24 a 2-core CPU's range, then a GPU's; the started server admits the top level
RAMP = (1, 2, 4, 6, 8, 10, 12, 16, 20, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048)


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
        help="transcription sessions, conversation turns (ASR -> LM -> voice), or both, one after the other "
        "(default: %(default)s)",
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
        "32, then 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048 for a GPU) to find the largest N with "
        "p95 final <= 1 s, stopping at the first level that misses it (reported too: the largest that also keeps "
        "live p50 <= 1 s and WER within a point of the same utterances alone)",
    )
    p.add_argument(
        "--max-streams", type=int, default=24, help="upper end of the --find-max ramp (default: %(default)s)"
    )
    p.add_argument("--keep-going", action="store_true", help="run every level even after one missed p95 final <= 1 s")
    p.add_argument(
        "--client-processes",
        default="auto",
        metavar="N",
        help="processes that send a level's streams, each its share on its own event loop (stream i in process i "
        f"mod N); auto (default): one per {STREAMS_PER_PROCESS} streams of the level, at most half the cores, "
        "1 up to 128 streams (this process)",
    )
    p.add_argument(
        "--final-wait",
        type=float,
        default=FINAL_WAIT_S,
        metavar="SECONDS",
        help="how long a stream waits for an utterance's final transcript (or answer) before counting it and the "
        "stream's later utterances lost (default: %(default)s)",
    )
    p.add_argument(
        "--time-budget",
        type=float,
        default=None,
        metavar="SECONDS",
        help="start no level past this many seconds of the sweep (the levels left are recorded as skipped; "
        "default: no limit)",
    )
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
        "the words so far read as finished (default: %(default)s)",
    )
    p.add_argument(
        "--silence-duration-ms", type=int, default=200, help="server_vad pause that ends a turn (default 200)"
    )
    p.add_argument(
        "--eagerness",
        choices=["low", "medium", "high", "auto"],
        default="auto",
        help="semantic_vad eagerness (default: %(default)s)",
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
    p.add_argument("--workers", type=int, default=None, help="the started server's --workers (default: the server's)")
    p.add_argument("--device", default="cpu", help="the started server's --device (default: %(default)s)")
    p.add_argument(
        "--asr-loop-threads", type=int, default=1, help="the started server's --asr-loop-threads (default: %(default)s)"
    )
    p.add_argument("--lm-threads", type=int, default=0, help="the started server's --lm-threads (default 0, as serve)")
    p.add_argument(
        "--max-batch", type=int, default=None, help="the started server's --max-batch (default: the server's)"
    )
    p.add_argument(
        "--partial-interval",
        type=float,
        default=1.0,
        help="the started server's --partial-interval (0: no live deltas) (default: %(default)s)",
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
        help="transcription: after the sweep, one session speaks SECONDS of speech without a pause "
        "(--long-turn-speech) while another speaks its utterances; records the long turn's final latency and WER "
        "and the other's finals",
    )
    p.add_argument(
        "--long-turn-speech",
        choices=["paced", "dense", "both"],
        default="both",
        help="--long-turn's speech: the benchmark's sentences 0.15 s apart (paced), a read passage at ~250 words a "
        "minute with no pause over 80 ms (dense: Whisper's segments of it end anywhere), or one of each "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--json",
        default=None,
        type=output_file("--json", "results.json"),
        help="also write the results (speechrt.bench.record schema) to this file",
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


def _sweep(engines, recs, levels, conversation, args, out: Results) -> dict:
    """Every level on every engine in turn (so both see the same background load); an engine stops after
    its first level over the bound unless --keep-going; no level starts past --time-budget. -> {engine name: [rows]}"""
    rows = {e.name: [] for e in engines}
    active, t0 = list(engines), time.monotonic()
    for n in levels:
        if args.time_budget is not None and time.monotonic() - t0 > args.time_budget:
            rest = [m for m in levels if m >= n]
            for e in active:
                out.skip(
                    "server",
                    f"{e.name} {','.join(map(str, rest))} streams",
                    f"past --time-budget {args.time_budget:g} s",
                )
            print(f"(levels {','.join(map(str, rest))} not run: past --time-budget {args.time_budget:g} s)")
            break
        for e in list(active):
            try:
                alone = next((r for r in rows[e.name] if r["streams"] == 1), None)
                row = summary(n, e.level(recs, n), conversation, alone)
                row.update(getattr(e, "last", {}))
            except (OSError, RuntimeError, asyncio.TimeoutError) as ex:
                if e.name == "speechrt":
                    raise
                out.skip("server", f"{e.name} {n} streams", f"failed: {type(ex).__name__}: {ex}")
                active.remove(e)
                continue
            rows[e.name].append(row)
            print_row(e.name, row, conversation)
            if not row["ok"] and not args.keep_going:
                active.remove(e)
                rest = [m for m in levels if m > n]
                if rest:
                    out.skip("server", f"{e.name} {','.join(map(str, rest))} streams", _missed(row))
        if not active:
            break
    return rows


def _missed(row) -> str:
    """Why a level missed the bound, in words."""
    n, p95 = row["streams"], row["final"]["p95"]
    why = []
    if p95 is not None and p95 > BOUND_S:
        why.append(f"p95 final latency passed {BOUND_S:g} s at {n} streams")
    if row["lost"]:
        refused = f", {row['refused']} refused" if row.get("refused") else ""
        why.append(f"{row['lost']} utterances without a final transcript at {n} streams{refused}")
    return "; ".join(why)


def _check(args) -> None:
    from speechrt.errors import UserError

    if args.client_processes != "auto" and not (args.client_processes.isdigit() and int(args.client_processes) >= 1):
        raise UserError(f"--client-processes must be a positive number or auto, got {args.client_processes!r}")
    if not args.final_wait > 0:
        raise UserError(f"--final-wait must be a positive number of seconds, got {args.final_wait:g}")


def raise_open_files_limit() -> None:
    """Open files up to the hard limit for this process and those it starts (the server, the client processes): a
    level of 2,048 streams holds 2,048 sockets on each side, past the usual soft limit of 1,024."""
    try:
        import resource
    except ImportError:  # (not on Windows)
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else 1 << 16, hard))
        except (ValueError, OSError):
            pass


def run(args):
    out = Results()
    if args.setup_peer:
        from pathlib import Path

        whisper_live.setup(Path(args.peer_venv))
        return 0
    levels = _levels(args)
    _check(args)
    raise_open_files_limit()
    modes = ["transcription", "conversation"] if args.mode == "both" else [args.mode]
    venv = _peer_venv(args, out) if "transcription" in modes else None
    settings = (
        f"{args.utterances} utterances per stream, real-time pace, {CHUNK_MS} ms chunks, streams "
        f"{'staggered' if args.stagger else 'started at once'}; turn detection: "
        f"{', '.join(f'{k}={v}' for k, v in turn_detection(args).items())}; cores: {usable_cores()}"
        + ("" if args.speculative_replies else "; no speculative replies")
    )
    out.notes.append(f"bench server: {settings}")
    for mode in modes:
        conversation = mode == "conversation"
        # stream i speaks recordings i, i+1, ...: synthesize only those the highest level uses
        texts = QUESTIONS if conversation else SENTENCES
        recs = recordings(texts[: max(levels) + args.utterances - 1])
        clients = ClientPool(spoken(recs), max(client_processes(args, n) for n in levels))
        engines = []
        try:
            engines.append(Speechrt(args, conversation, clients, max_sessions=max(256, *levels)))
            engines += [Speechrt(args, conversation, clients, url, name) for name, url in _also_urls(args)]
            if venv is not None and not conversation:
                engines.append(WhisperLive(args, venv, recs))
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
            rows = _sweep(engines, recs, levels, conversation, args, out)
            if args.long_turn > 0 and not conversation:
                long_turn(engines[0], recs, args, out)
        finally:
            for e in engines:
                e.close()
            clients.close()
        peer = next((e for e in engines if isinstance(e, WhisperLive)), None)
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
            out.records += records(e, mode, rows[e.name], peer_label, levels)
    if args.json:
        out.write(args.json)
    return 0
