"""The machine a benchmark ran on, written into every result file: CPU (model, cores, ISA features,
memory), GPU (name, vendor, memory, compute capability or gfx arch, driver, CUDA/ROCm runtime) and the
versions of the software that did the work (torch, triton, onnxruntime and its providers, tensorrt,
the peers, speechrt and its git commit).

Every probe is best-effort: a field that cannot be read on this machine is null, never a guess."""

from __future__ import annotations

import datetime
import importlib.metadata
import os
import platform
import subprocess
from pathlib import Path

# ISA features that decide which kernels a CPU runs (Linux /proc/cpuinfo flag names)
ISA_FLAGS = {
    "avx2": "avx2",
    "fma": "fma",
    "f16c": "f16c",
    "avx512f": "avx512f",
    "avx512_vnni": "avx512_vnni",
    "avx512_bf16": "avx512_bf16",
    "avx512_fp16": "avx512_fp16",
    "avx_vnni": "avx_vnni",
    "amx_tile": "amx_tile",
    "amx_bf16": "amx_bf16",
    "amx_int8": "amx_int8",
    "neon": "asimd",
    "sve": "sve",
}
# distributions whose versions matter to a result (missing ones are left out)
PACKAGES = (
    "torch",
    "triton",
    "onnxruntime",
    "onnxruntime-gpu",
    "onnxruntime-genai",
    "tensorrt",
    "tensorrt-cu12",
    "numpy",
    "ctranslate2",
    "faster-whisper",
    "llama-cpp-python",
    "transformers",
    "piper-tts",
    "matplotlib",
)


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def usable_cores() -> int | None:
    """The logical cores this process may run on: fewer than the machine's under taskset or a cpuset."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count()


def cpu() -> dict:
    """{model, vendor, family, arch, logical_cores, physical_cores, isa: {feature: bool}, memory_gib, mhz,
    torch_capability}. `family` ("family 25 model 1") tells apart x86 CPUs a VM names alike ("AMD EPYC" is Zen 1
    at family 23 model 1, Zen 3 at 25 model 1, Zen 4 at 25 model 17): their speeds differ by up to 2x."""
    info = _read("/proc/cpuinfo")
    fields: dict[str, str] = {}
    for line in info.splitlines():
        k, _, v = line.partition(":")
        fields.setdefault(k.strip(), v.strip())  # the first processor's entry
    flags = set((fields.get("flags") or fields.get("Features") or "").split())
    cores = {(ln.split(":")[1].strip()) for ln in info.splitlines() if ln.startswith("core id")}
    sockets = {(ln.split(":")[1].strip()) for ln in info.splitlines() if ln.startswith("physical id")}
    mem_kib = next(
        (int(ln.split()[1]) for ln in _read("/proc/meminfo").splitlines() if ln.startswith("MemTotal:")), None
    )
    mhz = [float(ln.split(":")[1]) for ln in info.splitlines() if ln.startswith("cpu MHz")]
    try:
        import torch

        capability = torch.backends.cpu.get_cpu_capability()
    except (ImportError, AttributeError):
        capability = None
    return {
        "model": fields.get("model name") or platform.processor() or None,
        "vendor": fields.get("vendor_id"),
        "family": (
            f"family {fields['cpu family']} model {fields['model']}"
            if fields.get("cpu family") and fields.get("model")
            else None
        ),
        "arch": platform.machine(),
        "logical_cores": usable_cores(),  # those this process may run on (taskset, cgroups' cpusets)
        "machine_logical_cores": os.cpu_count(),
        "physical_cores": len(cores) * max(1, len(sockets)) if cores else None,
        "isa": {name: flag in flags for name, flag in ISA_FLAGS.items()} if flags else {},
        "memory_gib": round(mem_kib / 2**20, 1) if mem_kib else None,
        "mhz": round(max(mhz)) if mhz else None,  # as the kernel reports it now (turbo and power states vary)
        "torch_capability": capability,  # the ATen kernel level torch dispatches to (AVX2, AVX512, ...)
        # run through benchmarks.avx2_proxy: every library on its AVX2 code path on this (wider) CPU
        "avx2_proxy": os.environ.get("SPEECHRT_AVX2_PROXY") == "1",
    }


def _output(cmd: list[str]) -> str | None:
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout.strip() if r.returncode == 0 and r.stdout.strip() else None


def gpus() -> list[dict]:
    """One dict per GPU visible to PyTorch (CUDA or ROCm); [] when there is none."""
    try:
        import torch
    except ImportError:
        return []
    if not torch.cuda.is_available():
        return []
    rocm = torch.version.hip is not None
    if rocm:
        driver = _output(["rocm-smi", "--showdriverversion", "--csv"])
        driver = driver.splitlines()[-1].split(",")[-1] if driver else None
    else:
        driver = _output(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
        driver = driver.splitlines()[0] if driver else None
    out = []
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        out.append(
            {
                "index": i,
                "name": p.name,
                "vendor": "AMD" if rocm else "NVIDIA",
                "memory_gib": round(p.total_memory / 2**30, 1),
                "compute_capability": None if rocm else f"{p.major}.{p.minor}",
                "gfx_arch": getattr(p, "gcnArchName", None) if rocm else None,
                "multiprocessors": p.multi_processor_count,
                "driver": driver,
                "runtime": f"ROCm {torch.version.hip}" if rocm else f"CUDA {torch.version.cuda}",
            }
        )
    return out


def software() -> dict:
    """{python, os, packages: {dist: version}, onnxruntime_providers, speechrt, git_commit, git_dirty}."""
    pkgs = {}
    for dist in PACKAGES:
        try:
            pkgs[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            pass
    try:
        import onnxruntime

        providers = onnxruntime.get_available_providers()
    except ImportError:
        providers = []
    import speechrt

    root = Path(speechrt.__file__).resolve().parent.parent
    commit = _output(["git", "-C", str(root), "rev-parse", "HEAD"])
    dirty = _output(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"]) if commit else None
    return {
        "python": platform.python_version(),
        "os": f"{platform.system()} {platform.release()}",
        "packages": pkgs,
        "onnxruntime_providers": providers,
        "speechrt": speechrt.__version__,
        "git_commit": commit,
        "git_dirty": bool(dirty) if commit else None,
    }


def label(machine: dict) -> str:
    """A short name for the machine: its GPU, else its CPU with core count and widest vector ISA."""
    if machine.get("gpus"):
        g = machine["gpus"][0]
        n = len(machine["gpus"])
        return f"{g['name']}" + (f" x{n}" if n > 1 else "")
    c = machine["cpu"]
    isa = c.get("isa", {})
    widest = next((f for f in ("amx_tile", "avx512f", "avx2", "neon") if isa.get(f)), None)
    widest = {"amx_tile": "AMX", "avx512f": "AVX-512", "avx2": "AVX2", "neon": "NEON"}.get(widest, "")
    name = f"{c.get('model') or c.get('arch')}" + (f" {c['family']}" if c.get("family") else "")
    proxy = " as AVX2" if c.get("avx2_proxy") else ""
    return f"{name} {c.get('logical_cores')} cores" + (f" {widest}" if widest else "") + proxy


def fingerprint(name: str | None = None) -> dict:
    """The whole fingerprint; `name` overrides the derived machine label (--machine)."""
    m = {
        "cpu": cpu(),
        "gpus": gpus(),
        "software": software(),
        "taken": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    m["label"] = name or label(m)
    return m


def _arch(gpu: dict) -> str:
    return f"sm {gpu['compute_capability']}" if gpu.get("compute_capability") else str(gpu.get("gfx_arch"))


def describe(machine: dict) -> str:
    """One line for a table caption: label, CPU, memory, GPU, commit."""
    c, s = machine["cpu"], machine["software"]
    isa = ", ".join(
        k
        for k, v in c.get("isa", {}).items()
        if v and k in ("avx2", "avx512f", "avx512_bf16", "amx_tile", "neon", "sve")
    )
    gpu = (
        "; ".join(
            f"{g['name']} {g['memory_gib']} GiB ({_arch(g)}, {g['runtime']}, driver {g['driver']})"
            for g in machine.get("gpus", [])
        )
        or "no GPU"
    )
    commit = (s.get("git_commit") or "?")[:10] + ("+dirty" if s.get("git_dirty") else "")
    family = f" {c['family']}" if c.get("family") else ""
    total = c.get("machine_logical_cores")
    cores = f"{c.get('logical_cores')}" + (f" of {total}" if total and total != c.get("logical_cores") else "")
    proxy = "; run on its AVX2 code paths (benchmarks.avx2_proxy)" if c.get("avx2_proxy") else ""
    return (
        f"{c.get('model')}{family} ({cores} logical cores; {isa or 'ISA unknown'}{proxy}), "
        f"{c.get('memory_gib')} GiB; {gpu}; torch {s['packages'].get('torch', '-')}; speechrt {s['speechrt']} "
        f"@ {commit}"
    )
