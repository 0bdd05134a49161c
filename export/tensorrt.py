"""TensorRT engines from the exported graphs: optimization profiles derived from the manifest, the engine
cache key, and the build itself (which needs the `tensorrt` package and an NVIDIA GPU; everything else here
does not).

Profiles: every dynamic axis of a graph input is named in the manifest ('batch', 'tokens', 'past', 'total',
'cache', 'phonemes', 'frames'); `Limits` says how large each may grow. A Llama graph ('standard' variant)
gets two profiles, 'prefill' (one sequence, up to max_prompt tokens) and 'decode' (up to max_batch sequences,
one token each); the others get one.

Engines are cached by a key over the graph's hash, the GPU's compute capability, the TensorRT version, the
precision and the profiles: a change to any of them builds a new engine, nothing else does.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

from speechrt.errors import UserError

from .manifest import Manifest

PRECISIONS = ("fp32", "fp16", "int8")  # int8: weight-only (the graph's DequantizeLinear weights), fp16 activations
INSTALL = (
    "pip install tensorrt (its wheels fetch the libraries from NVIDIA's package index at install time) "
    "on a machine with an NVIDIA GPU and driver"
)


@dataclass(frozen=True)
class Limits:
    """Largest (and most common) sizes an engine must take."""

    max_batch: int = 8
    opt_batch: int = 1
    max_prompt: int = 512  # tokens in one prefill
    opt_prompt: int = 64
    max_seq: int = 2048  # positions per cached sequence
    opt_seq: int = 256
    max_phonemes: int = 512
    max_frames: int = 1024

    def __post_init__(self):
        for k, v in asdict(self).items():
            if v < 1:
                raise UserError(f"Limits.{k} must be >= 1, got {v}")
        for lo, hi in (("opt_batch", "max_batch"), ("opt_prompt", "max_prompt"), ("opt_seq", "max_seq")):
            if getattr(self, lo) > getattr(self, hi):
                raise UserError(f"Limits.{lo} ({getattr(self, lo)}) exceeds {hi} ({getattr(self, hi)})")
        if self.max_prompt > self.max_seq:
            raise UserError(f"Limits.max_prompt ({self.max_prompt}) exceeds max_seq ({self.max_seq})")


def _axis_ranges(kind: str, lim: Limits, model_max: int) -> dict[str, tuple[int, int, int]]:
    """Named axis -> (min, opt, max) for one profile kind: 'prefill', 'decode' or 'any'."""
    seq = min(lim.max_seq, model_max)
    if kind == "prefill":
        prompt = min(lim.max_prompt, seq)
        return {
            "batch": (1, 1, 1),
            "tokens": (1, min(lim.opt_prompt, prompt), prompt),
            "past": (0, 0, seq - 1),
            "total": (1, min(lim.opt_prompt, prompt), seq),
        }
    if kind == "decode":
        return {
            "batch": (1, lim.opt_batch, lim.max_batch),
            "tokens": (1, 1, 1),
            "past": (1, min(lim.opt_seq, seq - 1), seq - 1),
            "total": (2, min(lim.opt_seq, seq - 1) + 1, seq),
        }
    return {
        "batch": (1, lim.opt_batch, lim.max_batch),
        "tokens": (1, 1, min(lim.max_prompt, model_max)),
        "cache": (1, min(lim.opt_seq, model_max), model_max),
        "phonemes": (1, 64, lim.max_phonemes),
        "frames": (1, 64, lim.max_frames),
        "samples": (1, 64, lim.max_frames),
    }


def profiles(manifest: Manifest, graph: str, lim: Limits = Limits()) -> dict[str, dict[str, tuple]]:
    """{profile name: {input name: (min shape, opt shape, max shape)}} for one graph of an export."""
    g = manifest.graph(graph)
    cfg = manifest.config
    model_max = int(cfg.get("max_seq_len") or cfg.get("n_text_ctx") or lim.max_seq)
    kinds = ["prefill", "decode"] if manifest.family == "lm" else ["any"]
    out = {}
    for kind in kinds:
        ranges = _axis_ranges(kind, lim, model_max)
        shapes = {}
        for t in g.inputs:
            dims = []
            for d in t.shape:
                if isinstance(d, int):
                    dims.append((d, d, d))
                elif d in ranges:
                    dims.append(ranges[d])
                else:
                    raise UserError(
                        f"{graph}: input {t.name} has an axis {d!r} without a profile range; known: {', '.join(ranges)}"
                    )
            shapes[t.name] = tuple(tuple(x[i] for x in dims) for i in range(3))
        out[kind] = shapes
    return out


def engine_key(
    graph_sha256: str, compute_capability: tuple[int, int], trt_version: str, precision: str, profile: dict
) -> str:
    """The engine cache key: what an engine depends on, hashed."""
    if precision not in PRECISIONS:
        raise UserError(f"unknown TensorRT precision {precision!r}; valid: {', '.join(PRECISIONS)}")
    if not graph_sha256:
        raise UserError("the graph has no hash in its manifest; export it again")
    what = {
        "graph": graph_sha256,
        "sm": list(compute_capability),
        "trt": trt_version,
        "precision": precision,
        "profiles": profile,
    }
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:32]


def engine_path(cache: Path, graph: str, key: str) -> Path:
    return Path(cache) / f"{graph}-{key}.engine"


def build_engine(onnx_path: Path, profile: dict, precision: str, out: Path) -> Path:
    """Build a serialized engine of `onnx_path` with the given profiles (see `profiles`) into `out`."""
    try:
        import tensorrt as trt
    except ImportError:
        raise UserError(f"building a TensorRT engine needs the tensorrt package: {INSTALL}") from None
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errs = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise UserError(f"TensorRT cannot parse {onnx_path}: {errs}")
    config = builder.create_builder_config()
    if precision in ("fp16", "int8"):
        config.set_flag(trt.BuilderFlag.FP16)
    if precision == "int8":
        config.set_flag(trt.BuilderFlag.INT8)  # the graph's weight-only DequantizeLinear nodes
    for shapes in profile.values():
        p = builder.create_optimization_profile()
        for name, (lo, opt, hi) in shapes.items():
            p.set_shape(name, lo, opt, hi)
        config.add_optimization_profile(p)
    data = builder.build_serialized_network(network, config)
    if data is None:
        raise UserError(f"TensorRT failed to build an engine from {onnx_path} (see its log above)")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(bytes(data))
    return out
