"""speechrt.backends: the runner interfaces (base.py) and the backend registry (registry.py: name -> lazily
imported Backend class), one sub-package per backend (torch, triton, onnxruntime, tensorrt) and what they share
(threads.py, asr_state.py, tts_runner.py, tts_plan.py, cuda_graphs.py, dtypes.py); `auto.py` is `--backend auto`.

Heavy optional packages are imported inside the backend that needs them; a missing one raises
BackendUnavailable naming what to install and the backends that do work here.
"""

from __future__ import annotations

from .base import ASRRunner, Backend, Latent, LMRunner, Runner, RunnerInfo, TTSRunner
from .registry import AUTO, BACKENDS, BackendUnavailable, UnknownBackend, available, get

__all__ = [
    "ASRRunner",
    "LMRunner",
    "TTSRunner",
    "Runner",
    "RunnerInfo",
    "Latent",
    "Backend",
    "BACKENDS",
    "AUTO",
    "BackendUnavailable",
    "UnknownBackend",
    "get",
    "available",
]
