"""Facts of this machine that several layers read: where speechrt keeps what it builds on first use, and the
CPU's feature flags. Imports nothing of speechrt."""
from __future__ import annotations

import os
from pathlib import Path


def cache_home() -> Path:
    """$SPEECHRT_CACHE, else $XDG_CACHE_HOME/speechrt, else ~/.cache/speechrt."""
    base = os.environ.get("SPEECHRT_CACHE") or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "speechrt"
    return Path(base)


def cpu_flags() -> set[str] | None:
    """The CPU's flags as Linux lists them in /proc/cpuinfo (avx2, avx512f, amx_tile, ...); an empty set where
    it lists none (e.g. an ARM CPU's 'Features'), None where it cannot be read."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        return None
    return set()
