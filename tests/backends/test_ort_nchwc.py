"""The generator's NCHWc islands joined (backends/onnxruntime/nchwc.py): the joined graph must compute what ONNX
Runtime's own optimized graph computes, on the exported voice and on a small graph with the cases the rewrite must
leave alone (a mask broadcast over channels, a speaker's conditioning broadcast over time, a channel count that is not
a multiple of 16), at odd lengths; a joined graph that computes something else is not used; and it must remove
reorders on whatever CPU the test runs on (blocks of 8 channels with AVX2, 16 with AVX-512)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from speechrt import backends
from speechrt.backends.onnxruntime.nchwc import join_islands, joined_session, optimized
from speechrt.backends.onnxruntime.providers import session
from speechrt.models.registry import resolve

CPU = ["CPUExecutionProvider"]


def _same(path, joined_sess, feeds):
    stock = session(str(path), CPU, 1)
    for feed in feeds:
        a, b = stock.run(None, feed)[0], joined_sess.run(None, feed)[0]
        assert a.shape == b.shape and np.isfinite(b).all()
        assert np.abs(a - b).max() <= 1e-6 * max(1.0, float(np.abs(a).max())), feed


def test_the_voices_generator_joined_gives_the_same_audio():
    m = resolve("piper-en_US-joe-medium", "tts")
    runner = backends.get("onnxruntime").tts(m, device="cpu")
    ort_vits = runner.model
    path = ort_vits.files["generator"]
    stock = optimized(path)
    if not any(n.op_type == "ReorderOutput" for n in stock.graph.node):
        pytest.skip("ONNX Runtime has no blocked (NCHWc) convolutions on this CPU: nothing to join")
    _, removed = join_islands(stock)
    assert removed >= 20 and ort_vits.reorders_removed == removed  # 34 reorders -> 8 (AVX2 and AVX-512 alike)
    rng = np.random.default_rng()
    _same(
        path,
        ort_vits.sessions["generator"],
        [{"z": rng.standard_normal((1, 192, f), dtype=np.float32)} for f in (1, 7, 27, 133)],
    )


def _small_graph(path):
    """z [1, 16, T], g [1, 8, 1] and mask [1, 1, T]: conv (32) + conv (32) of g (a broadcast over time, as a
    speaker's conditioning is: must stay plain) -> LeakyRelu -> conv (32) + the first conv's output, / 3,
    * mask (a broadcast over channels: must stay plain), -> transposed conv (32 -> 16, stride 2) -> + conv (16)
    of LeakyRelu of it -> conv to 24 channels (no 16-multiple: its LeakyRelu stays plain) -> conv to 16 -> Tanh."""
    rng = np.random.default_rng(0)
    inits, nodes = (
        [
            numpy_helper.from_array(np.array([2], np.int64), "axis"),
            numpy_helper.from_array(np.array(3.0, np.float32), "three"),
        ],
        [],
    )

    def conv(x, cin, cout, out, k=3, dil=1, transposed=False, stride=1):
        w = (rng.standard_normal((cin, cout, 1, k) if transposed else (cout, cin, 1, k)) * 0.2).astype(np.float32)
        inits.extend(
            [
                numpy_helper.from_array(w, f"{out}.w"),
                numpy_helper.from_array(rng.standard_normal(cout).astype(np.float32) * 0.1, f"{out}.b"),
            ]
        )
        pad = dil * (k - 1) // 2
        nodes.append(helper.make_node("Unsqueeze", [x, "axis"], [f"{out}.4d"]))
        if transposed:
            nodes.append(
                helper.make_node(
                    "ConvTranspose",
                    [f"{out}.4d", f"{out}.w", f"{out}.b"],
                    [f"{out}.o4d"],
                    kernel_shape=[1, k],
                    strides=[1, stride],
                    pads=[0, (k - stride) // 2] * 2,
                )
            )
        else:
            nodes.append(
                helper.make_node(
                    "Conv",
                    [f"{out}.4d", f"{out}.w", f"{out}.b"],
                    [f"{out}.o4d"],
                    kernel_shape=[1, k],
                    dilations=[1, dil],
                    pads=[0, pad, 0, pad],
                )
            )
        nodes.append(helper.make_node("Squeeze", [f"{out}.o4d", "axis"], [out]))
        return out

    def op(kind, ins, out, **kw):
        nodes.append(helper.make_node(kind, ins, [out], **kw))
        return out

    a = op("Add", [conv("z", 16, 32, "a0"), conv("g", 8, 32, "cond", k=1)], "a")
    b = conv(op("LeakyRelu", [a], "a.act", alpha=0.1), 32, 32, "b", dil=3)
    s = op("Div", [op("Add", [b, a], "ab"), "three"], "avg")
    up = conv(op("Mul", [s, "mask"], "masked"), 32, 16, "up", k=4, transposed=True, stride=2)
    r = op("Add", [up, conv(op("LeakyRelu", [up], "up.act", alpha=0.1), 16, 16, "c", k=5)], "res")
    odd = conv(r, 16, 24, "odd")
    y = op("Tanh", [conv(op("LeakyRelu", [odd], "odd.act", alpha=0.1), 24, 16, "post")], "y")
    g = helper.make_graph(
        nodes,
        "small",
        [
            helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 16, "T"]),
            helper.make_tensor_value_info("g", TensorProto.FLOAT, [1, 8, 1]),
            helper.make_tensor_value_info("mask", TensorProto.FLOAT, [1, 1, "T"]),
        ],
        [helper.make_tensor_value_info(y, TensorProto.FLOAT, None)],
        inits,
    )
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)


def test_a_small_graph_joined_computes_the_same(tmp_path):
    path = tmp_path / "small.onnx"
    _small_graph(path)
    stock = optimized(path)
    if not any(n.op_type == "ReorderOutput" for n in stock.graph.node):
        pytest.skip("ONNX Runtime has no blocked (NCHWc) convolutions on this CPU: nothing to join")
    joined, removed = join_islands(stock)
    assert removed > 0
    ops = [n.op_type for n in joined.graph.node]
    # the broadcasts stay plain: the mask's Mul has no twin, and the Add of g's conditioning is the original
    assert ops.count("Mul") == 1 and any(n.op_type == "Add" and list(n.output) == ["a"] for n in joined.graph.node)
    rng = np.random.default_rng()
    feeds = [
        {
            "z": rng.standard_normal((1, 16, t), dtype=np.float32),
            "g": rng.standard_normal((1, 8, 1), dtype=np.float32),
            "mask": (rng.random((1, 1, t)) > 0.3).astype(np.float32),
        }
        for t in (1, 5, 33, 100)
    ]
    _same(path, session(joined.SerializeToString(), CPU, 1, optimized=True), feeds)
    _same(path, joined_session(path, CPU, 1)[0], feeds)


def test_other_providers_get_the_graph_as_it_is(monkeypatch):
    """The blocked layout is the CPU provider's: with any other provider in the list nothing is rewritten."""
    import speechrt.backends.onnxruntime.providers as ob

    seen = []
    monkeypatch.setattr(ob, "session", lambda data, providers, threads, **kw: seen.append((data, kw)) or "s")
    assert joined_session("g.onnx", ["CUDAExecutionProvider", "CPUExecutionProvider"], 1) == ("s", 0)
    assert seen == [("g.onnx", {})]


def test_a_misread_graph_falls_back_to_the_stock_one(tmp_path, monkeypatch, caplog):
    """The joined graph is checked against the stock one at load: one that computes something else (here its
    Tanh made a Sigmoid, as a misread broadcast would change the numbers) is not used."""
    import speechrt.backends.onnxruntime.nchwc as nchwc

    path = tmp_path / "small.onnx"
    _small_graph(path)
    real = nchwc.join_islands

    def misread(model):
        joined, removed = real(model)
        for n in joined.graph.node:
            if n.op_type == "Tanh":
                n.op_type = "Sigmoid"
        return joined, max(removed, 1)

    monkeypatch.setattr(nchwc, "join_islands", misread)
    sess, removed = joined_session(path, CPU, 1)
    assert removed == 0 and "running the stock graph" in caplog.text
    stock = session(str(path), CPU, 1)
    assert nchwc.disagreement(stock, sess) == 0.0


def test_a_graph_that_cannot_be_optimized_runs_as_it_is(tmp_path, monkeypatch, caplog):
    """The rewrite is an optimization: where the optimized graph cannot be made (here no temporary directory
    to write it to), the session runs the graph as it is, with a warning."""
    import tempfile

    path = tmp_path / "small.onnx"
    _small_graph(path)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "missing"))
    sess, removed = joined_session(path, CPU, 1)
    assert removed == 0 and "not joining the NCHWc islands" in caplog.text
    _same(
        path,
        sess,
        [
            {
                "z": np.ones((1, 16, 9), np.float32),
                "g": np.ones((1, 8, 1), np.float32),
                "mask": np.ones((1, 1, 9), np.float32),
            }
        ],
    )


def _feeds(t=9):
    rng = np.random.default_rng(1)
    return [
        {
            "z": rng.standard_normal((1, 16, t), dtype=np.float32),
            "g": rng.standard_normal((1, 8, 1), dtype=np.float32),
            "mask": np.ones((1, 1, t), np.float32),
        }
    ]


def test_the_joined_graph_is_cached_per_onnxruntime_version_and_cpu(tmp_path, monkeypatch):
    """A warm start makes no stock session and no rewrite: the joined graph made the first time is kept in
    speechrt's cache and loaded as it is; another ONNX Runtime version (or CPU) is another key, joined again."""
    import onnxruntime

    import speechrt.backends.onnxruntime.nchwc as nchwc

    monkeypatch.setenv("SPEECHRT_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "small.onnx"
    _small_graph(path)
    _, removed = joined_session(path, CPU, 1)
    if removed == 0:
        pytest.skip("ONNX Runtime has no blocked (NCHWc) convolutions on this CPU: nothing to join or cache")
    kept = sorted((tmp_path / "cache" / "onnx-joined").glob("*.onnx"))
    assert len(kept) == 1
    real, made = nchwc.optimized_session, []
    monkeypatch.setattr(nchwc, "optimized_session", lambda *a, **kw: made.append(a) or real(*a, **kw))
    sess, again = joined_session(path, CPU, 1)
    assert again == removed and made == []
    _same(path, sess, _feeds())
    monkeypatch.setattr(onnxruntime, "__version__", onnxruntime.__version__ + "-other")
    assert joined_session(path, CPU, 1)[1] == removed and len(made) == 1
    assert len(list((tmp_path / "cache" / "onnx-joined").glob("*.onnx"))) == 2


def test_a_broken_cache_entry_is_joined_again(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("SPEECHRT_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "small.onnx"
    _small_graph(path)
    if joined_session(path, CPU, 1)[1] == 0:
        pytest.skip("ONNX Runtime has no blocked (NCHWc) convolutions on this CPU: nothing to join or cache")
    (kept,) = (tmp_path / "cache" / "onnx-joined").glob("*.onnx")
    kept.write_bytes(b"not a graph")
    sess, removed = joined_session(path, CPU, 1)
    assert removed > 0 and "joining again" in caplog.text
    _same(path, sess, _feeds())
    assert kept.read_bytes() != b"not a graph"


def test_a_cached_joined_graph_loads_without_importing_onnx(tmp_path):
    """onnx (0.4 s to import on a 2-core VM) is imported only where a graph is joined, not on a warm start."""
    import os
    import subprocess
    import sys

    path = tmp_path / "small.onnx"
    _small_graph(path)
    code = (
        "import sys\n"
        "from speechrt.backends.onnxruntime.nchwc import joined_session\n"
        f"print(joined_session({str(path)!r}, ['CPUExecutionProvider'], 1)[1], 'onnx' in sys.modules)\n"
    )
    env = dict(os.environ, SPEECHRT_CACHE=str(tmp_path / "cache"))
    run = [subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True) for _ in range(2)]
    assert all(r.returncode == 0 for r in run), run[-1].stderr
    (first_removed, first_onnx), (removed, onnx_imported) = (r.stdout.split() for r in run)
    if first_removed == "0":
        pytest.skip("ONNX Runtime has no blocked (NCHWc) convolutions on this CPU: nothing to join or cache")
    assert first_onnx == "True"  # the first start joins the graph (the rewrite reads it with onnx)
    assert (removed, onnx_imported) == (first_removed, "False")


def test_the_voice_makes_each_session_once(monkeypatch):
    """The text graph's one session is the all-threads one (the voice used to make a one-thread session of it
    first, and drop it: a start paid for a session nothing ran)."""
    import speechrt.backends.onnxruntime.providers as ob

    real, seen = ob.session, []
    monkeypatch.setattr(ob, "session", lambda data, *a, **kw: seen.append(data) or real(data, *a, **kw))
    m = resolve("piper-en_US-joe-medium", "tts")
    ort_vits = backends.get("onnxruntime").tts(m, device="cpu").model
    assert seen.count(ort_vits.files["text"]) == 1
    assert seen.count(ort_vits.files["flow"]) == 2  # the windows' one-thread flow and the sentence start's wide one
