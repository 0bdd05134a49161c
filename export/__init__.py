"""ONNX export of each model's runner graphs, TensorRT engine builds from them, quantization.

    from speechrt.export import export_model
    export_model("lm", None, "out/smollm2")          # the embedded model -> out/smollm2/{model.onnx,manifest.json}

An export is a directory of ONNX graphs plus manifest.json (export/manifest.py), the one contract with the
runners; models.registry recognizes such a directory as a model path. `cached_export` exports a model on
first use into a cache directory (the onnxruntime backend given a model name).
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib
import os
import shutil
import tempfile
import time
from pathlib import Path

from speechrt.errors import UserError
from speechrt.outputs import check_output_dir

from .manifest import MANIFEST, Manifest, ManifestError, source_sha256

# family -> module with export(model, out, precision, opset, variant, bar) -> Manifest
EXPORTERS: dict[str, str] = {
    "asr": "speechrt.export.whisper_export",
    "lm": "speechrt.export.lm_export",
    "tts": "speechrt.export.vits_export",
}
PRECISIONS = ("fp32", "fp16", "int8", "int4")
VARIANTS = ("ort", "standard")
DEFAULT_OPSET = 17

__all__ = [
    "export_model",
    "cached_export",
    "Manifest",
    "ManifestError",
    "EXPORTERS",
    "PRECISIONS",
    "VARIANTS",
    "cache_dir",
]


class _NoBar:
    """What the exporters call when no progress bar is shown."""

    def update(self, n=1):
        pass

    def reset(self, total=None):
        pass

    def set_description(self, text):
        pass

    def close(self):
        pass


class _LineBar(_NoBar):
    """Progress where stderr is not a terminal (a log file, a pipe): one line per stage, with the seconds since
    the export began, and no carriage returns or partial lines."""

    def __init__(self, what: str, stream):
        self.what, self.stream, self.t0, self.last = what, stream, time.perf_counter(), None
        self.set_description("starting")

    def set_description(self, text):
        if text != self.last:
            self.last = text
            self.stream.write(f"speechrt: {self.what}: {text} ({time.perf_counter() - self.t0:.1f} s)\n")
            self.stream.flush()


def _bar(show: bool, what: str):
    """A progress bar on stderr: tqdm's on a terminal, else one line per stage (_LineBar)."""
    import sys

    if not show:
        return _NoBar()
    if not sys.stderr.isatty():
        return _LineBar(what, sys.stderr)
    from tqdm import tqdm

    return tqdm(total=1, desc=what, unit="step", leave=True, dynamic_ncols=True)


def _finish(bar) -> None:
    """A bar that ends full: its total may count stages an export skipped."""
    total = getattr(bar, "total", None)
    if total:
        bar.update(total - bar.n)


def export_model(
    family: str,
    model=None,
    out=None,
    precision: str | None = None,
    opset: int = DEFAULT_OPSET,
    variant: str = "ort",
    progress: bool = True,
    activations: str | None = None,
) -> Manifest:
    """Export `model` (a registry name or path; None: the family's default) of `family` into directory `out`.
    precision: fp32 | fp16 | int8 | int4 where the family has it (None: the family's default). activations
    (lm only, int4 / int8): float32 (default) or float16, what GPU execution providers run the weight-only
    graphs at. The directory is written whole or not at all (a temporary directory renamed at the end)."""
    from speechrt.models.registry import resolve

    if family not in EXPORTERS:
        raise UserError(f"unknown model family {family!r} to export; valid: {', '.join(EXPORTERS)}")
    if precision is not None and precision not in PRECISIONS:
        raise UserError(f"unknown precision {precision!r}; valid: {', '.join(PRECISIONS)}")
    if variant not in VARIANTS:
        raise UserError(
            f"unknown graph variant {variant!r}; valid: {', '.join(VARIANTS)} (standard: plain ONNX ops for TensorRT)"
        )
    if activations not in (None, "float32", "float16"):
        raise UserError(f"unknown activations {activations!r}; valid: float32, float16")
    if activations and family != "lm":
        raise UserError(f"--activations is for language models (lm), not {family}")
    if not 14 <= opset <= 21:
        raise UserError(f"opset {opset} is not supported; valid: 14..21")
    if out is None:
        raise UserError("give an output directory (--out DIR)")
    out = check_output_dir(out, "out", empty=True)
    m = resolve(model, family)
    if m.format == "speechrt-onnx":
        raise UserError(
            f"{m.path} is already an export; export its source model ({Manifest.read(m.path).source.get('path')})"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    bar = _bar(progress, f"export {family} {m.name}")
    t0 = time.perf_counter()
    try:
        mod = importlib.import_module(EXPORTERS[family])
        man = mod.export(
            m, tmp, precision, opset, variant, bar, **({"activations": activations} if activations else {})
        )
        bar.set_description("hashing")
        man.source["sha256"] = source_sha256(m.path)
        man.extra["export_seconds"] = round(time.perf_counter() - t0, 1)
        man.write(tmp)
        if out.exists():
            out.rmdir()
        os.replace(tmp, out)
        _finish(bar)
        bar.set_description(f"exported {family} {m.name} ({man.precision}) to {out}")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        bar.close()
    return man


def cache_dir() -> Path:
    """Where exports made on first use live: speechrt's cache (speechrt.machine.cache_home) / onnx."""
    from speechrt.machine import cache_home

    return cache_home() / "onnx"


def exporter_hash() -> str:
    """A hash of the exporters' own code: an export made by other code is made again."""
    h = hashlib.sha256()
    for f in sorted(Path(__file__).parent.glob("*.py")):
        h.update(f.read_bytes())
    return h.hexdigest()[:12]


def cached_export(
    family: str,
    model,
    precision: str | None,
    variant: str = "ort",
    progress: bool = True,
    activations: str | None = None,
) -> Path:
    """The directory of `model`'s export in the cache, made now (with a progress bar) if it is not there.
    Keyed by the model's name, file size and modification time, precision, variant and the exporters' code;
    a directory that does not hold a readable manifest is exported again."""
    st = Path(model.path).stat()
    acts = f"-{activations}" if activations else ""
    key = (
        f"{model.name.replace('/', '--')}-{family}-{variant}-{precision or 'default'}{acts}-{st.st_size:x}-"
        f"{int(st.st_mtime):x}-{exporter_hash()}"
    )
    d = cache_dir() / key
    d.parent.mkdir(parents=True, exist_ok=True)
    # several processes (servers started together, test workers) may want the same export: one makes
    # it while the others wait on the lock, then read it
    with open(d.parent / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (d / MANIFEST).exists():
            try:
                Manifest.read(d)
                return d
            except ManifestError:
                shutil.rmtree(d, ignore_errors=True)
        _one_thread(export_model, family, str(model.path), d, precision, variant, progress, activations)
    return d


def _one_thread(export, family, path, d, precision, variant, progress, activations) -> None:
    """An export made on first use, on one torch thread: it runs beside the other models' loads (a server loads
    them side by side), and its many small ops stall at two threads' barriers whenever another thread or process
    holds a core (a loaded 2-core VM: the voice 2.5-2.8 s on one thread, 5.8-6.1 s on two; Whisper int8 4.0 /
    4.6 s)."""
    import torch

    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        export(family, path, d, precision, variant=variant, progress=progress, activations=activations)
    finally:
        torch.set_num_threads(prev)
