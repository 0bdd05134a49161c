"""`bench server`'s client processes: a level's streams shared out over several processes, each running its share on
its own event loop, and their results and CPU time gathered into one level.

One event loop holds Python's lock for every stream it runs: past several hundred real-time streams (a stream costs
the client ~1 ms of CPU a second on a Xeon core, ten chunks of ~100 us, docs/benchmarking.md) one process would be
the bottleneck, not the server. The processes are started once (spawned: nothing of the parent's threads or models
comes along), are sent the recordings' chunk messages once, and run level after level: stream i goes to process
i mod k, so every process gets an even share of the staggered start times, and all start at one wall-clock
instant."""

from __future__ import annotations

import asyncio
import math
import multiprocessing
import time
from dataclasses import dataclass

from speechrt.bench.pacing import FINAL_WAIT_S
from speechrt.bench.server_streams import run_streams

STREAMS_PER_PROCESS = 128  # the default's share: ~0.13 of a core of client CPU (~100 us a chunk, 10 chunks a second)
START_MARGIN_S = 0.5  # a level starts this long after its shares are sent: every process is waiting by then


def default_processes(streams: int, cores: int) -> int:
    """--client-processes auto: one process per STREAMS_PER_PROCESS streams (rounded up), at most half the cores
    (the rest are the server's), at least one: 1 to 128 streams -> 1, 1,024 -> 8 on 16 cores, 4 on 8."""
    return max(1, min(math.ceil(streams / STREAMS_PER_PROCESS), cores // 2))


@dataclass(frozen=True)
class Share:
    """What one process runs in a level: its streams ((index, start delay s) each), from `start` (time.time())."""

    url: str
    streams: tuple[tuple[int, float], ...]
    utterances: int
    turn_detection: dict
    conversation: bool
    start: float
    wait: float = FINAL_WAIT_S


def run_share(recs, share: Share) -> tuple[list[dict], float, float]:
    """A share on a new event loop in this process -> (its results, its CPU seconds, its wall seconds), both counted
    from the level's start."""
    time.sleep(max(0.0, share.start - time.time()))
    c0, w0 = time.process_time(), time.monotonic()
    results = asyncio.run(
        run_streams(
            share.url, recs, share.streams, share.utterances, share.turn_detection, share.conversation, share.wait
        )
    )
    return results, time.process_time() - c0, time.monotonic() - w0


def _serve(conn, recs) -> None:
    """A client process: run each share it is sent until it is sent None; answer ("ok", results, cpu, wall) or
    ("error", what went wrong)."""
    while (share := conn.recv()) is not None:
        try:
            conn.send(("ok", *run_share(recs, share)))
        except Exception as e:  # noqa: BLE001 - reported to the parent, which raises it
            conn.send(("error", f"{type(e).__name__}: {e}"))
    conn.close()


def _answer(p, conn) -> tuple:
    try:
        answer = conn.recv()
    except EOFError:
        return ("error", f"client process {p.pid} died (exit code {p.exitcode})")
    return answer if answer[0] == "ok" else ("error", f"client process {p.pid}: {answer[1]}")


@dataclass
class LevelClients:
    """A level's client side: per process its CPU seconds and wall seconds."""

    cpu: list[float]
    wall: list[float]

    @property
    def row(self) -> dict:
        """client_processes; client_cpu_cores: the processes' CPU seconds over the level's wall time, summed;
        client_cpu_share: the busiest process's CPU share of its one core (near 1: the client was the bottleneck)."""
        wall = max(self.wall)
        return {
            "client_processes": len(self.cpu),
            "client_cpu_cores": sum(self.cpu) / wall if wall > 0 else 0.0,
            "client_cpu_share": max(c / w if w > 0 else 0.0 for c, w in zip(self.cpu, self.wall)),
        }


class ClientPool:
    """`processes` client processes (none for 1: this process runs the level), each with `recs` (Spoken)."""

    def __init__(self, recs, processes: int):
        self.recs, self.procs = recs, []
        if processes > 1:
            ctx = multiprocessing.get_context("spawn")
            for _ in range(processes):
                parent, child = ctx.Pipe()
                p = ctx.Process(target=_serve, args=(child, recs), daemon=True)
                p.start()
                child.close()
                self.procs.append((p, parent))

    @property
    def size(self) -> int:
        return max(1, len(self.procs))

    def level(self, url, streams, utterances, td, conversation, processes: int, wait=FINAL_WAIT_S):
        """The streams `streams` ((index, start delay s) each) over `processes` (<= size) processes ->
        (every stream's results, sorted by stream and utterance; LevelClients)."""
        k = max(1, min(processes, self.size, len(streams)))
        start = time.time() + (START_MARGIN_S if self.procs else 0.0)
        shares = [Share(url, tuple(streams[j::k]), utterances, td, conversation, start, wait) for j in range(k)]
        if not self.procs:
            outs = [run_share(self.recs, shares[0])]
        else:
            for (_, conn), share in zip(self.procs, shares):
                conn.send(share)
            answers = [_answer(p, conn) for p, conn in self.procs[:k]]  # every one read, so none is left over
            bad = [a[1] for a in answers if a[0] == "error"]
            if bad:
                raise RuntimeError("; ".join(bad))
            outs = [a[1:] for a in answers]
        results = sorted((r for res, _, _ in outs for r in res), key=lambda r: (r["stream"], r["utterance"]))
        return results, LevelClients([c for _, c, _ in outs], [w for _, _, w in outs])

    def close(self):
        for _, conn in self.procs:
            try:
                conn.send(None)
            except OSError:
                pass
        for p, conn in self.procs:
            p.join(10)
            if p.is_alive():
                p.kill()
                p.join()
            conn.close()
        self.procs = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
