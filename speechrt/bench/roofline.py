"""The roofline a kernel is judged against: peak memory bandwidth and peak matrix throughput of a device,
from a table of known devices (vendor datasheets, dense, no sparsity) or measured here with a copy and a
GEMM probe. The report draws both when it has both: the datasheet roof is the ceiling, the measured one
what this machine's software reaches.

Peaks are for 16-bit matrix math on GPUs (fp16/bf16 tensor cores or matrix cores) and for float32 FMA
on CPUs (cores x clock x FLOP per cycle, from the ISA: the CPU table holds FLOP per cycle per core)."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Peak:
    name: str
    bandwidth_gbps: float  # GB/s, 1e9 bytes
    matmul_tflops: float  # dense fp16/bf16 (GPUs) or float32 FMA (CPUs)
    source: str  # "datasheet", "measured", "estimate (cores x clock x FLOP/cycle)"


# GPU datasheet peaks: (substring of torch.cuda.get_device_name, HBM GB/s, dense fp16 TFLOP/s). More
# specific names first: "H100 PCIe" before "H100".
GPUS: tuple[tuple[str, float, float], ...] = (
    ("H200", 4800, 989),
    ("H100 PCIe", 2000, 756),
    ("H100 NVL", 3900, 835),
    ("H100", 3350, 989),
    ("A100-SXM4-80GB", 2039, 312),
    ("A100 80GB PCIe", 1935, 312),
    ("A100", 1555, 312),
    ("L40S", 864, 362),
    ("L4", 300, 121),
    ("A10G", 600, 70),
    ("A10", 600, 125),
    ("T4", 320, 65),
    ("MI300X", 5300, 1307),
    ("MI250X", 3277, 383),
    ("MI250", 3277, 362),
    ("MI210", 1638, 181),
)
# CPU float32 FLOP per cycle per core by the widest FMA unit (2 FMA pipes x lanes x 2)
CPU_FLOP_PER_CYCLE = {"amx_tile": 64, "avx512f": 64, "avx2": 32, "neon": 16}


def datasheet(gpu_name: str) -> Peak | None:
    for key, bw, tf in GPUS:
        if key.lower() in gpu_name.lower():
            return Peak(key, bw, tf, "datasheet")
    return None


def cpu_estimate(cpu: dict) -> Peak | None:
    """Matrix peak of a CPU from its fingerprint (cores x clock x FLOP/cycle of its widest FMA unit); its
    bandwidth is left to the probe (0: unknown). None without a clock."""
    if not cpu.get("mhz"):
        return None
    isa = cpu.get("isa", {})
    per_cycle = next((v for k, v in CPU_FLOP_PER_CYCLE.items() if isa.get(k)), 8)
    cores = cpu.get("physical_cores") or cpu.get("logical_cores") or 1
    return Peak(
        cpu.get("model") or "CPU",
        0.0,
        cores * cpu["mhz"] * 1e6 * per_cycle / 1e12,
        f"estimate: {cores} cores x {cpu['mhz']} MHz x {per_cycle} FLOP/cycle",
    )


def timer(device, rep_ms: int = 100, warmup_ms: int = 25):
    """fn -> its run times in seconds on `device`: CUDA-event timings through triton.testing.do_bench
    on GPUs (runs for about `rep_ms` after `warmup_ms` of warm-up), wall clock on the CPU (3 to 50 runs after a warm-up,
    about 0.2 s in all)."""
    if device.type == "cuda":
        from triton.testing import do_bench

        return lambda fn: [t * 1e-3 for t in do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="all")]

    def cpu_times(fn):
        fn()
        times, t_end = [], time.perf_counter() + 0.2
        while len(times) < 3 or (time.perf_counter() < t_end and len(times) < 50):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        return times

    return cpu_times


def probe(device, dtype) -> Peak:
    """Measured roofline: device-to-device copy bandwidth (read + write) and square matmul throughput.
    Sizes: 1 GiB buffers and 8192^2 GEMMs on GPUs; 256 MiB and 1024^2 on CPUs (big enough to leave the
    caches, small enough for a few seconds)."""
    import torch

    gpu = device.type == "cuda"
    n = (1 << 28) if gpu else (1 << 26)
    src = torch.empty(n, dtype=torch.float32, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    times = timer(device)
    bw = 2 * n * 4 / statistics.median(times(lambda d=dst, s=src: d.copy_(s))) / 1e9
    del src, dst
    m = 8192 if gpu else 1024
    a = torch.randn(m, m, device=device, dtype=torch.float32).to(dtype)
    tflops = 2 * m**3 / statistics.median(times(lambda: a @ a)) / 1e12
    name = torch.cuda.get_device_name(device) if gpu else "CPU"
    return Peak(name, bw, tflops, "measured")
