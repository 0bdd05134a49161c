"""Backend registry: name -> lazily imported Backend class.

Heavy optional packages are imported inside the backend that needs them; a missing one raises
BackendUnavailable naming what to install and the backends that do work here.
"""

from __future__ import annotations

import importlib

from speechrt.errors import UserError

from .base import ASRRunner, Backend, Latent, LMRunner, Runner, RunnerInfo, TTSRunner

BACKENDS: dict[str, str] = {
    "torch": "speechrt.backends.torch_backend:TorchBackend",
    "onnxruntime": "speechrt.backends.onnxruntime_backend:OnnxRuntimeBackend",
    "triton": "speechrt.backends.triton_backend:TritonBackend",
    "tensorrt": "speechrt.backends.tensorrt_backend:TensorRTBackend",
}


class UnknownBackend(UserError, ValueError):
    pass


class BackendUnavailable(UserError, RuntimeError):
    pass


AUTO = "auto"  # not a backend of its own: per family, the one measured best here (backends/auto.py)


def get(name: str) -> Backend:
    """Instantiate backend `name` (or 'auto'); errors list the valid names."""
    if name == AUTO:
        from .auto import AutoBackend

        return AutoBackend()
    if name not in BACKENDS:
        raise UnknownBackend(f"unknown backend {name!r}; valid backends: {', '.join(BACKENDS)}, {AUTO}")
    mod, _, cls = BACKENDS[name].partition(":")
    try:
        m = importlib.import_module(mod)
    except ImportError as e:  # a backend module imports its engine at top level
        raise BackendUnavailable(
            f"backend {name!r} is unavailable: {e}. Available here: {', '.join(available())}"
        ) from e
    return getattr(m, cls)()


def available(family: str | None = None) -> list[str]:
    """Backends whose modules import on this machine (and that run `family`, if given)."""
    out = []
    for n, target in BACKENDS.items():
        mod, _, cls = target.partition(":")
        try:
            m = importlib.import_module(mod)
        except ImportError:
            continue
        if family is None or family in getattr(m, cls).families:
            out.append(n)
    return out


__all__ = [
    "ASRRunner",
    "LMRunner",
    "TTSRunner",
    "Runner",
    "RunnerInfo",
    "Latent",
    "Backend",
    "BACKENDS",
    "BackendUnavailable",
    "UnknownBackend",
    "get",
    "available",
]
