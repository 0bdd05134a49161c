"""The VITS generator's NCHWc islands joined, for ONNX Runtime's CPU provider.

ONNX Runtime runs a 2-D convolution (export/conv2d.py) in MLAS's blocked channel layout (NCHWc, blocks of 8
channels with AVX2, 16 with AVX-512) and puts a reorder to the plain layout after each one, and a reorder
back before the next, since its layout pass does not carry the elementwise ops in between (the resblocks'
LeakyRelu, the residual Add, the division that averages the resblocks) in the blocked layout. An elementwise
op gives the same numbers in either layout, so here they run on the blocked tensors: the optimized graph
(ORT_ENABLE_ALL, saved for this CPU) is rewritten so that each elementwise op over conv outputs has a twin
over their blocked forms, the reorders between those twins and the next convolution are dropped, and a
reorder to the plain layout stays only where a plain op (a transposed convolution, the last convolution)
reads the value. An op over a transposed convolution's output whose result a convolution reads runs
blocked too, on that output reordered once. A broadcast depends on the layout, so two tensors computed from
different graph inputs (the speaker's conditioning, [1, C, 1], beside the frames, [1, C, T]) or of different
channel counts are never joined; and the joined graph is run beside the stock one on a random input when the
session is made, and not used (with a warning) if the two differ. The audio is the same to the bit; the
generator has 8 reorders instead of 34.

Measured (AMD EPYC Zen 4, AVX-512, one thread, a 380-frame window, best of 5 in three rounds): 209-214 ms ->
195-199 ms, 0.92x. Whole sentences streamed (two sessions in one process taking turns, 16 rounds, medians):
5 words 0.94-0.96x, 30 words 0.955x, a 4-sentence paragraph 0.92-0.96x. The flow and the text encoder gain
nothing this way: each of the flow's convolutions feeds a channel Split (the WaveNet gate), which must see
the plain layout, and the text encoder's reorders take 1.5 ms of 68.

The optimized graph depends on the CPU (the block size) and on the ONNX Runtime version, so it is made where
the session is, never shipped: the first time on this machine (the stock session, the rewrite and the check), then
kept in speechrt's cache (onnx-joined/) under a key of the source graph (path, size, mtime), the ONNX Runtime
version, the CPU (model name and flags) and this code, and later sessions load it with only the basic passes: a
warm start of `speechrt serve` makes one generator session instead of two, without importing onnx.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path

from . import providers as ort_providers

log = logging.getLogger(__name__)
TOLERANCE = 1e-5  # the joined graph against the stock one at load (disagreement): the same function, or not used


def joined_session(path, providers, threads: int = 1) -> tuple:
    """(a session for the graph in `path` with the reorders removed, how many): on the CPU provider alone, over
    its optimized graph with the NCHWc islands joined (join_islands), where that removes any reorder and computes
    what the graph computes on a random input (else the graph as it is, with a warning). A joined graph made here
    before (cached_join) is loaded as it is."""
    if list(providers) != ["CPUExecutionProvider"]:
        return ort_providers.session(str(path), providers, threads), 0
    cache = cache_path(path)
    got = load_cached(cache, providers, threads)
    if got is not None:
        return got
    try:  # the stock session, which also writes out the graph as it optimized it
        stock, model = optimized_session(path, threads)
    except Exception as e:  # noqa: BLE001 - an optimization only (a read-only temp dir, a graph it cannot read)
        log.warning("%s: not joining the NCHWc islands (%s); running the stock graph", path, e)
        return ort_providers.session(str(path), providers, threads), 0
    if any(i.type != "tensor(float)" for i in stock.get_inputs()):  # (disagreement feeds floats)
        return stock, 0
    model, removed = join_islands(model)
    if removed <= 0:
        return stock, 0
    data = model.SerializeToString()
    joined = ort_providers.session(data, providers, threads, optimized=True)
    off = disagreement(stock, joined)
    if off > TOLERANCE:  # a structure the rewrite misread: keep the graph as ONNX Runtime runs it
        log.warning("%s: the NCHWc-joined graph is %.3g off the stock one; running the stock graph", path, off)
        return stock, 0
    store(cache, data, removed)
    return joined, removed


def join_islands(model):
    """nchwc_join.join_islands (imported here when a graph is joined: it imports onnx)."""
    from .nchwc_join import join_islands as join

    return join(model)


def cache_path(path) -> Path | None:
    """Where the joined graph of the graph in `path` is kept for this machine: speechrt's cache / onnx-joined /
    a hash of the graph file (resolved path, size, mtime), the ONNX Runtime version, the CPU's model name and
    flags (speechrt.machine.cpu_flags: SPEECHRT_CPU_ISA included) and the rewrite's code; None where the graph
    file cannot be read."""
    import onnxruntime

    from speechrt.machine import cache_home, cpu_flags

    try:
        src = Path(path).resolve()
        st = src.stat()
    except OSError:
        return None
    here = Path(__file__).parent
    h = hashlib.sha256()
    for part in (str(src), str(st.st_size), str(st.st_mtime_ns), onnxruntime.__version__, _cpu_name()):
        h.update(part.encode() + b"\0")
    h.update(" ".join(sorted(cpu_flags() or ())).encode())
    for f in ("nchwc.py", "nchwc_join.py"):
        h.update((here / f).read_bytes())
    return cache_home() / "onnx-joined" / f"{src.stem}-{h.hexdigest()[:16]}.onnx"


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        return ""


def load_cached(cache: Path | None, providers, threads: int) -> tuple | None:
    """(the session, reorders removed) from a joined graph kept at `cache`, or None where there is none or it
    does not load (then it is made again)."""
    meta = cache.with_suffix(".json") if cache else None
    if meta is None or not meta.is_file():
        return None
    try:
        removed = int(json.loads(meta.read_text())["reorders_removed"])
        return ort_providers.session(str(cache), providers, threads, optimized=True), removed
    except Exception as e:  # noqa: BLE001 - a cache entry that does not load is made again
        log.warning("%s: the cached NCHWc-joined graph does not load (%s); joining again", cache, e)
        return None


def store(cache: Path | None, data: bytes, removed: int) -> None:
    """Keep a joined graph at `cache` (written whole, then renamed; the .json last: its presence says the graph is
    complete). A cache that cannot be written is only a slower next start."""
    if cache is None:
        return
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        for target, body in ((cache, data), (cache.with_suffix(".json"), json.dumps({"reorders_removed": removed}))):
            fd, tmp = tempfile.mkstemp(dir=cache.parent, suffix=".tmp")
            with os.fdopen(fd, "wb") as f:
                f.write(body if isinstance(body, bytes) else body.encode())
            os.replace(tmp, target)
    except OSError as e:
        log.warning("%s: cannot keep the NCHWc-joined graph (%s); it is made again at the next start", cache, e)


def disagreement(a, b, frames: int = 37) -> float:
    """The largest difference between two sessions' outputs over the largest output value (at least 1), on
    random float inputs shaped by the first session's inputs (dynamic axes `frames` long)."""
    import numpy as np

    rng = np.random.default_rng(0)
    feed = {
        i.name: rng.standard_normal([d if isinstance(d, int) else frames for d in i.shape], dtype=np.float32)
        for i in a.get_inputs()
    }
    worst = 0.0
    for x, y in zip(a.run(None, feed), b.run(None, feed)):
        if x.shape != y.shape or not np.isfinite(y).all():
            return float("inf")
        worst = max(worst, float(np.abs(x - y).max()) / max(1.0, float(np.abs(x).max())))
    return worst


def optimized(path, threads: int = 1):
    """The graph in `path` as ONNX Runtime's CPU provider optimizes it on this machine (NCHWc nodes included)."""
    return optimized_session(path, threads)[1]


def optimized_session(path, threads: int = 1) -> tuple:
    """(a CPU session for the graph in `path` with every optimization (providers.session, `threads`
    intra-op threads), the graph as that session optimized it)."""
    import onnx

    fd, out = tempfile.mkstemp(suffix=".onnx")
    os.close(fd)
    try:
        sess = ort_providers.session(str(path), ["CPUExecutionProvider"], threads, save_optimized=out)
        return sess, onnx.load(out)
    finally:
        os.unlink(out)
