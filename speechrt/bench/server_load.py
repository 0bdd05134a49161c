"""A streaming server's load over one `bench server` level: from its /metrics, the final transcripts encoded with
the loaded margin, its process's CPU cores (its workers' summed), its engine's share of the time in model steps (each
worker's, where /metrics lists them per worker or per Ray replica) and the cores its voice activity detection thread
took; on a CUDA device where nvidia-ml-py is installed, the GPU's utilization sampled every half second (NVML; none
elsewhere). What bounds a level shows in its row: on an H200 the GPU stayed under ~11 % busy where 64 streams missed
their latency targets (docs/gpu.md)."""

from __future__ import annotations

import re
import statistics
import threading
import time
import urllib.request

# per level, from the server's /metrics: row key -> counter (loaded_margin a count; the others per second)
COUNTERS = {
    "loaded_margin": "asr_finals_loaded_margin_total",
    "server_cpu_cores": "process_cpu_seconds_total",
    "engine_busy": "engine_busy_seconds_total",
    "vad_cores": "vad_seconds_total",
}
LOAD = (
    ("server_cpu_cores", "server", "{:.2f} cores"),
    ("engine_busy", "engine busy", "{:.0%}"),
    ("vad_cores", "VAD", "{:.2f} cores"),
    ("gpu_busy", "GPU", "{:.0%}"),
    ("host_cpu_cores", "host", "{:.2f} cores"),
    ("client_cpu_cores", "clients", "{:.2f} cores"),
    ("client_cpu_share", "busiest client", "{:.0%}"),
)  # printed after a level's row ("none" where a key's value is None: no GPU sampled)
# one engine's worker threads per model family (asr, lm, tts): their busy seconds
PER_FAMILY = re.compile(r'^speechrt_engine_family_busy_seconds_total\{family="([^"]*)"\} (\S+)', re.M)
PER_WORKER = re.compile(
    r'^speechrt_(?:\w+_)?engine_busy_seconds_total\{[^}]*\b(?:worker|replica)="([^"]*)"[^}]*\} (\S+)', re.M
)


def counters(base: str, names=None) -> dict[str, float]:
    """The server's counters `names` (those it has; default COUNTERS'); none if unread. Behind Ray Serve (`serve
    --ray`), whose /metrics is whichever replica answers, the sums of /metrics/cluster over the replicas, and
    `replicas`."""
    names = tuple(COUNTERS.values()) if names is None else names
    for path, prefix in (("/metrics/cluster", "speechrt_cluster_"), ("/metrics", "speechrt_")):
        try:
            with urllib.request.urlopen(base + path, timeout=10) as r:
                text = r.read().decode()
        except OSError:  # (a plain server has no /metrics/cluster: 404)
            continue
        got = parse_counters(text, prefix, names)
        if path == "/metrics" or "replicas" in got:
            return got
    return {}


def parse_counters(text: str, prefix: str, names) -> dict:
    """The counters `names` (and `replicas`) of a Prometheus page whose names start with `prefix`, and "workers":
    {worker or replica: its engine's busy seconds} where the page lists any engine_busy_seconds_total series per
    worker or per replica (whatever the metric's middle name: speechrt_engine_busy_seconds_total{worker="0"},
    speechrt_replica_engine_busy_seconds_total{replica="..."})."""
    got = {
        name: float(m.group(1))
        for name in (*names, "replicas")
        if (m := re.search(rf"^{prefix}{name} ([0-9.]+)", text, re.M))
    }
    workers = {w: float(v) for w, v in PER_WORKER.findall(text)}
    if workers:
        got["workers"] = workers
    if families := {f: float(v) for f, v in PER_FAMILY.findall(text)}:
        got["families"] = families
    return got


def engine_shares(before: dict, after: dict, wall: float) -> dict[str, float]:
    """Each worker's (or Ray replica's) engine busy share over `wall` seconds, from the per-worker counters that
    /metrics lists (counters()' "workers"); none where it lists one engine."""
    b, a = before.get("workers", {}), after.get("workers", {})
    return {w: (a[w] - b[w]) / wall for w in sorted(a) if w in b}


class LevelLoad:
    """`with LevelLoad(base_url, device) as load: <the level>` -> load.row: loaded_margin (finals), server_cpu_cores,
    engine_busy (fraction of the level's time), vad_cores, host_cpu_cores (the whole machine's), those that could
    be read, and gpu_busy (fraction; None where no GPU was sampled); with several workers (or Ray replicas) the cores
    summed, engine_busy their engines' mean and engine_busy_workers each one's share; with one engine whose page lists
    its model families (a worker thread each), engine_busy the busiest family's share and engine_busy_families
    each one's."""

    def __init__(self, base: str, device: str):
        self.base, self.gpu, self.row = base, GpuBusy(device), {}

    def __enter__(self):
        self.before, self.t0, self.host = counters(self.base), time.monotonic(), host_busy_seconds()
        self.gpu.__enter__()
        return self

    def __exit__(self, *exc):
        self.gpu.__exit__(*exc)
        after, wall = counters(self.base), time.monotonic() - self.t0
        delta = {
            key: after[name] - self.before[name]
            for key, name in COUNTERS.items()
            if name in self.before and name in after
        }
        self.row = {key: int(d) if key == "loaded_margin" else d / wall for key, d in delta.items()}
        workers = engine_shares(self.before, after, wall)
        if workers:  # the engines' mean, not their sum, and each one's
            self.row["engine_busy_workers"] = workers
            self.row["engine_busy"] = statistics.mean(workers.values())
        elif "engine_busy" in self.row and after.get("replicas", 1) > 1:
            self.row["engine_busy"] /= after["replicas"]
        families = {
            f: (a - self.before.get("families", {}).get(f, 0.0)) / wall for f, a in after.get("families", {}).items()
        }
        if families and not workers and after.get("replicas", 1) == 1:  # one engine, a worker thread per family:
            self.row["engine_busy_families"] = families  # each one's share, and the busiest (what bounds it)
            self.row["engine_busy"] = max(families.values())
        self.row["gpu_busy"] = statistics.mean(self.gpu.samples) / 100 if self.gpu.samples else None
        host = host_busy_seconds()
        if host is not None and self.host is not None:  # every process on the machine: is the host itself full?
            self.row["host_cpu_cores"] = (host - self.host) / wall


def host_busy_seconds() -> float | None:
    """CPU seconds the whole machine has been busy (all cores, every process: /proc/stat's cpu line less its idle
    and iowait), or None where there is no /proc/stat (not Linux)."""
    import os

    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")  # (guest time is within user)


def nvml_index(device: str) -> int:
    """NVML's index of a torch CUDA device ("cuda", "cuda:N"): NVML counts every GPU, torch those that
    CUDA_VISIBLE_DEVICES lists (by index; where it names GPUs by UUID, torch's own index is taken)."""
    import os

    n = int(device.partition(":")[2] or 0)
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    return int(visible[n]) if n < len(visible) and visible[n].isdigit() else n


class GpuBusy:
    """The GPU's utilization (NVML, %) sampled every half second while the block runs, on a CUDA device where
    nvidia-ml-py is installed; no samples elsewhere."""

    def __init__(self, device: str):
        self.device, self.samples, self.done = device, [], threading.Event()

    def __enter__(self):
        if not self.device.startswith("cuda"):
            return self
        try:
            import pynvml

            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(nvml_index(self.device))
        except Exception:  # noqa: BLE001 - no NVML (nvidia-ml-py, or an NVIDIA driver): nothing sampled
            return self

        def sample():
            while not self.done.wait(0.5):
                self.samples.append(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)

        self.thread = threading.Thread(target=sample, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.done.set()
        if hasattr(self, "thread"):
            self.thread.join()
