"""The onnxruntime backend's export precisions: what a `dtype` asks for, and the default per family and device
(when no dtype is given)."""

from __future__ import annotations

# (family, device kind) -> export precision
DEFAULTS = {
    ("asr", "cpu"): "fp32",
    ("asr", "gpu"): "fp16",
    ("lm", "cpu"): "int4",
    ("lm", "gpu"): "fp16",
    ("tts", "cpu"): "fp32",
    ("tts", "gpu"): "fp32",
}


def default_precision(family: str, providers) -> str:
    first = providers[0][0] if isinstance(providers[0], tuple) else providers[0]
    return DEFAULTS[(family, "cpu" if first == "CPUExecutionProvider" else "gpu")]


# what `dtype` may be for the exported families -> export precision (None: the backend's default)
PRECISION = {
    None: None,
    "auto": None,
    "float32": "fp32",
    "fp32": "fp32",
    "float16": "fp16",
    "fp16": "fp16",
    "int8": "int8",
    "int4": "int4",
    "q4": "int4",
}
