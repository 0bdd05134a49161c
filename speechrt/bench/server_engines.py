"""The servers a `bench server` sweep measures, level by level: speechrt's (started here, or running at a URL),
its streams sent by the client processes (server_clients.py), and the WhisperLive peer."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

from speechrt.bench import whisper_live
from speechrt.bench.fingerprint import usable_cores
from speechrt.bench.server_clients import default_processes
from speechrt.bench.server_load import LevelLoad
from speechrt.bench.server_streams import start_delays, turn_detection, utterances_per_stream


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(args, conversation: bool, max_sessions: int = 256):
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
        str(max_sessions),
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
    if args.workers is not None:
        cmd += ["--workers", str(args.workers)]
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


def http_base(url: str) -> str:
    """ws://host:port/v1/realtime -> http://host:port (wss -> https)."""
    return url.replace("ws://", "http://").replace("wss://", "https://").split("/v1/")[0]


class Speechrt:
    """speechrt's server: started here (one per mode) or the one at --url."""

    name = "speechrt"

    def __init__(self, args, conversation, clients, url=None, name="speechrt", max_sessions=256):
        self.proc, self.args, self.conversation, self.name = None, args, conversation, name
        self.clients = clients  # the ClientPool that sends its streams
        if url or args.url:
            self.url = url or args.url
            with urllib.request.urlopen(http_base(self.url) + "/healthz", timeout=10) as r:
                health = json.load(r)
        else:
            self.proc, self.url, health = start_server(args, conversation, max_sessions)
        # RunnerInfo's text: "whisper-tiny.en (ct2-whisper) as float32 on torch/cpu, ..."
        m = re.search(r" as (\S+) on ([^/\s]+)/([^,\s]+)", health.get("runners", {}).get("asr", ""))
        self.backend, self.precision, self.device = (
            (m.group(2), m.group(1), m.group(3)) if m else (args.backend, "?", args.device)
        )

    def level(self, recs, n):
        """n streams speaking `recs` from the client processes -> their results; self.last: the level's load (the
        server's, from its /metrics and NVML, and the clients')."""
        a = self.args
        streams = list(enumerate(start_delays(recs, n, self.conversation, a.stagger)))
        with LevelLoad(http_base(self.url), self.device) as load:
            results, clients = self.clients.level(
                self.url,
                streams,
                utterances_per_stream(a, recs, n),
                turn_detection(a),
                self.conversation,
                client_processes(a, n),
                a.final_wait,
            )
        self.last = {**load.row, **clients.row}
        return results

    def close(self):
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(30)


class WhisperLive:
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
        delays = start_delays(recs, n, False, self.args.stagger)
        return asyncio.run(
            whisper_live.level(
                self.url, str(self.model_dir), recs, n, utterances_per_stream(self.args, recs, n), delays
            )
        )

    def close(self):
        self.server.close()


def client_processes(args, n: int) -> int:
    """The client processes for n streams: --client-processes, or (auto) default_processes for this host's cores."""
    if args.client_processes == "auto":
        return default_processes(n, usable_cores())
    return min(int(args.client_processes), n)
