"""The /metrics page (Prometheus text format): the server's counters (Counters), the engine's (engine.Metrics),
and the process's resources; and /metrics/cluster, the Ray Serve replicas' figures (streaming/scale.py)."""

from __future__ import annotations

import asyncio
import collections
import os
import threading
import time
from dataclasses import dataclass, field

from ..engine import LOAD_WINDOW_S, LOADED_BUSY, LOADED_FIRM, Metrics


@dataclass
class Counters:
    """The server's counters."""

    sessions_total: int = 0
    sessions_rejected: int = 0
    auth_failures: int = 0
    errors_sent: int = 0
    slow_readers_closed: int = 0  # sessions closed because their client stopped reading
    stalls: int = 0  # transcripts or answers given up because the engine stalled in one step
    rest_requests: collections.Counter = field(default_factory=collections.Counter)  # per endpoint path
    rest_rejected: int = 0  # REST requests refused because max_rest_requests were running (429)
    rest_errors: int = 0  # REST requests answered with a 4xx/5xx status
    started: float = field(default_factory=time.time)


class LoopClock:
    """What each stream costs the host's event loop: the CPU time of the loop's thread (`bind`, called on it) and
    the session-seconds it served (each session `opened` and `closed`; open ones count to now)."""

    def __init__(self):
        self._clock: int | None = None
        self._clock0 = 0.0
        self._closed_seconds = 0.0
        self._open: dict[int, float] = {}  # id(session) -> when it opened (monotonic)

    def bind(self):
        """The calling thread is the event loop's, serving from now on (what it spent before, loading the models,
        is not counted; where there is no per-thread CPU clock, cpu_seconds is nan)."""
        get = getattr(time, "pthread_getcpuclockid", None)
        self._clock = get(threading.get_ident()) if get else None
        self._clock0 = self.cpu_seconds() if self._clock is not None else 0.0

    def cpu_seconds(self) -> float:
        """The loop thread's CPU seconds since `bind`."""
        if self._clock is None:
            return float("nan")
        try:
            return time.clock_gettime(self._clock) - self._clock0
        except OSError:  # (the thread has ended)
            return float("nan")

    def opened(self, session):
        self._open[id(session)] = time.monotonic()

    def closed(self, session):
        began = self._open.pop(id(session), None)
        if began is not None:
            self._closed_seconds += time.monotonic() - began

    def session_seconds(self) -> float:
        now = time.monotonic()
        return self._closed_seconds + sum(now - t for t in self._open.values())


def _loop_lines(page: MetricsPage, loop: LoopClock, vad):
    cpu, served = loop.cpu_seconds(), loop.session_seconds()
    page.metric(
        "event_loop_cpu_seconds_total",
        "counter",
        "CPU seconds of the event loop's thread (protocol, base64, resampling, turn taking of every session).",
        f"{cpu:.3f}",
    )
    page.metric(
        "session_seconds_total", "counter", "Seconds that sessions were open, summed over sessions.", f"{served:.3f}"
    )
    per = cpu / served if served > 0 else 0.0
    page.metric(
        "event_loop_cpu_per_session",
        "gauge",
        "Cores of the event loop's thread one open session took on average since start (event_loop_cpu_seconds_total "
        "/ session_seconds_total; the ratio of their rates for a recent window).",
        f"{per:.6f}",
    )
    page.metric(
        "host_cpu_per_session",
        "gauge",
        "Cores of the event loop and the voice activity thread together one open session took on average since start.",
        f"{(cpu + vad.seconds) / served if served > 0 else 0.0:.6f}",
    )


def process_resources() -> dict:
    """This process's resident memory (bytes), open file descriptors, threads and asyncio tasks (of the
    running loop). Memory and descriptors are read from /proc where there is one (Linux), else -1."""
    rss = fds = -1
    try:
        with open("/proc/self/statm") as f:
            rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        fds = len(os.listdir("/proc/self/fd"))
    except OSError:
        pass
    try:
        tasks = len(asyncio.all_tasks())
    except RuntimeError:  # no running loop
        tasks = -1
    return {"rss_bytes": rss, "open_fds": fds, "threads": threading.active_count(), "asyncio_tasks": tasks}


class MetricsPage:
    """Builds the /metrics text."""

    def __init__(self):
        self.lines: list[str] = []

    def metric(self, name: str, kind: str, help_: str, value) -> None:
        self.lines += [f"# HELP speechrt_{name} {help_}", f"# TYPE speechrt_{name} {kind}", f"speechrt_{name} {value}"]

    def summary(self, name: str, help_: str, samples) -> None:
        s = sorted(samples)
        self.lines += [f"# HELP speechrt_{name} {help_}", f"# TYPE speechrt_{name} summary"]
        for q in (0.5, 0.95, 0.99):
            v = s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")
            self.lines.append(f'speechrt_{name}{{quantile="{q}"}} {v:.6f}')
        self.lines += [f"speechrt_{name}_count {len(s)}", f"speechrt_{name}_sum {sum(s):.6f}"]

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def _family_lines(page: MetricsPage, m: Metrics) -> None:
    """The engine's figures per model family (asr, lm, tts: one worker thread each)."""
    for name, kind, help_, values, fmt in (
        ("engine_family_busy_seconds_total", "counter", "Seconds each family's worker spent in model steps.",
         m.family_seconds, "{:.3f}"),
        ("engine_family_busy_fraction", "gauge", f"Share of the last {LOAD_WINDOW_S:g} s each family's worker "
         "spent in model steps.", m.family_busy, "{:.3f}"),
        ("engine_family_queue_depth", "gauge", "Work items waiting for each family's worker.", m.family_depth, "{}"),
    ):  # fmt: skip
        page.lines += [f"# HELP speechrt_{name} {help_}", f"# TYPE speechrt_{name} {kind}"]
        page.lines += [f'speechrt_{name}{{family="{f}"}} {fmt.format(v)}' for f, v in sorted(values.items())]


def metrics_text(
    sessions: int,
    queue_depth: int,
    c: Counters,
    m: Metrics,
    vad,
    replica: str | None = None,
    process=None,
    loop=None,
) -> str:
    """The server's /metrics page; `vad`: its VadWorker (the frames and ticks it ran and its thread's CPU seconds);
    `process`: the resources to report (process_resources() with cpu_seconds; default: this process's); `loop`:
    its LoopClock (the event loop's CPU per session)."""
    page = MetricsPage()
    if replica is not None:
        page.lines += [
            "# HELP speechrt_replica_info The Ray Serve replica serving this page.",
            "# TYPE speechrt_replica_info gauge",
            f'speechrt_replica_info{{replica="{replica}"}} 1',
        ]
    page.metric("sessions_active", "gauge", "Open Realtime sessions.", sessions)
    page.metric("sessions_total", "counter", "Sessions admitted since start.", c.sessions_total)
    page.metric(
        "sessions_rejected_total", "counter", "Sessions refused (server full or shutting down).", c.sessions_rejected
    )
    page.metric("auth_failures_total", "counter", "Handshakes refused for a bad API key.", c.auth_failures)
    page.metric(
        "slow_readers_closed_total",
        "counter",
        "Sessions closed because their client stopped reading what the server sent.",
        c.slow_readers_closed,
    )
    page.metric(
        "engine_stalls_total",
        "counter",
        "Transcripts or answers given up because the engine spent longer than the stall timeout in one step.",
        c.stalls,
    )
    page.lines += [
        "# HELP speechrt_rest_requests_total OpenAI REST requests received, per endpoint.",
        "# TYPE speechrt_rest_requests_total counter",
    ]
    page.lines += [f'speechrt_rest_requests_total{{endpoint="{e}"}} {n}' for e, n in sorted(c.rest_requests.items())]
    page.metric(
        "vad_frames_total", "counter", "32 ms frames of input audio run through voice activity detection.", vad.frames
    )
    page.metric(
        "vad_seconds_total",
        "counter",
        "CPU seconds the voice activity detection thread spent running Silero.",
        f"{vad.seconds:.3f}",
    )
    page.metric(
        "vad_ticks_total",
        "counter",
        "Batched Silero calls (each runs the frames of every stream that sent audio since the last).",
        getattr(vad, "ticks", 0),
    )
    if loop is not None:
        _loop_lines(page, loop, vad)
    page.metric(
        "rest_rejected_total",
        "counter",
        "REST requests refused: --max-rest-requests were running (429).",
        c.rest_rejected,
    )
    page.metric(
        "rest_errors_total", "counter", "REST requests answered with an error status (4xx, 5xx).", c.rest_errors
    )
    page.metric("queue_depth", "gauge", "Work items waiting for the engine.", queue_depth)
    page.metric(
        "engine_step_failures_total",
        "counter",
        "Model steps that raised (their requests got an error).",
        m.step_failures,
    )
    page.metric("asr_batches_total", "counter", "Transcription batches run.", m.asr_batches)
    page.metric("asr_utterances_total", "counter", "Utterances transcribed.", m.asr_items)
    page.metric(
        "asr_partials_cancelled_total",
        "counter",
        "Live transcripts stopped because their turn's final transcript was asked for.",
        m.asr_cancelled,
    )
    page.metric(
        "asr_early_finals_total",
        "counter",
        "Final transcripts begun when the input went quiet, before Silero confirmed the pause.",
        m.early_finals,
    )
    page.metric(
        "asr_finals_superseded_total",
        "counter",
        "Queued transcripts of a turn up to a pause, replaced by one up to a later pause of the same turn.",
        m.finals_superseded,
    )
    page.metric(
        "replies_speculated_total",
        "counter",
        "Replies begun during a pause of a turn, before turn detection ended it (nothing sent yet).",
        m.replies_speculated,
    )
    page.metric(
        "replies_speculation_used_total",
        "counter",
        "Replies begun during a pause that the turn's response took over (the pause ended the turn, "
        "with the transcript they answered).",
        m.replies_speculation_used,
    )
    page.metric(
        "lm_prompts_primed_total",
        "counter",
        "Reply prompts the language model read up to a turn's live words while it was spoken.",
        m.prompts_primed,
    )
    page.metric(
        "lm_prompt_tokens_reused_total",
        "counter",
        "Replies' prompt positions found in the language model's cache (the conversation so far, a primed "
        "prompt), not read again.",
        m.prompt_tokens_reused,
    )
    page.metric(
        "lm_prompt_tokens_total",
        "counter",
        "Replies' prompt tokens, those found in the cache (lm_prompt_tokens_reused_total) and those read.",
        m.prompt_tokens,
    )
    page.metric(
        "asr_turn_commits_total",
        "counter",
        "Stable parts of long turns committed while they were spoken (local agreement).",
        m.turn_commits,
    )
    page.metric(
        "asr_long_final_rest_seconds",
        "gauge",
        "Audio not committed that the last final of a long turn (one that committed) transcribed.",
        f"{m.long_final_rest_s:.2f}",
    )
    page.metric(
        "asr_long_steps_total", "counter", "Windows of long turns' transcripts, one engine step each.", m.long_steps
    )
    page.metric(
        "live_interval_stretch",
        "gauge",
        "Live transcripts' interval over --partial-interval: it stretches "
        "(up to 4x) while transcription work queues, so finals are not starved.",
        f"{m.live_stretch:.2f}",
    )
    page.metric(
        "engine_busy_fraction",
        "gauge",
        f"Share of the last {LOAD_WINDOW_S:g} s the engine spent in model "
        "steps, as last seen by a transcription batch.",
        f"{m.busy_fraction:.3f}",
    )
    page.metric(
        "engine_firm_fraction",
        "gauge",
        f"Share of the last {LOAD_WINDOW_S:g} s the engine spent on work "
        "other than live transcripts (finals, long turns' windows, language model and voice steps), as last "
        "seen by a transcription batch.",
        f"{m.firm_fraction:.3f}",
    )
    page.metric(
        "asr_finals_yielded_total",
        "counter",
        "Long finals (over 8 s: a long turn's rest) that stopped for shorter finals queued meanwhile and went on "
        "after them from the tokens they had.",
        m.finals_yielded,
    )
    page.metric(
        "asr_finals_loaded_margin_total",
        "counter",
        "Final transcripts (and early ones that may become "
        "final) encoded over the turn plus the loaded margin (--loaded-final-margin), the engine being busy "
        f"({LOADED_BUSY:g} of the last {LOAD_WINDOW_S:g} s, {LOADED_FIRM:g} on other work than live "
        "transcripts), not the full one.",
        m.finals_loaded_margin,
    )
    page.lines += [
        "# HELP speechrt_asr_engine_seconds_total Engine seconds spent on transcription, per kind "
        "(final, partial: live and early transcripts, long: windows of turns over 30 s).",
        "# TYPE speechrt_asr_engine_seconds_total counter",
    ]
    page.lines += [
        f'speechrt_asr_engine_seconds_total{{kind="{k}"}} {v:.3f}' for k, v in sorted(m.kind_seconds.items())
    ]
    page.lines += [
        "# HELP speechrt_asr_transcripts_total Transcripts made (or stopped), per kind.",
        "# TYPE speechrt_asr_transcripts_total counter",
    ]
    page.lines += [f'speechrt_asr_transcripts_total{{kind="{k}"}} {v}' for k, v in sorted(m.kind_items.items())]
    rtf = m.asr_seconds / m.asr_audio_seconds if m.asr_audio_seconds else 0.0
    page.metric("asr_real_time_factor", "gauge", "Transcription compute seconds per second of audio.", f"{rtf:.4f}")
    page.metric(
        "engine_stream_steps_total", "counter", "Steps of streaming tasks (tokens, audio chunks).", m.stream_steps
    )
    page.summary("final_transcript_latency_seconds", "Queue + compute time of final transcripts.", m.final_latency)
    page.summary(
        "partial_transcript_latency_seconds", "Queue + compute time of partial transcripts.", m.partial_latency
    )
    page.summary("first_audio_latency_seconds", "Response start to first audio chunk.", m.first_audio_latency)
    page.metric(
        "engine_busy_seconds_total",
        "counter",
        "Seconds the engine's workers spent in model steps of any kind (transcripts, language model, voice), "
        "all families summed.",
        f"{m.engine_seconds:.3f}",
    )
    _family_lines(page, m)
    r = process or {**process_resources(), "cpu_seconds": time.process_time()}
    page.metric(
        "process_cpu_seconds_total",
        "counter",
        "CPU time of the server process, all threads (user + system).",
        f"{r['cpu_seconds']:.3f}",
    )
    page.metric("process_resident_memory_bytes", "gauge", "Resident memory of the server process.", r["rss_bytes"])
    page.metric("process_open_fds", "gauge", "Open file descriptors of the server process.", r["open_fds"])
    page.metric("process_threads", "gauge", "Threads of the server process.", r["threads"])
    page.metric("asyncio_tasks", "gauge", "Tasks on the server's event loop.", r["asyncio_tasks"])
    return page.text()


def cluster_metrics_text(rows: dict[str, dict]) -> str:
    """Prometheus text: each replica's figures labelled with it, then the cluster's sums."""
    page = MetricsPage()
    per = [
        ("sessions", "sessions_active", "gauge", "Open Realtime sessions per replica."),
        ("max_sessions", "max_sessions", "gauge", "Session cap per replica."),
        ("queue_depth", "queue_depth", "gauge", "Work items waiting for each replica's engine."),
        ("sessions_total", "sessions_total", "counter", "Sessions admitted per replica since it started."),
        ("sessions_rejected", "sessions_rejected_total", "counter", "Sessions refused per replica."),
        ("utterances", "asr_utterances_total", "counter", "Utterances transcribed per replica."),
        (
            "final_p50",
            "final_transcript_latency_p50_seconds",
            "gauge",
            "Median queue + compute time of final transcripts per replica (last 1000).",
        ),
        ("final_p95", "final_transcript_latency_p95_seconds", "gauge", "95th percentile of the same."),
        ("cpu_seconds", "process_cpu_seconds_total", "counter", "CPU time of each replica's process."),
        (
            "engine_seconds",
            "engine_busy_seconds_total",
            "counter",
            "Seconds each replica's engine spent in model steps.",
        ),
        (
            "finals_loaded_margin",
            "asr_finals_loaded_margin_total",
            "counter",
            "Final transcripts each replica encoded with the loaded margin.",
        ),
        (
            "vad_seconds",
            "vad_seconds_total",
            "counter",
            "CPU seconds each replica's voice activity detection thread spent running Silero.",
        ),
    ]
    for key, name, kind, help_ in per:
        page.lines += [f"# HELP speechrt_replica_{name} {help_}", f"# TYPE speechrt_replica_{name} {kind}"]
        page.lines += [
            f'speechrt_replica_{name}{{replica="{r}",node="{row["node"]}"}} {row.get(key, 0)}'
            for r, row in sorted(rows.items())
        ]
    page.metric("cluster_replicas", "gauge", "Replicas reporting.", len(rows))
    page.metric("cluster_replicas_draining", "gauge", "Replicas stopping.", sum(r["draining"] for r in rows.values()))
    for key, name, help_ in (
        ("sessions", "sessions_active", "Open sessions, all replicas."),
        ("max_sessions", "max_sessions", "Session capacity, all replicas."),
        ("queue_depth", "queue_depth", "Work items waiting, all replicas."),
        ("sessions_total", "sessions_total", "Sessions admitted, all replicas."),
        ("sessions_rejected", "sessions_rejected_total", "Sessions refused, all replicas."),
        ("utterances", "asr_utterances_total", "Utterances transcribed, all replicas."),
        ("cpu_seconds", "process_cpu_seconds_total", "CPU time of the replicas' processes."),
        ("engine_seconds", "engine_busy_seconds_total", "Seconds the replicas' engines spent in model steps, summed."),
        (
            "finals_loaded_margin",
            "asr_finals_loaded_margin_total",
            "Final transcripts encoded with the loaded margin, all replicas.",
        ),
        (
            "vad_seconds",
            "vad_seconds_total",
            "CPU seconds the replicas' voice activity detection threads spent running Silero, summed.",
        ),
    ):
        page.metric(f"cluster_{name}", "gauge", help_, round(sum(r.get(key, 0) for r in rows.values()), 3))
    return page.text()
