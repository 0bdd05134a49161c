"""The dtype names of an export's manifest (export/manifest.py) as torch dtypes, for the runners of exported graphs
(onnxruntime, tensorrt), which keep their caches and bound buffers in torch tensors."""

from __future__ import annotations

import torch

TORCH = {"float32": torch.float32, "float16": torch.float16, "int64": torch.int64, "int32": torch.int32}
