"""A small ONNX graph builder: nodes with generated output names, initializers from numpy, typed I/O from
manifest Tensors. Used by the exporters that write graphs op by op (Llama), where torch.onnx would leave
hundreds of shape ops between the ones that compute."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

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
