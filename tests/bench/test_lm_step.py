"""benchmarks.lm_step's accounting of the bytes a decode step reads, on a small graph built here."""

import re

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from benchmarks.lm_step import BareStep, node_counts, step_bytes


def _graph(tied: bool):
    rng = np.random.default_rng(0)
    K, N, V = 32, 8, 16
    inits = {
        "emb": rng.standard_normal((V, K)).astype(np.float32),  # read one row per token: 128 bytes
        "norm.w": np.ones(K, np.float32),  # other: 128
        "lin.q": rng.integers(0, 256, (N, 1, 16), dtype=np.uint8),  # block weights: 128 + scales 32
        "lin.s": np.ones(N, np.float32),
        "corr.w": rng.standard_normal((N, N)).astype(np.float32),  # dense: 256
        "head.q": rng.integers(0, 256, (V, 1, 16), dtype=np.uint8),  # head: 256 + scales 64
        "head.s": np.ones(V, np.float32),
    }
    nodes = [
        helper.make_node("Gather", ["head.q" if tied else "emb", "ids"], ["x0"]),
        helper.make_node("SimplifiedLayerNormalization", ["x0", "norm.w"], ["x1"]),
        helper.make_node(
            "MatMulNBits", ["x1", "lin.q", "lin.s"], ["y"], domain="com.microsoft", K=K, N=N, bits=4, block_size=32
        ),
        helper.make_node("MatMul", ["y", "corr.w"], ["y2"]),
        helper.make_node(
            "MatMulNBits",
            ["x1", "head.q", "head.s"],
            ["logits"],
            domain="com.microsoft",
            K=K,
            N=V,
            bits=4,
            block_size=32,
        ),
    ]
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 1])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 1, V])],
        [numpy_helper.from_array(v, k) for k, v in inits.items() if tied is False or k != "emb"],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])


def test_step_bytes_by_reader():
    b = step_bytes(_graph(tied=False))
    assert b == {"head": 256 + 64, "block weights": 128 + 32, "dense weights": 256, "embedding row": 128, "other": 128}
    assert node_counts(_graph(False))["MatMulNBits"] == 2


def test_a_tied_table_counts_once_as_the_head():
    b = step_bytes(_graph(tied=True))  # the embedding reads the head's blocks: counted with the head, not per row
    assert b["head"] == 256 + 64 and b["embedding row"] == 0


def test_bare_step_names_what_it_does_not_know(tmp_path):
    import onnx

    p = tmp_path / "g.onnx"
    onnx.save(_graph(False), str(p))
    with pytest.raises(ValueError, match="not a decode graph"):
        BareStep(p, 1, past=4)


def test_bare_steps_of_our_export(capsys):
    """Our int4 export's decode graph: steps run with every cache bound in place, the logits come out finite,
    and the table names the Q4_1 correction's dense bytes beside the blocks and the head."""
    from benchmarks.lm_step import main
    from speechrt.export import Manifest, cached_export
    from speechrt.models.registry import resolve

    d = cached_export("lm", resolve(None, "lm"), "int4")
    path = d / Manifest.read(d).graph("model").file
    s = BareStep(path, 1, past=7)
    assert s.run(2) > 0
    assert np.isfinite(s.logits).all() and s.logits.std() > 0
    main(["--graph", str(path), "--threads", "1", "--rounds", "1", "--steps", "2"])
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("model "))
    mib = {k: float(v) for k, v in re.findall(r"(head|block weights|dense weights) ([\d.]+)", row)}
    # SmolLM2-135M: 4-bit blocks with their scales, the Q4_1 minimum as float [blocks, N] per linear (a 32nd of
    # the weights in float32), the Q8_0 head at 8 bits with a scale per block
    assert 60 < mib["block weights"] < 66 and 12 < mib["dense weights"] < 13.5 and 30 < mib["head"] < 32, row


def test_graphs_named_by_folder_where_stems_repeat(tmp_path):
    from benchmarks.lm_step import graph_names

    a, b, c = tmp_path / "ours" / "model.onnx", tmp_path / "genai" / "model.onnx", tmp_path / "x.onnx"
    assert graph_names([a, b, c]) == {"ours": a, "genai": b, "x": c}


def test_kernel_step_bytes():
    """The AVX2 kernel's step reads the GGUF's own blocks: 5 bits a weight in the layers (as genai's graph), the
    Q8_0 head at 8.5 bits, nothing dense; its steps run."""
    from benchmarks.lm_step import KernelStep
    from speechrt.kernels.cpu_decode import unavailable

    if unavailable():
        pytest.skip(f"the CPU int4 kernel does not run here: {unavailable()}")
    k = KernelStep("smollm2-135m-instruct", 1, past=7)
    mib = {n: b / 2**20 for n, b in k.bytes.items()}
    assert 63 < mib["block weights"] < 64 and 28 < mib["head"] < 29.5 and mib["dense weights"] == 0
    assert k.run(2) > 0
