"""Faults injected into the engine's steps (for tests of what sessions are told), and the error of a stuck step."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass


@dataclass
class Fault:
    """A fault to inject into the next `count` steps of a stage (asr, lm, tts): each raises InjectedFault, or,
    with `stall_s`, sleeps that long first (a worker that hangs). For tests of what sessions are told."""

    stage: str
    count: int = 1
    stall_s: float = 0.0

    def __post_init__(self):
        if self.stage not in ("asr", "lm", "tts"):
            raise ValueError(f"fault stage must be asr, lm or tts, got {self.stage!r}")
        if self.count < 1 or not 0 <= self.stall_s <= 600:
            raise ValueError("fault count must be >= 1 and stall_s in [0, 600]")


class InjectedFault(RuntimeError):
    pass


class EngineStalled(RuntimeError):
    """The engine's worker spent longer than the stall timeout in one step."""


class FaultPlan:
    """The faults injected and not yet spent; checked by the worker before each step."""

    def __init__(self):
        self.lock = threading.Lock()
        self.faults: list[Fault] = []

    def add(self, fault: Fault) -> None:
        with self.lock:
            self.faults.append(fault)

    def check(self, stage: str) -> None:
        """Before a step of `stage`: apply a pending fault of that stage, if any."""
        with self.lock:
            fault = next((f for f in self.faults if f.stage == stage), None)
            if fault is None:
                return
            fault.count -= 1
            if fault.count <= 0:
                self.faults.remove(fault)
        if fault.stall_s:
            time.sleep(fault.stall_s)
        else:
            raise InjectedFault(f"injected fault in a {stage} step")
