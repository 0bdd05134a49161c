"""A streaming server's load over one `bench server` level: from its /metrics, the final transcripts encoded with
the loaded margin, its process's CPU cores, its engine's share of the time in model steps and the cores its voice
activity detection thread took; on a CUDA device
where nvidia-ml-py is installed, the GPU's utilization sampled every half second (NVML). What bounds a level
shows in its row: on an H200 the GPU stayed under ~11 % busy where 64 streams missed their latency targets
(docs/gpu.md)."""

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
)  # printed after a level's row


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
        got = {
            name: float(m.group(1))
            for name in (*names, "replicas")
            if (m := re.search(rf"^{prefix}{name} ([0-9.]+)", text, re.M))
        }
        if path == "/metrics" or "replicas" in got:
            return got
    return {}


class LevelLoad:
    """`with LevelLoad(base_url, device) as load: <the level>` -> load.row: loaded_margin (finals), server_cpu_cores,
    engine_busy (fraction of the level's time), vad_cores and gpu_busy (fraction), those that could be read; behind
    Ray, the replicas' cores summed and their engines' mean busy share."""

    def __init__(self, base: str, device: str):
        self.base, self.gpu, self.row = base, GpuBusy(device), {}

    def __enter__(self):
        self.before, self.t0 = counters(self.base), time.monotonic()
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
        if "engine_busy" in self.row and after.get("replicas", 1) > 1:  # the engines' mean, not their sum
            self.row["engine_busy"] /= after["replicas"]
        if self.gpu.samples:
            self.row["gpu_busy"] = statistics.mean(self.gpu.samples) / 100


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
