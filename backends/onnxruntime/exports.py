"""The exports the onnxruntime backend runs: a model that is an export as it is, any other through the export
cache (made on first use), at the precision asked; the language model's for a GPU in float16."""

from __future__ import annotations

from speechrt.errors import UserError
from speechrt.export import Manifest, cached_export

from .precision import PRECISION


def export_dir(model, family: str, dtype: str | None, default: str, activations: str | None = None):
    """(directory, manifest) of `model`'s ONNX export at the precision `dtype` asks for: the model itself if
    it is an export, else the export cache's copy (made now, on first use; `activations`: see export_model)."""
    if dtype not in PRECISION:
        raise UserError(f"unsupported dtype {dtype!r} for onnxruntime; valid: {', '.join(k for k in PRECISION if k)}")
    want = PRECISION[dtype]
    if model.format == "speechrt-onnx":
        m = Manifest.read(model.path)
        if want is not None and want != m.precision:
            raise UserError(
                f"{model.path} is a {m.precision} export; dtype {dtype!r} needs another export "
                f"(speechrt export {family} --precision {want})"
            )
        return model.path, m
    d = cached_export(family, model, want or default, activations=activations)
    return d, Manifest.read(d)


def gpu_lm_export(model, dtype, default):
    """The language model's export for a GPU execution provider: float16 activations and cache throughout
    (their GroupQueryAttention has no float32 kernel: a float32 graph ran its attention on the CPU provider and
    gave wrong ids from the first decode step, H100, onnxruntime-gpu 1.31)."""
    want = PRECISION.get(dtype) or default
    if want == "fp32":
        raise UserError(
            "the onnxruntime language model on a GPU runs in float16: its GroupQueryAttention has no "
            "float32 kernel there; valid dtypes on a GPU: float16, int4, int8 (weight-only, float16 "
            "activations)"
        )
    d, m = export_dir(model, "lm", dtype, default, activations="float16" if want in ("int4", "int8") else None)
    if m.cache["dtype"] != "float16":
        raise UserError(
            f"{d} keeps its activations in {m.cache['dtype']}, which GPU execution providers cannot run "
            f"(no float32 GroupQueryAttention); export it with --activations float16, or use --device cpu"
        )
    return d, m
