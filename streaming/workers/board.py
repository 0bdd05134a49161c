"""What the front and the worker processes share: per worker, counts in shared memory (each written by one
process), the admission lock over the session cap, and the folder where each worker publishes its figures."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from multiprocessing.sharedctypes import RawArray
from pathlib import Path


class Board:
    """Per worker i, in shared memory (plain integers, no lock: each count has one writer): handed[i]
    connections the front handed to it, taken[i] of those that reached the app (or were given up), calls[i] its
    WebSocket calls in progress (the worker's), sessions[i] its admitted sessions and rest[i] its REST requests
    running (the worker's, under the admission lock), ready[i] and pids[i] (the front's). The admission lock is
    a file lock (flock), which the kernel releases when its holder dies: a worker killed inside it blocks nobody.
    Picklable for the spawned workers (only while they are started)."""

    def __init__(self, workers: int, folder: str):
        self.workers, self.folder = workers, folder
        self.handed, self.taken, self.calls, self.pids = (RawArray("q", workers) for _ in range(4))
        self.sessions, self.rest = RawArray("q", workers), RawArray("q", workers)
        self.ready = RawArray("b", workers)
        self.restarts = RawArray("q", 1)  # workers replaced after they died (the front's)
        self.lock_file = None  # opened in each process on first use

    def __getstate__(self):
        return {**self.__dict__, "lock_file": None}

    @contextlib.contextmanager
    def locked(self):
        if self.lock_file is None:
            self.lock_file = open(Path(self.folder) / "admission.lock", "a+b")  # noqa: SIM115 - held for life
        fcntl.flock(self.lock_file, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self.lock_file, fcntl.LOCK_UN)

    # -- admission (the workers) ------------------------------------------------------------------------
    def admit(self, counts, i: int, open_now: int, cap: int) -> bool:
        """Whether worker i, with `open_now` sessions (or REST requests) open, may admit one more under the cap
        shared by all the workers (`counts`: sessions or rest); if so it is counted at once."""
        with self.locked():
            if sum(counts[j] for j in range(self.workers) if j != i) + open_now >= cap:
                return False
            counts[i] = open_now + 1
            return True

    def set_count(self, counts, i: int, open_now: int) -> None:
        with self.locked():
            counts[i] = open_now

    # -- placement (the front) --------------------------------------------------------------------------
    def load(self, i: int) -> int:
        """Worker i's WebSocket calls in progress plus the connections handed to it that have not reached its
        app yet (a burst placed at once is counted before the worker has read it)."""
        return self.calls[i] + self.handed[i] - self.taken[i]

    def forget(self, i: int) -> None:
        """Worker i is gone: its counts are zeroed (its sessions no longer hold the cap) and its figures dropped."""
        self.ready[i] = 0
        with self.locked():
            self.sessions[i] = self.rest[i] = 0
        self.handed[i] = self.taken[i] = self.calls[i] = 0
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.figures_path(i))

    # -- figures ----------------------------------------------------------------------------------------
    def figures_path(self, i: int) -> Path:
        return Path(self.folder) / f"worker-{i}.json"

    def publish(self, i: int, figures: dict) -> None:
        """Worker i's figures (figures.snapshot), replaced whole (readers never see half a file)."""
        path = self.figures_path(i)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(figures))
        os.replace(tmp, path)

    def published(self, skip: int) -> list[dict]:
        """The figures the running workers other than `skip` last published."""
        rows = []
        for j in range(self.workers):
            if j == skip or not self.ready[j]:
                continue
            try:
                row = json.loads(self.figures_path(j).read_text())
            except (FileNotFoundError, ValueError):
                continue
            if row.get("pid") == self.pids[j]:  # not a dead predecessor's
                rows.append(row)
        return rows
