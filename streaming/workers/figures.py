"""The /metrics page of several worker processes: each worker's figures as a snapshot (JSON), and the page of all
of them: the one-server page with every figure summed over the workers, then each worker's main figures."""

from __future__ import annotations

import collections
import dataclasses
import os
import statistics
import time
from types import SimpleNamespace

from ..engine import Metrics
from ..http.metrics import Counters, MetricsPage, metrics_text, process_resources

AVERAGED = ("live_stretch", "busy_fraction", "firm_fraction", "family_busy")  # shares: the workers' mean, not their sum
PER_WORKER = (
    ("sessions", "sessions_active", "gauge", "Open Realtime sessions per worker process."),
    ("sessions_total", "sessions_total", "counter", "Sessions admitted per worker since it started."),
    ("sessions_rejected", "sessions_rejected_total", "counter", "Sessions refused per worker."),
    ("queue_depth", "queue_depth", "gauge", "Work items waiting for each worker's engine."),
    ("utterances", "asr_utterances_total", "counter", "Utterances transcribed per worker."),
    ("engine_seconds", "engine_busy_seconds_total", "counter", "Seconds each worker's engine spent in model steps."),
    ("cpu_seconds", "process_cpu_seconds_total", "counter", "CPU time of each worker process."),
    ("rss_bytes", "process_resident_memory_bytes", "gauge", "Resident memory of each worker process."),
)


def snapshot(server, index: int) -> dict:
    """A worker's figures (its SpeechServer's counters, engine metrics, VAD and process), JSON-ready."""
    c, m = server.counters, server.engine.figures()
    return {
        "worker": index,
        "pid": os.getpid(),
        "sessions": len(server.sessions),
        "queue_depth": server.engine.queue_depth(),
        "draining": server.shutting_down,
        "counters": {f.name: getattr(c, f.name) for f in dataclasses.fields(c)},
        "metrics": {f.name: _plain(getattr(m, f.name)) for f in dataclasses.fields(m)},
        "vad": {"frames": server.vad.frames, "seconds": server.vad.seconds, "ticks": server.vad.ticks},
        "loop": {"cpu": server.loop_clock.cpu_seconds(), "served": server.loop_clock.session_seconds()},
        "process": {**process_resources(), "cpu_seconds": time.process_time()},
    }


def _plain(v):
    return list(v) if isinstance(v, collections.deque) else v


def _merged(cls, rows: list[dict]):
    """One `cls` (Counters or Metrics) with the rows' fields summed (counters per label summed, samples pooled,
    shares averaged, start times the earliest)."""
    out = {}
    for f in dataclasses.fields(cls):
        values = [r[f.name] for r in rows]
        if f.name == "started":
            out[f.name] = min(values)
        elif f.name in AVERAGED and isinstance(values[0], dict):  # per-label shares
            out[f.name] = {k: statistics.fmean(v.get(k, 0.0) for v in values) for k in values[0]}
        elif f.name in AVERAGED:
            out[f.name] = statistics.fmean(values)
        elif isinstance(values[0], dict):
            out[f.name] = sum((collections.Counter(v) for v in values), collections.Counter())
        elif isinstance(values[0], list):
            out[f.name] = collections.deque(x for v in values for x in v)
        else:
            out[f.name] = sum(values)
    return cls(**out)


def page(rows: list[dict], restarts: int = 0) -> str:
    """The /metrics text of the workers whose snapshots are `rows` (at least one)."""
    processes = [r["process"] for r in rows]
    text = metrics_text(
        sum(r["sessions"] for r in rows),
        sum(r["queue_depth"] for r in rows),
        _merged(Counters, [r["counters"] for r in rows]),
        _merged(Metrics, [r["metrics"] for r in rows]),
        SimpleNamespace(**{k: sum(r["vad"][k] for r in rows) for k in ("frames", "seconds", "ticks")}),
        process={k: sum(p[k] for p in processes) for k in processes[0]},
        loop=_LoopSums(rows),
    )
    more = MetricsPage()
    more.metric("workers", "gauge", "Worker processes serving (each with its own models and engine).", len(rows))
    more.metric("worker_restarts_total", "counter", "Worker processes replaced after they died.", restarts)
    for key, name, kind, help_ in PER_WORKER:
        more.lines += [f"# HELP speechrt_worker_{name} {help_}", f"# TYPE speechrt_worker_{name} {kind}"]
        more.lines += [
            f'speechrt_worker_{name}{{worker="{r["worker"]}",pid="{r["pid"]}"}} {_figure(r, key)}'
            for r in sorted(rows, key=lambda r: r["worker"])
        ]
    return text + more.text()


class _LoopSums:
    """The workers' event loops as one LoopClock for the page: CPU and session-seconds summed."""

    def __init__(self, rows: list[dict]):
        self.rows = rows

    def cpu_seconds(self) -> float:
        return sum(r["loop"]["cpu"] for r in self.rows)

    def session_seconds(self) -> float:
        return sum(r["loop"]["served"] for r in self.rows)


def _figure(row: dict, key: str):
    if key in ("sessions", "queue_depth"):
        return row[key]
    if key in ("cpu_seconds", "rss_bytes"):
        return round(row["process"][key], 3)
    if key == "utterances":
        return sum(row["metrics"]["kind_items"].values())
    if key == "engine_seconds":
        return round(row["metrics"]["engine_seconds"], 3)
    return row["counters"][key]
