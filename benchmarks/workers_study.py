"""`python -m benchmarks.workers_study`: how to put several engine processes behind one port — the candidates
`speechrt serve --workers` was chosen from, measured side by side on this machine:

- one process (`speechrt serve`, the baseline);
- fd passing: a front process accepts and hands each connection to the least-loaded worker (socket.send_fds;
  what `speechrt serve --workers 2` does);
- shared socket: every worker accepts on one inherited listening socket and the kernel picks who gets each
  connection (how uvicorn's and gunicorn's `--workers` run; SO_REUSEPORT spreads by a hash of the client's
  address instead, which ignores load too).

    python -m benchmarks.workers_study [--rounds 3] [--sessions 8] [--connects 40]

Per round and candidate: the time from connect to `session.created` (sequential connects, p50 and p95), how
sessions opened at once (a burst) and one after another (each kept open) spread over the workers, the server's
processes' resident memory, and the front's CPU time per connection. Transcription-only, torch backend."""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import time

SERVE = [sys.executable, "-m", "speechrt", "serve", "--transcription-only", "--backend", "torch", "--port", "0"]
CANDIDATES = {
    "one process": SERVE,
    "fd passing, 2 workers": [*SERVE, "--workers", "2"],
    "shared socket, 2 workers": [sys.executable, "-m", "benchmarks.workers_study", "--shared-socket-server", "2"],
}


# -- the shared-socket candidate: N SpeechServers accepting on one inherited socket -------------------------
def _shared_worker(index: int, sock: socket.socket, threads: int, ready) -> None:
    import torch

    from speechrt.streaming.config import ModelConfig, ServerOptions
    from speechrt.streaming.http.app import build_app
    from speechrt.streaming.server import SpeechServer

    torch.set_num_threads(threads)
    asr, _, _ = ModelConfig(transcription_only=True, backend="torch").load()

    async def main():
        server = SpeechServer(ServerOptions(port=0), asr)
        server.replica = f"worker-{index}"
        await server.start(listen=False)
        await server.serve_http([sock], build_app(server))
        ready.set()
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        await stop.wait()
        await server.shutdown(graceful=False)

    asyncio.run(main())


def shared_socket_server(n: int) -> None:
    import multiprocessing

    sock = socket.create_server(("127.0.0.1", 0))
    ctx = multiprocessing.get_context("spawn")
    events = [ctx.Event() for _ in range(n)]
    threads = max(1, len(os.sched_getaffinity(0)) // n)
    procs = [ctx.Process(target=_shared_worker, args=(i, sock, threads, events[i])) for i in range(n)]
    for p in procs:
        p.start()
    for e in events:
        e.wait()
    print(f"speechrt: serving on http://127.0.0.1:{sock.getsockname()[1]}", flush=True)
    signal.sigwait({signal.SIGTERM, signal.SIGINT})
    for p in procs:
        p.terminate()
        p.join()


# -- the driver -------------------------------------------------------------------------------------------
def _tree(pid: int) -> list[int]:
    """pid and its descendants (from /proc)."""
    children = collections.defaultdict(list)
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    children[int(f.read().rsplit(")", 1)[1].split()[1])].append(int(d))
            except OSError:
                pass
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children[p]
    return out


def _rss(pid: int) -> int:
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _open(port: int):
    from websockets.asyncio.client import connect

    ws = await connect(f"ws://127.0.0.1:{port}/v1/realtime?intent=transcription")
    created = json.loads(await ws.recv())
    return ws, (created.get("speechrt") or {}).get("replica", "worker-0")


async def _measure(port: int, front: int, sessions: int, connects: int) -> dict:
    latencies = []
    cpu0 = _cpu(front)
    for _ in range(connects):
        t = time.perf_counter()
        ws, _ = await _open(port)
        latencies.append(time.perf_counter() - t)
        await ws.close()
    front_cpu = (_cpu(front) - cpu0) / connects
    latencies.sort()
    burst = await asyncio.gather(*(_open(port) for _ in range(sessions)))
    for ws, _ in burst:
        await ws.close()
    await asyncio.sleep(0.5)
    one_by_one = [await _open(port) for _ in range(sessions)]
    for ws, _ in one_by_one:
        await ws.close()
    return {
        "connect_p50_ms": round(1000 * statistics.median(latencies), 1),
        "connect_p95_ms": round(1000 * latencies[int(0.95 * (len(latencies) - 1))], 1),
        "burst": dict(sorted(collections.Counter(w for _, w in burst).items())),
        "one_by_one": dict(sorted(collections.Counter(w for _, w in one_by_one).items())),
        "front_cpu_ms_per_connection": round(1000 * front_cpu, 2),
    }


def run_candidate(name: str, sessions: int, connects: int) -> dict:
    log = open(f"/tmp/workers_study_{os.getpid()}.log", "w+")  # noqa: SIM115
    proc = subprocess.Popen(CANDIDATES[name], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        port = None
        while port is None:
            if proc.poll() is not None:
                log.seek(0)
                raise SystemExit(f"{name} did not start:\n{log.read()}")
            time.sleep(0.5)
            log.seek(0)
            m = re.search(r"serving on http://127.0.0.1:(\d+)", log.read())
            port = int(m.group(1)) if m else None
        row = asyncio.run(_measure(port, proc.pid, sessions, connects))
        row["rss_mib"] = round(sum(_rss(p) for p in _tree(proc.pid)) / 2**20)
        return row
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(60)
        log.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sessions", type=int, default=8, help="sessions opened at once, then one by one")
    ap.add_argument("--connects", type=int, default=40, help="sequential connects timed")
    ap.add_argument("--shared-socket-server", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.shared_socket_server:
        return shared_socket_server(args.shared_socket_server)
    names = list(CANDIDATES)
    for r in range(args.rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            print(json.dumps({"round": r, "candidate": name, **run_candidate(name, args.sessions, args.connects)}))


if __name__ == "__main__":
    main()
