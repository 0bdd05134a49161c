"""The architectures beyond the Llama graph on the language-model backends other than the torch runner (which
tests/models/test_architectures.py checks against transformers): the onnxruntime runner of the exported 'ort'
graph and the 'standard' graph (what TensorRT parses) run on ONNX Runtime, the CPU int4 kernel
(kernels/cpu_decode.c), and the triton backend's runner with the Triton kernels (through the Triton interpreter
here on the CPU). Each on the tiny random-weight models of tests/lm_archs.py, against transformers or, for the
int4 kernel, against float32 on the same 4-bit weights.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

pytest.importorskip("transformers", reason="the comparison peer: pip install 'speechrt[peers]'")
pytest.importorskip("gguf")

from lm_archs import ARCHS, VOCAB, byte_bpe, hf_logits, written  # noqa: E402 - tests/lm_archs.py

from speechrt import backends  # noqa: E402
from speechrt.backends.torch import lm as torch_lm  # noqa: E402
from speechrt.models import registry  # noqa: E402

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def bpe():
    return byte_bpe()


@pytest.fixture(scope="module", params=list(ARCHS))
def arch(request, tmp_path_factory, bpe):
    """(name, transformers model, the resolved speechrt model of its folder)."""
    name = request.param
    model, d = written(name, tmp_path_factory, bpe)
    return name, model, registry.resolve(str(d), "lm")


def _ids(seed: int, n: int = 16) -> list[int]:
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _runner_logits(runner, ids: list[int], prompt_len: int) -> torch.Tensor:
    """The last prompt position's logits, then those of decode steps fed the rest of `ids` one by one."""
    with torch.inference_mode():
        cache = runner.new_cache(1, 32)
        out = [runner.prefill(cache, 0, torch.tensor(ids[:prompt_len])).reshape(-1)]
        for t in ids[prompt_len:-1]:
            out.append(runner.decode_step(cache, [0], torch.tensor([t])).reshape(-1))
    return torch.stack([o.float().cpu() for o in out])


def test_onnxruntime_runner_equals_transformers(arch):
    """The exported 'ort' graph (float32: GroupQueryAttention with its rotary; Q/K/V biases added before it, Q/K
    head norms with Q, K and V apart) over the runner's slot cache: the prompt's and 4 decode steps' logits."""
    pytest.importorskip("onnxruntime")
    name, model, rm = arch
    runner = backends.get("onnxruntime").lm(rm, dtype="float32")
    assert runner.config.qkv_bias == (name == "qwen2") and runner.config.qk_norm == (name in ("qwen3", "gemma3"))
    ids = _ids(3)
    ref = hf_logits(model, ids)[11:-1]
    torch.testing.assert_close(_runner_logits(runner, ids, 12), ref, rtol=1e-4, atol=5e-5)


def test_standard_graph_equals_transformers(arch, tmp_path):
    """The 'standard' graph (plain ONNX ops, what the tensorrt backend builds engines from), run on ONNX
    Runtime's CPU provider: a prompt's logits from an empty cache."""
    ort = pytest.importorskip("onnxruntime")
    from speechrt.export.graph_builder import save
    from speechrt.export.llama_onnx import LlamaGraph

    name, model, rm = arch
    f = torch_lm.load_file(rm)
    cfg = f.config
    save(LlamaGraph(cfg, f.weights, f.q4, "fp32", "standard").build(17), tmp_path / "m.onnx")
    sess = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    ids = _ids(4, 10)
    T = len(ids)
    feed = {
        "input_ids": np.array([ids], np.int64),
        "position_ids": np.arange(T, dtype=np.int64)[None],
        "attention_bias": np.triu(np.full((T, T), -1e9, np.float32), 1)[None, None],
    }
    if cfg.sliding_layers:  # Gemma 3: its sliding-window layers' bias, the keys before each window masked too
        j, q = np.arange(T)[None], np.arange(T)[:, None]
        feed["attention_bias_local"] = np.where((j <= q) & (j > q - cfg.sliding_window), 0, -1e9)[None, None]
        feed["attention_bias_local"] = feed["attention_bias_local"].astype(np.float32)
    for i in range(cfg.n_layers):
        for kind in ("key", "value"):
            feed[f"past_{kind}.{i}"] = np.zeros((1, cfg.n_kv_heads, 0, cfg.head_dim), np.float32)
    logits = torch.from_numpy(sess.run(["logits"], feed)[0][0])
    torch.testing.assert_close(logits, hf_logits(model, ids)[-1], rtol=1e-4, atol=5e-5)


def test_cpu_int4_kernel_equals_float32_on_its_weights(arch):
    """kernels/cpu_decode.c (the torch backend's int4 on AVX2 CPUs) runs every architecture here, biases and
    head norms included: its logits are those of the float32 model on the same 4-bit weights, up to its int8
    activations (prompts in two int8 terms: close; decode steps in one: random weights, less smooth than a
    trained model's, make them a few percent apart)."""
    from speechrt.backends.torch.cpu_lm import CpuInt4LMRunner, unavailable
    from speechrt.models.llama_layers import quantize_int4

    name, model, rm = arch
    f = torch_lm.load_file(rm)
    why = unavailable(f.config)
    if why:
        pytest.skip(f"the CPU int4 kernel does not run here: {why}")
    runner = torch_lm.build(rm, CPU, "int4")
    assert isinstance(runner, CpuInt4LMRunner)
    deq = dict(f.weights)
    for n in [k for k in f.weights if k.rsplit(".", 1)[-1] in ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")]:
        q, s, z = quantize_int4(f.weights[n])
        N, K = q.shape
        deq[n] = ((q.float().view(N, -1, 32) - 8) * s[..., None] + z[..., None]).view(N, K)
    ref_runner = torch_lm.TorchLMRunner(dataclasses.replace(f, weights=deq), CPU, "float32")
    ids = _ids(5)
    got, ref = _runner_logits(runner, ids, 12), _runner_logits(ref_runner, ids, 12)
    err = ((got - ref).abs().amax(-1) / ref.abs().amax(-1)).tolist()
    # measured here: 0.005 for the prompt, 0.01-0.045 for the steps, alike on every architecture; without the
    # Q/K/V biases (Qwen2) or the head norms (Qwen3) the float32 model itself is 0.2-0.8 away
    assert err[0] < 1e-2 and max(err) < 8e-2, err


def test_triton_kernels_equal_transformers(arch, one_cpu_thread, monkeypatch):
    """The triton backend's runner (decode steps on static buffers, as its CUDA graphs replay them) built with
    the Triton kernel set, the kernels run by the Triton interpreter on the CPU (on a GPU they are compiled):
    the same logits as transformers."""
    pytest.importorskip("triton")
    from speechrt.backends.triton.lm import TritonLMRunner

    name, model, rm = arch
    if name not in ("qwen2", "qwen3", "gemma3"):
        pytest.skip("the triton runner of the plain Llama graph is tested in tests/backends/test_triton_lm_graphs.py")
    from triton.runtime.interpreter import InterpretedFunction

    from speechrt.kernels import triton_norm

    if not isinstance(triton_norm._rms_norm_kernel, InterpretedFunction):  # (tests/conftest.py imports them so)
        pytest.skip("the Triton kernels were compiled for a GPU in this process, not interpreted")
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # what kernels.select('triton', 'cpu') asks for
    runner = TritonLMRunner(torch_lm.load_file(rm), CPU, "float32", "triton", capture=False)
    assert runner.ops.sources["rms_norm"] == "triton" and runner.ops.sources["attention"] == "triton"
    ids = _ids(6, 10)
    ref = hf_logits(model, ids)[7:-1]
    torch.testing.assert_close(_runner_logits(runner, ids, 8), ref, rtol=1e-3, atol=1e-3)


def _greedy_rows(runner, cache, last: torch.Tensor, steps: int):
    """`steps` greedy decode steps of the slots 0..n-1 of `cache` at once, the first fed the argmax of `last`
    [n, vocab]: (ids [steps, n], logits [steps, n, vocab])."""
    ids, logits = [], []
    with torch.inference_mode():
        for _ in range(steps):
            tok = last.float().argmax(-1)
            last = runner.decode_step(cache, list(range(last.shape[0])), tok)
            ids.append(tok)
            logits.append(last.float().cpu())
    return torch.stack(ids), torch.stack(logits)


def test_fused_decode_steps_equal_the_torch_backend(arch, one_cpu_thread, monkeypatch):
    """The triton runner's decode steps in the fused layer kernels (kernels/triton_fused.py, the default where
    the model allows: Q/K/V biases and per-head norms included), run by the Triton interpreter, over three
    sequences at once: the same greedy ids as the torch backend's unfused steps, and the same logits."""
    pytest.importorskip("triton")
    from triton.runtime.interpreter import InterpretedFunction

    from speechrt.backends.triton.lm import TritonLMRunner
    from speechrt.kernels import triton_fused
    from speechrt.models.llama_fused import decode_range_fused

    name, _, rm = arch
    if name not in ("qwen2", "qwen3", "llama3"):
        pytest.skip("the fused step's math is that of llama3 for these (a sliding window wider than the test)")
    if not isinstance(triton_fused._norm_qkv_rope_kernel, InterpretedFunction):
        pytest.skip("the Triton kernels were compiled for a GPU in this process, not interpreted")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    f = torch_lm.load_file(rm)
    fused = TritonLMRunner(f, CPU, "float32", "triton", capture=False)
    assert fused.fused_why is None, fused.fused_why
    assert "off by request" in TritonLMRunner(f, CPU, "float32", "triton", capture=False, fused=False).fused_why
    plain = torch_lm.TorchLMRunner(f, CPU, "float32")
    want_cache = plain.new_cache(3, 32)
    with torch.inference_mode():  # the prompts by the torch runner (lean: prefill is not what is tested here)
        last = torch.stack([plain.prefill(want_cache, s, torch.tensor(_ids(7 + s, 2 + 3 * s))) for s in range(3)])
    got_cache = fused.new_cache(3, 32)
    got_cache.k.copy_(want_cache.k), got_cache.v.copy_(want_cache.v)
    got_cache.lengths[:] = want_cache.lengths
    got_ids, got = _greedy_rows(fused, got_cache, last, 3)
    want_ids, want = _greedy_rows(plain, want_cache, last, 3)
    assert torch.equal(got_ids, want_ids)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4 * want.abs().max().item())
    assert fused.decode_range.func is decode_range_fused and len(fused.graphs) == 1  # the steps took that path


# the quantized format each architecture's fused step is checked with (int4 where the head norms meet 4-bit groups)
QUANT_FORMAT = {"llama3": "int4", "qwen2": "fp8", "qwen3": "int4"}


def test_fused_quantized_decode_steps_equal_the_unfused_ones(arch, one_cpu_thread, monkeypatch):
    """With int4 (W4A16 groups of 32) or fp8 (E4M3) weights the triton runner's decode steps run in the quantized
    fused kernels (kernels/triton_fused_quant.py, the weights dequantized in their K loops), Q/K/V biases and head
    norms included. A step of three sequences (one empty) fed the same tokens: the logits of the runner's unfused
    quantized step (fused=False) within bf16's rounding of the step (measured 1-3 % of the largest logit, as the
    float bf16 model's fused step), the same greedy ids where they are not near ties, and the keys and values."""
    pytest.importorskip("triton")
    from triton.runtime.interpreter import InterpretedFunction

    from speechrt.backends.triton.lm import TritonLMRunner
    from speechrt.kernels import triton_fused_quant
    from speechrt.models.llama_fused import decode_range_fused

    name, _, rm = arch
    if name not in QUANT_FORMAT:
        pytest.skip("the fused step's math is that of llama3 for these (a sliding window wider than the test)")
    if not isinstance(triton_fused_quant._norm_qkv_rope_q_kernel, InterpretedFunction):
        pytest.skip("the Triton kernels were compiled for a GPU in this process, not interpreted")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    f, fmt = torch_lm.load_file(rm), QUANT_FORMAT[name]
    fused = TritonLMRunner(f, CPU, fmt, "triton", capture=False)
    assert fused.fused_why is None, fused.fused_why
    assert fused.decode_range.func is decode_range_fused and fused.decode_range.args[1] is triton_fused_quant.OPS
    plain = TritonLMRunner(f, CPU, fmt, "triton", capture=False, fused=False)
    want_cache, got_cache = plain.new_cache(3, 16), fused.new_cache(3, 16)
    g = torch.Generator().manual_seed(0)  # held keys and values: random (lean: prefill is not what is tested here)
    for c in (want_cache, got_cache):
        c.k.copy_(torch.randn(c.k.shape, generator=g.manual_seed(0)))
        c.v.copy_(torch.randn(c.v.shape, generator=g))
        c.lengths[:] = [5, 0, 11]
    tok = torch.tensor(_ids(3, 3))
    with torch.inference_mode():
        got = fused.decode_step(got_cache, [0, 1, 2], tok).float()
        want = plain.decode_step(want_cache, [0, 1, 2], tok).float()
    bound = 5e-2 * want.abs().max().item()
    torch.testing.assert_close(got, want, rtol=0, atol=bound)
    top2 = want.topk(2, dim=-1).values
    clear = top2[:, 0] - top2[:, 1] > 2 * bound
    assert torch.equal(got.argmax(-1)[clear], want.argmax(-1)[clear])
    # the keys and values written: layer 0's from the same input (bf16's tolerance), the next layers' as the logits
    for c, w in ((got_cache.k, want_cache.k), (got_cache.v, want_cache.v)):
        torch.testing.assert_close(c[0].float(), w[0].float(), rtol=2e-2, atol=2e-2)
        torch.testing.assert_close(c.float(), w.float(), rtol=0, atol=5e-2 * w.abs().max().item())
    assert len(fused.graphs) == 1 and got_cache.lengths == want_cache.lengths == [6, 1, 12]  # the graph's path
