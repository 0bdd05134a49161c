"""The one result schema every `speechrt bench` command writes with `--json FILE`.

A file is one run on one machine: the schema version, the command, the machine's fingerprint
(fingerprint.py), and one record per measurement. A record names what was measured (family, model,
engine, backend, precision, device, workload, metric, unit), its value, the spread of its repeats
(n, min, median, max; and each round's value where the run's engines took turns, `rounds`) and the label of
the peer it is compared with, measured in the same run. What was not measured, and why, is a skip; GPU
validation results are checks (pass/fail/skip with a detail).

    {"schema": "speechrt-bench/1", "command": "...", "created": "...", "machine": {...},
     "records": [{"family": "asr", "model": "whisper-tiny.en", "engine": "speechrt", "backend": "torch",
                  "precision": "float32", "device": "cpu", "workload": "passage.flac 58.0 s, beam 1",
                  "metric": "rtf", "unit": "x", "value": 0.062, "better": "lower",
                  "repeats": {"n": 3, "min": 0.061, "median": 0.062, "max": 0.064},
                  "peer": "faster-whisper float32", "params": {"threads": 2}}, ...],
     "skipped": [{"family": "lm", "what": "llama.cpp", "reason": "not installed"}],
     "checks": [], "notes": ["..."]}
"""

from __future__ import annotations

import datetime
import json
import math
import shlex
import statistics
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from speechrt.errors import UserError

SCHEMA = "speechrt-bench/1"
FAMILIES = ("asr", "lm", "tts", "server", "kernels", "gpu")
BETTER = ("lower", "higher", "")  # "": informational (a word error rate, a count), never a regression
STATUSES = ("pass", "fail", "skip")


@dataclass(frozen=True)
class Repeats:
    """Spread of a measurement's repeats (or of its samples, for latency percentiles)."""

    n: int
    min: float
    median: float
    max: float
    # each repeat's value in order, kept where a run's engines take turns round by round (bench tts): round i
    # of every row that has rounds was measured back to back with round i of the others
    rounds: tuple[float, ...] | None = None

    def __post_init__(self):
        if self.rounds is not None:
            object.__setattr__(self, "rounds", tuple(float(x) for x in self.rounds))
            if len(self.rounds) != self.n:
                raise ValueError(f"{len(self.rounds)} rounds for {self.n} repeats")

    @classmethod
    def of(cls, samples, rounds: bool = False) -> Repeats | None:
        """The spread of `samples`; with rounds=True they are a run's rounds, in order, and are kept."""
        xs = [float(x) for x in samples]
        if not xs:
            return None
        return cls(len(xs), min(xs), statistics.median(xs), max(xs), tuple(xs) if rounds else None)

    def scaled(self, k: float) -> Repeats:
        lo, hi = sorted((self.min * k, self.max * k))
        return Repeats(self.n, lo, self.median * k, hi, None if self.rounds is None else [x * k for x in self.rounds])


@dataclass(frozen=True)
class Record:
    family: str
    model: str
    engine: str  # "speechrt", or the peer's name: "faster-whisper", "llama.cpp", "piper-tts", "whisper-live"
    backend: str  # our backend; a peer's runtime (ctranslate2, ggml, onnxruntime)
    precision: str
    device: str
    workload: str  # what was run, in words: "passage.flac 58.0 s, beam 1", "batch 8, 64 tokens"
    metric: str
    unit: str
    value: float
    better: str
    repeats: Repeats | None = None
    peer: str = ""  # label of the record this one is compared with (same workload and metric, same run)
    params: dict = field(default_factory=dict)  # numbers a plot needs (batch, streams, bytes, flops, threads)

    def __post_init__(self):
        if self.family not in FAMILIES:
            raise ValueError(f"unknown family {self.family!r}; valid: {', '.join(FAMILIES)}")
        if self.better not in BETTER:
            raise ValueError(f"better must be one of {BETTER}, got {self.better!r}")
        if not isinstance(self.value, (int, float)) or not math.isfinite(self.value):
            raise ValueError(f"{self.metric} of {self.label}: value must be a finite number, got {self.value!r}")
        if isinstance(self.repeats, dict):
            object.__setattr__(self, "repeats", Repeats(**self.repeats))

    @property
    def label(self) -> str:
        """The engine as a table names it: 'speechrt torch float32', 'faster-whisper int8'."""
        parts = [self.engine, self.backend if self.engine == "speechrt" else "", self.precision]
        return " ".join(p for p in parts if p)

    @property
    def key(self) -> tuple:
        """What makes two records (of two runs) the same measurement."""
        return (self.family, self.model, self.label, self.device, self.workload, self.metric)

    def to_dict(self) -> dict:
        d = asdict(self)
        if self.repeats is None:
            d.pop("repeats")
        elif self.repeats.rounds is None:
            d["repeats"].pop("rounds")
        return d


def gpu_record(**fields) -> Record:
    """A `bench gpu` check's record of speechrt's triton backend: Record(family="gpu", engine="speechrt",
    backend="triton", **fields)."""
    return Record(family="gpu", engine="speechrt", backend="triton", **fields)


@dataclass(frozen=True)
class Skip:
    family: str
    what: str
    reason: str


@dataclass(frozen=True)
class Check:
    """A validation's outcome (bench gpu): name, pass/fail/skip, and what was compared or why it was skipped."""

    name: str
    status: str
    detail: str

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"check status must be one of {STATUSES}, got {self.status!r}")


@dataclass
class Results:
    """One run on one machine."""

    records: list[Record] = field(default_factory=list)
    skipped: list[Skip] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    machine: dict = field(default_factory=dict)
    command: str = ""
    created: str = ""
    source: str = ""  # the file it was read from

    def skip(self, family: str, what: str, reason: str) -> None:
        self.skipped.append(Skip(family, what, reason))

    def extend(self, other: Results) -> None:
        self.records += other.records
        self.skipped += other.skipped
        self.checks += other.checks
        self.notes += other.notes

    def peer_of(self, r: Record) -> Record | None:
        """The record `r` is compared with, in this run."""
        if not r.peer:
            return None
        return next(
            (
                p
                for p in self.records
                if p.label == r.peer and p.family == r.family and p.workload == r.workload and p.metric == r.metric
            ),
            None,
        )

    def write(self, path, machine: dict | None = None) -> None:
        """Write the file; the fingerprint is taken now unless given (`machine`)."""
        from speechrt.bench.fingerprint import fingerprint

        doc = {
            "schema": SCHEMA,
            "command": self.command or "speechrt " + shlex.join(sys.argv[1:]),
            "created": self.created or datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "machine": machine or self.machine or fingerprint(),
            "records": [r.to_dict() for r in self.records],
            "skipped": [asdict(s) for s in self.skipped],
            "checks": [asdict(c) for c in self.checks],
            "notes": list(self.notes),
        }
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(doc, indent=1) + "\n")


def load(path) -> Results:
    """Read a result file; a file of another schema fails naming the one expected."""
    p = Path(path)
    try:
        doc = json.loads(p.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise UserError(f"cannot read benchmark results {p}: {e}") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        got = doc.get("schema") if isinstance(doc, dict) else type(doc).__name__
        raise UserError(
            f"{p} is not a speechrt benchmark result of schema {SCHEMA!r} (found {got!r}); "
            "write one with `speechrt bench ... --json FILE`"
        )
    try:
        return Results(
            records=[Record(**r) for r in doc["records"]],
            skipped=[Skip(**s) for s in doc["skipped"]],
            checks=[Check(**c) for c in doc.get("checks", [])],
            notes=doc.get("notes", []),
            machine=doc["machine"],
            command=doc.get("command", ""),
            created=doc.get("created", ""),
            source=str(p),
        )
    except (KeyError, TypeError, ValueError) as e:
        raise UserError(f"{p}: malformed record: {e}") from None


def percentile(xs, q: float) -> float:
    """Nearest-rank percentile (q in [0, 1]) of a non-empty sample."""
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]
