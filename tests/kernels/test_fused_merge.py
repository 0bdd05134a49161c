"""The fused decode-step ops' K splits added up in their own launch (kernels/triton_fused_parts.py: the last split of
each output tile sums every split's partials and runs the epilogue) against the second launch that did it before
(kernels/triton_fused_split.py's sum kernels), in the Triton interpreter: the same outputs bit for bit (the same sums
in the same order), one launch an op instead of two, every merge counter back to 0 after each launch, and a merge
by the wrong program caught. Against the references: test_triton_fused.py's split tests, which run the default (the
merge). The interpreter runs programs one at a time, so the memory ordering is the GPU check's (`speechrt bench gpu
--checks lm-fused`)."""

from __future__ import annotations

import pytest
import torch
from fused_cases import HKV, D, H, caches, qkv_case, quantized
from kernel_checks import DEVICE, LaunchTrace, mutant_module, rand

pytestmark = pytest.mark.usefixtures("interpret")
F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16


def run_ops(fmt, G, K, dtype) -> list[torch.Tensor]:
    """norm_qkv_rope (3 rows, the Qwen2 bias and Qwen3 head norms: Q and both caches), norm_gate_up and
    linear_residual (with a bias), K split as triton_fused_split decides -> their outputs."""
    from speechrt.kernels import triton_fused, triton_fused_quant

    ops = triton_fused if fmt == "float" else triton_fused_quant
    x, kw = qkv_case(3, dtype, True, True, seed=K, dim=K)
    if fmt != "float":
        kw["wqkv"], _ = quantized(fmt, G, (H + 2 * HKV) * D, K, seed=1)
    kc, vc = caches(dtype)
    q = ops.norm_qkv_rope(x, k_cache=kc, v_cache=vc, **kw)
    g = rand(K, dtype=dtype, seed=3, scale=0.5) + 1
    w = quantized(fmt, G, 90, K, seed=4)[0] if fmt != "float" else rand(90, K, dtype=dtype, seed=4, scale=K**-0.5)
    y = ops.norm_gate_up(x, g, 1e-5, w)
    r, b = rand(3, 90, dtype=dtype, seed=5), rand(90, dtype=dtype, seed=6)
    return [q, kc, vc, y, ops.linear_residual(x, w, r, b)]


def merged_equals_second_launch(monkeypatch, fmt, G, K, splits, dtype):
    """The ops with the merge in the launch (the default here: not ROCm) and with the second launch: equal outputs,
    one launch an op against two, the counters back to 0."""
    from speechrt.kernels import triton_decode_attention as dec
    from speechrt.kernels import triton_fused_split as fs

    launched = LaunchTrace(monkeypatch).launched
    monkeypatch.setattr(fs, "SPLITS", splits)
    assert fs.ONE_LAUNCH is None and fs.merges()
    one = run_ops(fmt, G, K, dtype)
    assert dec.counters(torch.device(DEVICE), 1).abs().max() == 0
    assert len(launched) == 3 and not any("_sum_" in n for n in launched), launched
    launched.clear()
    monkeypatch.setattr(fs, "ONE_LAUNCH", False)
    two = run_ops(fmt, G, K, dtype)
    sums = ["_sum_qkv_kernel", "_sum_gate_up_kernel", "_sum_residual_kernel"]
    assert [n for n in launched if n.startswith("_sum_")] == sums and len(launched) == 6, launched
    for a, b in zip(one, two):
        assert torch.equal(a, b) and torch.isfinite(a).all()


@pytest.mark.parametrize(
    "fmt,G,K,splits,dtype",
    [("float", 0, 150, 3, BF16), ("float", 0, 1024, None, F32), ("int4", 32, 96, 3, F16), ("fp8", 0, 150, 2, BF16)],
)
def test_merge_in_the_launch_equals_the_second_launch(monkeypatch, fmt, G, K, splits, dtype):
    """float (K 150: 3 splits, the last 22 columns; K 1024: the rule's 2 splits on the CPU), int4 (G 32: 3 splits of
    one group's tile) and fp8 (2 splits)."""
    if DEVICE != "cpu":
        pytest.skip("counts the interpreter's launches")
    merged_equals_second_launch(monkeypatch, fmt, G, K, splits, dtype)


def test_rocm_adds_the_splits_up_in_a_second_launch(monkeypatch):
    """On ROCm (torch.version.hip set) the splits are added up by a second launch (the merge's memory ordering is
    unverified on AMD, as decode attention's); ONE_LAUNCH forces either way anywhere."""
    from speechrt.kernels import triton_fused_split as fs

    monkeypatch.setattr(torch.version, "hip", "6.4")
    assert not fs.merges()
    monkeypatch.setattr(fs, "ONE_LAUNCH", True)
    assert fs.merges()
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(fs, "ONE_LAUNCH", False)
    assert not fs.merges()


@pytest.mark.parametrize("last", ["SPLITS - 2", "SPLITS"])
def test_a_merge_by_the_wrong_program_is_caught(monkeypatch, tmp_path, last):
    """The checks above fail when the last-ticket test is off by one (SPLITS - 2: the next-to-last split merges
    before the last has stored its partials and resets the counter, which the last then leaves at 1; SPLITS: no
    program merges, the outputs are never written and the counters stay at 3)."""
    from speechrt.kernels import triton_decode_attention as dec
    from speechrt.kernels import triton_fused_parts as fp

    if DEVICE != "cpu":
        pytest.skip("patches an interpreted kernel helper")
    mutant = mutant_module(fp, "ticket == SPLITS - 1", f"ticket == {last}", 1, tmp_path)
    monkeypatch.setattr(fp, "last_split", mutant.last_split)  # the kernels look it up in triton_fused_parts
    try:
        with pytest.raises(AssertionError):
            merged_equals_second_launch(monkeypatch, "float", 0, 150, 3, F32)
    finally:
        dec.counters(torch.device(DEVICE), 1).zero_()  # what the mutant left, not for the next test
