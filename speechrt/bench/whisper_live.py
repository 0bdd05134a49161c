"""WhisperLive (`whisper-live` on PyPI, Collabora) as the streaming-server peer of `speechrt bench server`.

It runs in its own virtual environment (its declared dependencies pin CUDA, OpenVINO and openai-whisper
packages that a CPU benchmark never imports), made by `setup()`: `whisper-live` with `--no-deps`, then
the modules its faster-whisper server imports, at the versions it pins. Its server is started on the
same CTranslate2 Whisper weights speechrt serves (`faster_whisper_custom_model_path`, one model shared
by all clients), with the same thread count.

Its protocol: a JSON options message, `SERVER_READY`, then float32 16 kHz audio frames; the server
re-transcribes its buffer in a loop and sends the last segments, each `completed` once Whisper starts a
new segment after it or its text repeats `same_output_threshold` times (10, its client's default). An
utterance's final transcript is the first completed segment that reaches the end of its speech; partial
is the first text of the utterance. Latencies are measured as for speechrt (from the speech's first and
last samples' send times).
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np

from speechrt.bench.pacing import FINAL_WAIT_S, listen, send_paced
from speechrt.errors import UserError

NAME = "whisper-live"
DEFAULT_VENV = Path(os.environ.get("SPEECHRT_PEER_VENV", "~/.cache/speechrt/peers/whisper-live")).expanduser()
# the server's imports, at the versions whisper-live 0.10.0 pins (faster-whisper, tokenizers)
PACKAGE = "whisper-live==0.10.0"
IMPORTS = ("torch==2.13.0", "faster-whisper==1.2.0", "tokenizers==0.20.3", "fastapi", "uvicorn", "websockets")
CHUNK_S = 0.1
RATE = 16000
# its client's defaults (whisper_live.client.Client)
OPTIONS = {
    "task": "transcribe",
    "language": "en",
    "use_vad": True,
    "send_last_n_segments": 10,
    "no_speech_thresh": 0.45,
    "clip_audio": False,
    "same_output_threshold": 10,
}
LAUNCH = """import sys
from whisper_live.server import TranscriptionServer
TranscriptionServer().run("127.0.0.1", port=int(sys.argv[1]), backend="faster_whisper",
                          faster_whisper_custom_model_path=sys.argv[2], single_model=True, max_clients=256,
                          max_connection_time=3600)
"""


def python_of(venv: Path) -> Path:
    return venv / "bin" / "python"


def setup(venv: Path) -> None:
    """Create the peer's virtual environment with pip from the package index (needs the index reachable)."""
    steps = [
        [sys.executable, "-m", "venv", str(venv)],
        [str(python_of(venv)), "-m", "pip", "install", "--no-deps", PACKAGE],
        [str(python_of(venv)), "-m", "pip", "install", *IMPORTS],
    ]
    for cmd in steps:
        print("+ " + " ".join(cmd), flush=True)
        if subprocess.run(cmd).returncode != 0:
            raise UserError(f"setting up the {NAME} peer failed at: {' '.join(cmd)}")
    problem = unavailable(venv)
    if problem:
        raise UserError(f"the {NAME} peer was installed in {venv} but does not start: {problem}")
    print(f"{NAME} peer ready in {venv}")


def unavailable(venv: Path) -> str | None:
    """Why the peer cannot run from `venv`, or None when it can."""
    py = python_of(venv)
    if not py.exists():
        return (
            f"no virtual environment at {venv}: create it with `speechrt bench server --setup-peer` "
            f"(pip installs {PACKAGE} with --no-deps, then {', '.join(IMPORTS)})"
        )
    r = subprocess.run([str(py), "-c", "import whisper_live.server"], capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        return f"`import whisper_live.server` fails in {venv}: {(r.stderr.strip().splitlines() or ['?'])[-1]}"
    return None


def version(venv: Path) -> str:
    r = subprocess.run(
        [str(python_of(venv)), "-c", "import whisper_live; print(whisper_live.__version__)"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return r.stdout.strip() or "?"


class Server:
    """A WhisperLive server process on a free loopback port, on the model directory `model_dir`."""

    def __init__(self, venv: Path, model_dir: Path, threads: int):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"ws://127.0.0.1:{self.port}"
        self.model_dir = str(model_dir)
        env = dict(os.environ, OMP_NUM_THREADS=str(threads))  # CTranslate2's intra-op threads
        self.log = open(os.devnull, "w")
        self.proc = subprocess.Popen(
            [str(python_of(venv)), "-c", LAUNCH, str(self.port), self.model_dir],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env=env,
        )
        deadline = time.time() + 120
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{NAME} server exited with {self.proc.returncode}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError as e:
                if time.time() > deadline:
                    self.close()
                    raise RuntimeError(f"{NAME} server did not listen within 120 s") from e
                time.sleep(0.3)

    def warm_up(self, pcm16: bytes) -> None:
        """The model loads when the first client connects (before SERVER_READY): one client sends an
        utterance at once and leaves after the first transcription of it, so that timing starts with the
        model loaded and CTranslate2's first call made (waiting for this utterance's final would cost the
        ~10 re-transcriptions its final takes)."""
        asyncio.run(_first_text(self.url, self.model_dir, to_float16k(pcm16)))

    def close(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()


def to_float16k(pcm16: bytes) -> np.ndarray:
    from speechrt.models.audio import resample

    return resample(np.frombuffer(pcm16, "<i2").astype(np.float32) / 32768, 24000, RATE).astype(np.float32)


async def _ready(ws, model_dir):
    """Open a WhisperLive session on `ws`: its options, then its SERVER_READY."""
    await ws.send(json.dumps(dict(OPTIONS, uid=str(uuid.uuid4()), model=model_dir)))
    while True:
        ev = json.loads(await asyncio.wait_for(ws.recv(), 120))
        if ev.get("status") in ("WAIT", "ERROR"):
            raise RuntimeError(f"{NAME} refused the session: {ev}")
        if ev.get("message") == "SERVER_READY":
            return


async def _first_text(url, model_dir, audio: np.ndarray) -> None:
    from websockets.asyncio.client import connect

    async with connect(url, max_size=None, open_timeout=60) as ws:
        await _ready(ws, model_dir)
        await ws.send(audio.tobytes())
        while True:
            ev = json.loads(await asyncio.wait_for(ws.recv(), 120))
            if ev.get("status") == "ERROR":
                raise RuntimeError(f"{NAME}: {ev}")
            if any(s.get("text", "").strip() for s in ev.get("segments", [])):
                return


async def _session(url, model_dir, recs, idx, n_utt, results, delay):
    """One client: utterances back to back in one session, each followed by its silence, the next one
    sent once this one's final has arrived (as the speechrt streams do)."""
    from websockets.asyncio.client import connect

    await asyncio.sleep(delay)
    async with connect(url, max_size=None, open_timeout=60) as ws:
        await _ready(ws, model_dir)
        events, rd = listen(ws)
        t_stream = 0.0  # seconds of audio sent so far in this session
        try:
            for u in range(n_utt):
                text, pcm, s0, s1 = recs[(idx + u) % len(recs)]
                audio = to_float16k(pcm)

                async def send(a, b, audio=audio):
                    await ws.send(audio[a:b].tobytes())

                t_speech_start, t_speech_end = await send_paced(send, len(audio), RATE, CHUNK_S, (s0, s1))
                u_speech = (t_stream + s0, t_stream + s1, t_speech_start, t_speech_end)
                t_stream += len(audio) / RATE
                r = {"stream": idx, "text": text}
                deadline = time.perf_counter() + FINAL_WAIT_S
                while "final" not in r:
                    try:
                        t, ev = await asyncio.wait_for(events.get(), max(0.0, deadline - time.perf_counter()))
                    except asyncio.TimeoutError:
                        break
                    if ev.get("status") == "ERROR":
                        raise RuntimeError(f"{NAME}: {ev}")
                    _fold(ev, t, u_speech, r)
                results.append(r)
        finally:
            rd.cancel()


def _fold(ev: dict, t: float, speech: tuple, r: dict) -> None:
    """Fold a segments message received at `t` into the utterance's result. partial: the first text
    inside the utterance; final: the first completed segment that reaches the end of its speech
    (Whisper's segment ends fall within ~0.3 s of it). `speech`: (start, end) in the session's audio
    time and the send times of those samples."""
    a0, a1, t_speech_start, t_speech_end = speech
    for seg in ev.get("segments", []):
        start, end, text = float(seg["start"]), float(seg["end"]), seg.get("text", "").strip()
        if not text or end <= a0 or start >= a1 + 1.0:
            continue  # another utterance's segment
        r.setdefault("partial", t - t_speech_start)
        if seg.get("completed"):
            done = r.setdefault("segments", {})
            done[round(start, 2)] = text
            if end >= a1 - 0.3 and "final" not in r:
                r["final"] = t - t_speech_end
                r["transcript"] = " ".join(done[k] for k in sorted(done))


async def level(url, model_dir, recs, n, n_utt, delays) -> list[dict]:
    results: list = []
    await asyncio.gather(*(_session(url, model_dir, recs, i, n_utt, results, delays[i]) for i in range(n)))
    return results
