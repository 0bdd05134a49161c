"""The engine: one scheduler per device that batches the model work of every session and request (Engine), the
kinds of transcript it is asked for (Work), and what it counts (Metrics)."""

from .counters import Metrics
from .faults import EngineStalled, Fault, InjectedFault
from .load import LOAD_WINDOW_S, LOADED_BUSY, LOADED_FIRM, RecentLoad
from .scheduler import LIVE, Engine
from .transcripts import LONG_TEMPERATURES, Work
from .work import StreamTask

__all__ = [
    "LIVE",
    "LOAD_WINDOW_S",
    "LOADED_BUSY",
    "LOADED_FIRM",
    "LONG_TEMPERATURES",
    "Engine",
    "EngineStalled",
    "Fault",
    "InjectedFault",
    "Metrics",
    "RecentLoad",
    "StreamTask",
    "Work",
]
