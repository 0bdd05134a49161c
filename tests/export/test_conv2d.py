"""export/conv2d.py: 1-D convolutions run as 2-D ones of height 1 compute what they computed, on fresh random
graphs with every attribute the VITS graphs use (padding, dilation, groups, stride, transposed, a shared
weight), and leave alone what they cannot rewrite."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from speechrt.export.conv2d import convs_as_2d


def _graph(rng, cin: int, shared_weight_input: bool = False) -> onnx.ModelProto:
    inits, nodes = [], []

    def w(*shape):
        return numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32) * 0.2, f"w{len(inits)}")

    def conv(x, t, **attrs):
        inits.append(t)
        b = numpy_helper.from_array(rng.standard_normal(t.dims[0]).astype(np.float32), f"b{len(inits)}")
        inits.append(b)
        y = f"y{len(nodes)}"
        nodes.append(helper.make_node("Conv", [x, t.name, b.name], [y], **attrs))
        return y

    h = conv("x", w(16, cin, 5), pads=[2, 2], dilations=[1])
    h2 = f"r{len(nodes)}"
    nodes.append(helper.make_node("LeakyRelu", [h], [h2], alpha=0.1))
    h = conv(h2, w(16, 4, 3), pads=[3, 3], dilations=[3], group=4)  # grouped, dilated
    shared = w(16, 16, 1)
    inits.append(shared)
    a, b = "s0", "s1"
    nodes.append(helper.make_node("Conv", [h, shared.name], [a]))  # one weight, two nodes
    nodes.append(helper.make_node("Conv", [a, shared.name], [b]))
    up = w(16, 8, 6)
    inits.append(up)
    nodes.append(helper.make_node("ConvTranspose", [b, up.name], ["u"], strides=[3], pads=[1, 2], output_padding=[1]))
    nodes.append(helper.make_node("Tanh", ["u"], ["t"]))
    ins = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, cin, "T"])]
    if shared_weight_input:  # a weight given at run time cannot be rewritten
        ins.append(helper.make_tensor_value_info("wx", TensorProto.FLOAT, [8, 8, 3]))
        nodes.append(helper.make_node("Conv", ["t", "wx"], ["y"], pads=[1, 1]))
    else:
        nodes.append(helper.make_node("Identity", ["t"], ["y"]))
    g = helper.make_graph(
        nodes, "g", ins, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, "S"])], initializer=inits
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def _run(m, feeds):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1  # the NCHWc path the rewrite is for
    return ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)[0]


@pytest.mark.parametrize("T", [1, 7, 64, 333])
def test_2d_convs_compute_the_same(T):
    rng = np.random.default_rng(T)
    m = _graph(rng, 12)
    m2 = convs_as_2d(m)
    onnx.checker.check_model(m2)
    convs = [n for n in m2.graph.node if n.op_type in ("Conv", "ConvTranspose")]
    weights = {t.name: t for t in m2.graph.initializer}
    assert len(convs) == 5 and all(len(weights[n.input[1]].dims) == 4 for n in convs)
    assert [n.op_type for n in m2.graph.node].count("Unsqueeze") == 5
    assert all(len(t.dims) == 3 for t in m.graph.initializer if t.name.startswith("w"))  # the input is untouched
    x = rng.standard_normal((1, 12, T)).astype(np.float32)
    ref, out = _run(m, {"x": x}), _run(m2, {"x": x})
    assert out.shape == ref.shape and np.isfinite(out).all()
    assert np.abs(out - ref).max() <= 1e-5 * max(1.0, np.abs(ref).max())


def test_what_cannot_be_rewritten_is_left():
    rng = np.random.default_rng(0)
    m = _graph(rng, 4, shared_weight_input=True)
    m2 = convs_as_2d(m)
    last = m2.graph.node[-1]
    assert last.op_type == "Conv" and last.input[1] == "wx"  # its weight is an input: still 1-D
    x = rng.standard_normal((1, 4, 50)).astype(np.float32)
    wx = rng.standard_normal((8, 8, 3)).astype(np.float32)
    np.testing.assert_allclose(_run(m2, {"x": x, "wx": wx}), _run(m, {"x": x, "wx": wx}), rtol=1e-5, atol=1e-5)
    plain = helper.make_model(
        helper.make_graph(
            [helper.make_node("Relu", ["x"], ["y"])],
            "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 3])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 3])],
        )
    )
    assert convs_as_2d(plain).graph == plain.graph  # no convolution: nothing added
