"""The CPU int4 kernel's packed weights (kernels/cpu_decode.Packed) of a model file, kept in speechrt's cache so that
a warm start reads them instead of repacking every linear weight (~0.5 s of a start for SmolLM2-135M on one thread).

An entry is keyed by the model file (path, size, modification time), speechrt's and torch's versions and the
kernel's layout code (cpu_decode.py and cpu_decode.c): any of them changed, another entry replaces the file's old
one. It is written atomically (a temporary file, then a rename); an entry that cannot be read or does not fit the
model is rebuilt, with a warning.
"""

from __future__ import annotations

import hashlib
import logging
import os
import sys
import tempfile
from pathlib import Path

import torch

from speechrt.kernels import cpu_decode
from speechrt.machine import cache_home

log = logging.getLogger(__name__)


def cache_root() -> Path:
    """Where the entries live: speechrt's cache (speechrt.machine.cache_home) / lm-packed."""
    return cache_home() / "lm-packed"


def entry(source: str) -> Path | None:
    """The entry of the model file `source`, or None where it is not a file (nothing to key it by)."""
    try:
        st = os.stat(source)
    except OSError:
        return None
    parts = (os.path.abspath(source), st.st_size, st.st_mtime_ns, _version(), torch.__version__)
    h = hashlib.sha256("\0".join(map(str, parts)).encode())
    for code in (Path(cpu_decode.__file__), cpu_decode.SOURCE):
        h.update(code.read_bytes())
    where = hashlib.sha256(os.path.abspath(source).encode()).hexdigest()[:8]
    return cache_root() / f"{Path(source).stem}-{where}-{h.hexdigest()[:16]}.pt"


def _version() -> str:
    """speechrt's installed version (its package root imports the pipelines, above this layer)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("speechrt")
    except PackageNotFoundError:
        return "unknown"


def build(source: str, make, *args) -> cpu_decode.CpuLlama:
    """`make(*args, packed=...)` (a cpu_decode.CpuLlama) with the packed weights of `source`'s entry where it has
    one that fits; otherwise built afresh and its packed weights written as the entry."""
    path = entry(source)
    if path is not None and path.exists():
        try:
            saved = torch.load(path, weights_only=True)
            packed = [
                cpu_decode.Packed(d, n, k, b) for d, (n, k, b) in zip(saved["data"], saved["shapes"], strict=True)
            ]
            model = make(*args, packed=packed)
            if len(model.packs) == len(packed):
                return model
            raise ValueError(f"{len(packed)} packed weights, the model has {len(model.packs)}")
        except Exception as e:  # noqa: BLE001 - a broken or stale entry costs one rebuild, never the load
            log.warning("rebuilding the packed weights in %s: %s", path, str(e)[:300])
    if path is not None:  # made once per model file: said on stderr, as the exports and the kernel's build are
        sys.stderr.write(
            f"speechrt: packing {Path(source).name}'s weights for the CPU kernel into {path.parent} (once)\n"
        )
        sys.stderr.flush()
    model = make(*args)
    if path is not None:
        save(model.packs, path)
    return model


def save(packs: list[cpu_decode.Packed], path: Path) -> None:
    """Write `packs` as the entry `path` (atomic); a cache that cannot be written is logged and skipped."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".part")
        try:
            with os.fdopen(fd, "wb") as f:
                torch.save({"data": [p.data for p in packs], "shapes": [(p.n, p.k, p.bits) for p in packs]}, f)
            os.replace(tmp, path)
            stem = path.stem.rsplit("-", 1)[0]  # the same file's entries of an older version or content: replaced
            for old in path.parent.glob(f"{stem}-*.pt"):
                if old != path and old.stem.rsplit("-", 1)[0] == stem:
                    old.unlink(missing_ok=True)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    except OSError as e:
        log.warning("cannot cache the packed weights in %s: %s", path, e)
