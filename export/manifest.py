"""manifest.json: the one contract between an exporter and the runners that read its graphs.

An exported model is a directory: ONNX graphs plus `manifest.json`, which says what the graphs are (family,
model config, each graph's input/output names, dtypes and shapes with named dynamic axes), how the caches
are laid out and how large they may grow, the precision and how the weights were formed, the source file
and its hash, the opset and the speechrt version. Runners take every name and shape from here; a graph's
I/O is declared once, by its exporter, as a list of `Tensor`s (`io()` of each export module).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from speechrt.errors import UserError

MANIFEST = "manifest.json"
FORMAT_VERSION = 1
FAMILIES = ("asr", "lm", "tts")


class ManifestError(UserError, ValueError):
    """An exported directory whose manifest is missing, unreadable or of another version."""


@dataclass(frozen=True)
class Tensor:
    """One graph input or output. shape: ints for fixed axes, names for dynamic ones."""

    name: str
    dtype: str  # numpy dtype name: float32, float16, int64, int32
    shape: tuple

    def to_json(self) -> dict:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}

    @classmethod
    def from_json(cls, d: dict) -> Tensor:
        return cls(d["name"], d["dtype"], tuple(d["shape"]))


@dataclass(frozen=True)
class Graph:
    file: str
    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]
    sha256: str = ""  # of the graph file, and of its weight file where it has one
    data: str = ""  # the file of its weights (ONNX external data), if not inside the graph file; may be shared

    def input(self, name: str) -> Tensor:
        return next(t for t in self.inputs if t.name == name)

    def to_json(self) -> dict:
        return {
            "file": self.file,
            "sha256": self.sha256,
            **({"data": self.data} if self.data else {}),
            "inputs": [t.to_json() for t in self.inputs],
            "outputs": [t.to_json() for t in self.outputs],
        }

    @classmethod
    def from_json(cls, d: dict) -> Graph:
        return cls(
            d["file"],
            tuple(Tensor.from_json(t) for t in d["inputs"]),
            tuple(Tensor.from_json(t) for t in d["outputs"]),
            d.get("sha256", ""),
            d.get("data", ""),
        )


@dataclass
class Manifest:
    family: str
    model: str  # the source model's registry name or file name
    config: dict  # the model config dataclass, as a dict
    graphs: dict[str, Graph]
    precision: str  # fp32 | fp16 | int8 | int4
    variant: str = "ort"  # ort: ONNX Runtime contrib ops where they are the fast path; standard: plain ONNX ops
    cache: dict = field(default_factory=dict)  # layout and limits of the caches the runner allocates
    weights: str = ""  # how the weights were formed (what was kept exactly, what was re-quantized)
    source: dict = field(default_factory=dict)  # {"path", "format", "sha256"}
    opset: int = 17
    speechrt_version: str = ""
    extra: dict = field(default_factory=dict)  # family-specific facts (tokenizer ids, voice file, ...)
    format_version: int = FORMAT_VERSION

    def __post_init__(self):
        if self.family not in FAMILIES:
            raise ManifestError(f"unknown family {self.family!r} in manifest; valid: {', '.join(FAMILIES)}")

    def graph(self, name: str) -> Graph:
        if name not in self.graphs:
            raise ManifestError(f"the export has no {name!r} graph; it has: {', '.join(self.graphs)}")
        return self.graphs[name]

    def to_json(self) -> dict:
        d = asdict(self)
        d["graphs"] = {k: g.to_json() for k, g in self.graphs.items()}
        return d

    def write(self, directory: Path) -> Path:
        sums: dict[str, str] = {}  # file -> sha256, each file hashed once

        def sha(f: str) -> str:
            if f not in sums:
                sums[f] = file_sha256(Path(directory) / f)
            return sums[f]

        for name, g in self.graphs.items():
            h = sha(g.file) if not g.data else hashlib.sha256((sha(g.file) + sha(g.data)).encode()).hexdigest()
            self.graphs[name] = Graph(g.file, g.inputs, g.outputs, h, g.data)
        p = Path(directory) / MANIFEST
        p.write_text(json.dumps(self.to_json(), indent=1))
        return p

    @classmethod
    def read(cls, directory: Path) -> Manifest:
        p = Path(directory) / MANIFEST
        try:
            d = json.loads(p.read_text())
        except FileNotFoundError:
            raise ManifestError(
                f"{directory}: no {MANIFEST}; not a speechrt export (make one with `speechrt export`)"
            ) from None
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ManifestError(f"{p}: not valid JSON ({e})") from None
        if d.get("format_version") != FORMAT_VERSION:
            raise ManifestError(
                f"{p}: manifest format {d.get('format_version')!r}, this speechrt reads "
                f"{FORMAT_VERSION}; export the model again"
            )
        d["graphs"] = {k: Graph.from_json(g) for k, g in d["graphs"].items()}
        return cls(**d)


def speechrt_version() -> str:
    """The installed speechrt's version, which each manifest records: read from the package's metadata, so that the
    export layer does not import the package face (speechrt/__init__.py); "" where speechrt runs uninstalled."""
    try:
        return importlib.metadata.version("speechrt")
    except importlib.metadata.PackageNotFoundError:
        return ""


def file_sha256(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while b := f.read(chunk):
            h.update(b)
    return h.hexdigest()


def source_sha256(path: Path) -> str:
    """Hash of a model file, or of every file of a model directory (names and contents, in order)."""
    path = Path(path)
    if path.is_file():
        return file_sha256(path)
    h = hashlib.sha256()
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        h.update(str(f.relative_to(path)).encode())
        h.update(file_sha256(f).encode())
    return h.hexdigest()
