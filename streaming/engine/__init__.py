"""The engine: one scheduler per device that batches the model work of every session and request (Engine), the
kinds of transcript it is asked for (Work), and what it counts (Metrics)."""

from .counters import Metrics
from .faults import EngineStalled, Fault, InjectedFault
from .load import LOAD_WINDOW_S, LOADED_BUSY, LOADED_FIRM, RecentLoad
from .scheduler import Engine
from .transcripts import Work
from .work import StreamTask

__all__ = [
    "LOAD_WINDOW_S",
    "LOADED_BUSY",
    "LOADED_FIRM",
    "Engine",
    "EngineStalled",
    "Fault",
    "InjectedFault",
    "Metrics",
    "RecentLoad",
    "StreamTask",
    "Work",
]
