"""A small ONNX graph builder: nodes with generated output names, initializers from numpy, typed I/O from
manifest Tensors. Used by the exporters that write graphs op by op (Llama), where torch.onnx would leave
hundreds of shape ops between the ones that compute; saving one graph, or several whose weights share one file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, external_data_helper, helper, numpy_helper

from .manifest import Tensor

DTYPES = {
    "float32": TensorProto.FLOAT,
    "float16": TensorProto.FLOAT16,
    "int64": TensorProto.INT64,
    "int32": TensorProto.INT32,
    "uint8": TensorProto.UINT8,
    "bool": TensorProto.BOOL,
}
MS = "com.microsoft"


class GraphBuilder:
    def __init__(self, name: str):
        self.name = name
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self._count = 0
        self._consts: dict[str, list[int]] = {}
        self.uses_ms = False

    def op(
        self,
        op_type: str,
        inputs: list[str],
        n_out: int = 1,
        name: str = "",
        domain: str = "",
        outputs: list[str] | None = None,
        **attrs,
    ):
        """Add a node -> its output name (or a list of them when n_out > 1)."""
        self._count += 1
        base = name or f"{op_type}_{self._count}"
        outs = outputs or [f"{base}/out{i}" if n_out > 1 else f"{base}/out" for i in range(n_out)]
        if domain == MS:
            self.uses_ms = True
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=base, domain=domain or None, **attrs))
        return outs if n_out > 1 else outs[0]

    def init(self, name: str, array: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def init_raw(self, name: str, data_type: int, dims: list[int], raw: bytes) -> str:
        """An initializer from its bytes as ONNX lays them out (packed 4-bit types: two per byte, low nibble first)."""
        self.inits.append(helper.make_tensor(name, data_type, dims, raw, raw=True))
        return name

    def const_i64(self, name: str, values) -> str:
        """An int64 constant; asked again under the same name (with the same values), the one already made."""
        vals = [int(v) for v in np.ravel(values)]
        if name in self._consts:
            if self._consts[name] != vals:
                raise ValueError(f"constant {name!r} already holds {self._consts[name]}, not {vals}")
            return name
        self._consts[name] = vals
        return self.init(name, np.asarray(values, dtype=np.int64))

    def model(self, inputs: list[Tensor], outputs: list[Tensor], opset: int) -> onnx.ModelProto:
        def vi(t: Tensor):
            return helper.make_tensor_value_info(t.name, DTYPES[t.dtype], list(t.shape))

        g = helper.make_graph(
            self.nodes, self.name, [vi(t) for t in inputs], [vi(t) for t in outputs], initializer=self.inits
        )
        imports = [helper.make_opsetid("", opset)] + ([helper.make_opsetid(MS, 1)] if self.uses_ms else [])
        m = helper.make_model(g, opset_imports=imports, producer_name="speechrt")
        m.ir_version = min(m.ir_version, 10)  # what onnxruntime >= 1.17 reads
        return m


def save(model: onnx.ModelProto, path) -> None:
    """Write a graph; weights go to a side file when the graph would pass protobuf's 2 GB limit."""
    if model.ByteSize() > (1 << 31) - (1 << 26):
        onnx.save_model(model, str(path), save_as_external_data=True, location=f"{path.name}.data")
    else:
        onnx.save_model(model, str(path))


ALIGN = 4096  # offsets of tensors in a shared weight file: page-aligned, which ONNX Runtime can map in place


def save_shared(models: dict, data_name: str, min_bytes: int = 1024) -> None:
    """Write graphs {path: ModelProto} (one directory) whose initializers of `min_bytes` or more live in one side
    file `data_name` beside them, each distinct content once: the same bytes in several graphs, or under
    another name, point at one place in the file (ONNX external data: location, offset, length)."""
    where: dict[bytes, tuple[int, int]] = {}
    paths = [Path(p) for p in models]
    with open(paths[0].parent / data_name, "wb") as f:
        for path, model in zip(paths, models.values()):
            for t in model.graph.initializer:
                raw = t.raw_data
                if len(raw) < min_bytes:
                    continue
                if raw not in where:
                    f.write(bytes(-f.tell() % ALIGN))
                    where[raw] = (f.tell(), len(raw))
                    f.write(raw)
                offset, length = where[raw]
                external_data_helper.set_external_data(t, data_name, offset, length)
                t.ClearField("raw_data")
            onnx.save_model(model, str(path))
