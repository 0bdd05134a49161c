"""The backend registry: name -> lazily imported Backend class; errors list the valid names.

Heavy optional packages are imported inside the backend that needs them; a missing one raises
BackendUnavailable naming what to install and the backends that do work here. This module imports no backend
(every target, `auto` included, is a "module:Class" string), so the runner interfaces (base.py) and `auto` can
ask it what runs here.
"""

from __future__ import annotations

import importlib

from speechrt.errors import UserError

BACKENDS: dict[str, str] = {
    "torch": "speechrt.backends.torch:TorchBackend",
    "onnxruntime": "speechrt.backends.onnxruntime:OnnxRuntimeBackend",
    "triton": "speechrt.backends.triton:TritonBackend",
    "tensorrt": "speechrt.backends.tensorrt:TensorRTBackend",
}


class UnknownBackend(UserError, ValueError):
    pass


class BackendUnavailable(UserError, RuntimeError):
    pass


AUTO = "auto"  # not a backend of its own: per family, the one measured best here (backends/auto.py)
AUTO_TARGET = "speechrt.backends.auto:AutoBackend"


def _load(target: str):
    mod, _, cls = target.partition(":")
    return getattr(importlib.import_module(mod), cls)


def get(name: str):
    """Instantiate backend `name` (or 'auto'); errors list the valid names."""
    if name == AUTO:
        return _load(AUTO_TARGET)()
    if name not in BACKENDS:
        raise UnknownBackend(f"unknown backend {name!r}; valid backends: {', '.join(BACKENDS)}, {AUTO}")
    try:
        backend = _load(BACKENDS[name])
    except ImportError as e:  # a backend module imports its engine at top level
        raise BackendUnavailable(
            f"backend {name!r} is unavailable: {e}. Available here: {', '.join(available())}"
        ) from e
    return backend()


def available(family: str | None = None) -> list[str]:
    """Backends whose modules import on this machine (and that run `family`, if given)."""
    out = []
    for n, target in BACKENDS.items():
        try:
            backend = _load(target)
        except ImportError:
            continue
        if family is None or family in backend.families:
            out.append(n)
    return out


def runs(name: str, family: str) -> bool:
    """Whether backend `name`'s module imports here and runs `family`: `available` asked of one backend, without
    importing the others (triton alone takes 0.3 s to import)."""
    try:
        return name in BACKENDS and family in _load(BACKENDS[name]).families
    except ImportError:
        return False
