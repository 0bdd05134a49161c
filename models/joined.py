"""A model file that PyPI packages carry in pieces (wheels have a size limit), joined once into speechrt's cache so
that it can be memory-mapped as one file (a GGUF: Gemma 3 270M's four parts)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from speechrt.errors import UserError
from speechrt.machine import cache_home


def joined(pieces: list[Path], name: str) -> Path:
    """The file `name` in cache_home()/models made of `pieces` in order: made on first use (atomically: a
    concurrent join writes the same bytes), kept while its size is theirs together."""
    total = sum(p.stat().st_size for p in pieces)
    out = cache_home() / "models" / name
    if out.exists() and out.stat().st_size == total:
        return out
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=out.parent, suffix=".part")
        try:
            with os.fdopen(fd, "wb") as f:
                for p in pieces:
                    with p.open("rb") as src:
                        while block := src.read(1 << 24):
                            f.write(block)
            os.replace(tmp, out)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    except OSError as e:
        raise UserError(
            f"cannot join {pieces[0].name} and its {len(pieces) - 1} further parts into {out}: {e}; "
            "set SPEECHRT_CACHE to a writable directory"
        ) from None
    return out
