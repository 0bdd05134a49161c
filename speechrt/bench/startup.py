"""`speechrt bench startup`: seconds from starting `speechrt serve` to its /healthz answering ready, with an empty
cache (cold: the exports and the native kernel made on first use) and with the cache that run left (warm).

Each run is its own `speechrt serve` process with $SPEECHRT_CACHE pointed at a temporary directory (speechrt's
whole cache: ONNX exports, compiled kernels); /healthz is polled every 50 ms. Two times per run: the first
answer of any kind (the port open) and the first 200 with status ok (the models loaded and warmed up); then, with
the conversation models, the first requests' latency (the first TTS byte, the first chat token), which work a start
leaves undone would raise. The server's log is kept (`--log-dir`) to show what it printed while starting, its
progress lines included.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from speechrt.bench.fingerprint import usable_cores
from speechrt.bench.record import Record, Repeats, Results

POLL_S = 0.05
TIMEOUT_S = 300.0


def add_arguments(p):
    p.add_argument("--cold", type=int, default=2, help="cold starts, each with an empty cache (default %(default)s)")
    p.add_argument(
        "--warm", type=int, default=3, help="warm starts on the cache the first cold start left (default %(default)s)"
    )
    p.add_argument(
        "--transcription-only", action="store_true", help="start the server with --transcription-only (one model)"
    )
    p.add_argument("--backend", default="auto", help="the started server's --backend (default %(default)s, as serve)")
    p.add_argument("--device", default="cpu", help="the started server's --device (default %(default)s)")
    p.add_argument("--threads", type=int, default=None, help="the started server's --threads (default: all cores)")
    p.add_argument("--log-dir", default=None, help="keep each run's server output here (default: not kept)")
    p.add_argument("--json", default=None, help="write the results here (speechrt-bench/1 schema)")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _poll(port: int) -> tuple[int | None, dict]:
    """(HTTP status or None when nothing answers, the JSON body)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        try:
            return e.code, json.load(e)
        except ValueError:
            return e.code, {}
    except (OSError, ValueError):
        return None, {}


def start_once(args, cache: Path, log_path: Path) -> dict:
    """Start `speechrt serve` on `cache`, wait for /healthz to say ready, stop it -> the times and what it ran."""
    port = _free_port()
    cmd = [sys.executable, "-m", "speechrt", "serve", "--port", str(port), "--backend", args.backend]
    cmd += ["--device", args.device] + (["--transcription-only"] if args.transcription_only else [])
    cmd += ["--threads", str(args.threads)] if args.threads else []
    env = dict(os.environ, SPEECHRT_CACHE=str(cache))
    with open(log_path, "w") as log:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, text=True)
        first = ready = cpu = None
        firsts: dict = {}
        body: dict = {}
        try:
            while time.perf_counter() - t0 < TIMEOUT_S:
                if proc.poll() is not None:
                    raise SystemExit(f"speechrt serve exited ({proc.returncode}): {log_path.read_text()[-2000:]}")
                status, body = _poll(port)
                now = time.perf_counter() - t0
                if status is not None and first is None:
                    first = now
                if status == 200 and body.get("status") == "ok":
                    ready, cpu = now, _cpu_seconds(proc.pid)
                    firsts = first_requests(port, args.transcription_only)
                    break
                time.sleep(POLL_S)
            else:
                raise SystemExit(f"speechrt serve was not ready in {TIMEOUT_S:g} s; its output: {log_path}")
        finally:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    text = log_path.read_text()
    loaded = re.search(r"models loaded in ([\d.]+) s", text)
    return {
        "first_answer_s": first,
        "ready_s": ready,
        "models_loaded_s": float(loaded.group(1)) if loaded else None,
        "cpu_s": cpu,
        "runners": body.get("runners") or {},
        **firsts,
    }


FIRST_SPEECH = {"model": "tts-1", "voice": "alloy", "input": "Hello there.", "response_format": "pcm"}
FIRST_CHAT = {"model": "speechrt", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "stream": True}


def first_requests(port: int, transcription_only: bool) -> dict:
    """Right after /healthz said ready, one request after another: seconds to the first byte of spoken audio
    (/v1/audio/speech, pcm) and to the first streamed chat token (/v1/chat/completions): what a start left undone
    would add there. None with --transcription-only."""
    out = {"first_speech_byte_s": None, "first_chat_token_s": None}
    if transcription_only:
        return out
    for key, path, body, mark in (
        ("first_speech_byte_s", "/v1/audio/speech", FIRST_SPEECH, None),
        ("first_chat_token_s", "/v1/chat/completions", FIRST_CHAT, re.compile(rb'"content":\s*"[^"]')),
    ):
        req = urllib.request.Request(
            f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        t = time.perf_counter()
        with urllib.request.urlopen(req, timeout=60) as r:
            for line in iter(lambda: r.readline(4096), b""):  # noqa: B023 - consumed within this iteration
                if mark is None or mark.search(line):  # a chunk with text (not the role's empty first one)
                    out[key] = time.perf_counter() - t
                    break
            r.read()
    return out


def _cpu_seconds(pid: int) -> float | None:
    """CPU seconds (user + system) a process and the children it waited for have used so far (Linux /proc);
    less disturbed than wall time where other work shares the cores."""
    try:
        f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return sum(int(x) for x in f[11:15]) / os.sysconf("SC_CLK_TCK")  # utime, stime, cutime, cstime


def _cache_mb(cache: Path) -> float:
    return sum(f.stat().st_size for f in cache.rglob("*") if f.is_file()) / 2**20


def _precision(runners: dict) -> str:
    """'asr int8, lm int4, tts fp32' from /healthz's runners ('whisper-tiny.en (...) as int8 on onnxruntime/cpu')."""
    got = []
    for family, info in runners.items():
        m = re.search(r" as (\S+) on (\w+)", info)
        got.append(f"{family} {m.group(2)} {m.group(1)}" if m else family)
    return ", ".join(got)


def _say(what: str, r: dict) -> None:
    cpu = f", {r['cpu_s']:.1f} CPU s" if r["cpu_s"] is not None else ""
    firsts = "".join(
        f", {label} {r[k]:.2f} s"
        for label, k in (("first TTS byte", "first_speech_byte_s"), ("first chat token", "first_chat_token_s"))
        if r.get(k) is not None
    )
    print(f"{what}: /healthz first answered {r['first_answer_s']:.2f} s, ready {r['ready_s']:.2f} s{cpu}{firsts}")


def run(args):
    from speechrt.errors import UserError

    if args.cold < 1 or args.warm < 0:
        raise UserError(f"--cold must be >= 1 and --warm >= 0, got {args.cold} and {args.warm}")
    out = Results()
    logs = Path(args.log_dir) if args.log_dir else Path(tempfile.mkdtemp(prefix="speechrt-startup-"))
    logs.mkdir(parents=True, exist_ok=True)
    caches = [Path(tempfile.mkdtemp(prefix="speechrt-cache-")) for _ in range(args.cold)]
    runs: dict[str, list[dict]] = {"cold": [], "warm": []}
    try:
        for i, cache in enumerate(caches):
            r = start_once(args, cache, logs / f"cold{i}.log")
            runs["cold"].append(r)
            _say(f"cold start {i + 1}", r)
        size = _cache_mb(caches[0])
        for i in range(args.warm):
            r = start_once(args, caches[0], logs / f"warm{i}.log")
            runs["warm"].append(r)
            _say(f"warm start {i + 1}", r)
    finally:
        for c in caches:
            shutil.rmtree(c, ignore_errors=True)
    ran = _precision(runs["cold"][0]["runners"])
    what = "transcription only" if args.transcription_only else "conversation models"
    print(f"serve ran: {ran}; the cold start's cache: {size:.0f} MiB; server logs in {logs}")
    for kind, rs in runs.items():
        if not rs:
            continue
        for metric, key in (
            ("healthz_ready_s", "ready_s"),
            ("healthz_first_answer_s", "first_answer_s"),
            ("models_loaded_s", "models_loaded_s"),
            ("cpu_s_to_ready", "cpu_s"),
            ("first_speech_byte_s", "first_speech_byte_s"),
            ("first_chat_token_s", "first_chat_token_s"),
        ):
            xs = [r[key] for r in rs if r.get(key) is not None]
            if not xs:
                continue
            rep = Repeats.of(xs)
            out.records.append(
                Record(
                    family="server",
                    model=what,
                    engine="speechrt",
                    backend=args.backend,
                    precision="",
                    device=args.device,
                    workload=f"{kind} start ({'empty cache' if kind == 'cold' else 'cache of a cold start'}), {what}",
                    metric=metric,
                    unit="s",
                    value=rep.median,
                    better="lower",
                    repeats=rep,
                    params={"threads": args.threads or usable_cores(), "runners": ran, "cache_mib": round(size)},
                )
            )
            print(f"{kind}: {metric} median {rep.median:.2f} s (min {rep.min:.2f}, max {rep.max:.2f}, n {rep.n})")
    out.notes.append(
        f"bench startup: `speechrt serve --backend {args.backend} --device {args.device}"
        f"{' --transcription-only' if args.transcription_only else ''}` with $SPEECHRT_CACHE empty (cold) and "
        f"as the first cold start left it (warm); /healthz polled every {POLL_S * 1000:.0f} ms; load average "
        f"{os.getloadavg()[0]:.1f} at the end on {usable_cores()} cores (above 0 is other work)"
    )
    if args.json:
        out.write(args.json)
    return 0
