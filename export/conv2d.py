"""1-D convolutions rewritten as 2-D ones of height 1, for ONNX Runtime's CPU provider.

ONNX Runtime runs a 1-D `Conv` as im2col + GEMM; a 2-D one goes through its NCHWc layout transformer
(MLAS's blocked direct convolutions). Measured on the VITS graphs at one intra-op thread (AMD EPYC, AVX2;
the TTS runner's workers run one thread each): generator 123 -> 107 ms (200 frames), flow 115 -> 108 ms
(790 frames), text encoder 73 -> 69 ms (375 phonemes), outputs within 2e-6; at two threads neither form
is faster. Each convolution becomes Unsqueeze -> Conv (2-D) -> Squeeze, so the rest of the graph keeps its
ranks and any graph can take the rewrite."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

CONVS = ("Conv", "ConvTranspose")
# a 1-D attribute -> its 2-D form (a leading height entry)
_ATTR = {
    "kernel_shape": lambda v: [1] + v,
    "strides": lambda v: [1] + v,
    "dilations": lambda v: [1] + v,
    "output_padding": lambda v: [0] + v,
    "pads": lambda v: [0, v[0], 0, v[1]],
}
AXIS = "speechrt/height_axis"


def convs_as_2d(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `model` computing the same function, each 1-D convolution whose weight is an initializer
    run as a 2-D one on its input unsqueezed to [B, C, 1, T]; tensor names and shapes outside the rewritten
    nodes stay as they were."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    inits = {t.name: t for t in g.initializer}
    nodes, widened = [], set()  # widened: weights already made 4-D (a weight may serve several nodes)
    for n in g.node:
        w = inits.get(n.input[1]) if n.op_type in CONVS and len(n.input) > 1 else None
        if w is None or (len(w.dims) != 3 and w.name not in widened):
            nodes.append(n)
            continue
        if w.name not in widened:
            w.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(w)[:, :, None, :], w.name))
            widened.add(w.name)
        for a in n.attribute:
            if a.name in _ATTR:
                a.ints[:] = _ATTR[a.name](list(a.ints))
        x, y = n.input[0], n.output[0]
        n.input[0], n.output[0] = f"{y}/in_2d", f"{y}/out_2d"  # output names are unique, node names may not be
        nodes += [
            helper.make_node("Unsqueeze", [x, AXIS], [n.input[0]], name=f"{y}/unsqueeze"),
            n,
            helper.make_node("Squeeze", [n.output[0], AXIS], [y], name=f"{y}/squeeze"),
        ]
    if widened:
        g.initializer.append(numpy_helper.from_array(np.array([2], np.int64), AXIS))
        del g.node[:]
        g.node.extend(nodes)
    return out
