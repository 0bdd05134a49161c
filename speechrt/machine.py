"""Facts of this machine that several layers read: where speechrt keeps what it builds on first use, and the
CPU's feature flags. Imports nothing of speechrt."""

from __future__ import annotations

import os
from pathlib import Path


def cache_home() -> Path:
    """$SPEECHRT_CACHE, else $XDG_CACHE_HOME/speechrt, else ~/.cache/speechrt."""
    base = (
        os.environ.get("SPEECHRT_CACHE") or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "speechrt"
    )
    return Path(base)


# flags above AVX2 that SPEECHRT_CPU_ISA=avx2 hides: every AVX-512 and AMX extension, and AVX-VNNI
BEYOND_AVX2 = ("avx512", "amx", "avx_vnni")


def cpu_flags() -> set[str] | None:
    """The CPU's flags as Linux lists them in /proc/cpuinfo (avx2, avx512f, amx_tile, ...); an empty set where
    it lists none (e.g. an ARM CPU's 'Features'), None where it cannot be read. With SPEECHRT_CPU_ISA=avx2, the
    flags beyond AVX2 are left out, so that speechrt chooses its backends and builds its CPU kernel as on an
    AVX2-only machine (as ONEDNN_MAX_CPU_ISA and CT2_FORCE_CPU_ISA do for oneDNN and CTranslate2;
    benchmarks.avx2_proxy does it for ONNX Runtime)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    break
            else:
                return set()
    except OSError:
        return None
    isa = os.environ.get("SPEECHRT_CPU_ISA", "").lower()
    if isa not in ("", "native", "avx2"):
        raise ValueError(
            f"SPEECHRT_CPU_ISA={isa!r}: valid values are 'avx2' (hide AVX-512, AMX and AVX-VNNI) "
            "and 'native' (the default)"
        )
    return {f for f in flags if not f.startswith(BEYOND_AVX2)} if isa == "avx2" else flags
