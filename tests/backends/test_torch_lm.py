"""The ops the Llama model adds to the kernel set (int8 / int4 weight-only linear, GQA attention) against
their plain definitions, and the torch LM runner's option checks."""

from __future__ import annotations

import pytest
import torch

from speechrt import kernels
from speechrt.backends.torch import lm as torch_lm
from speechrt.errors import UserError
from speechrt.kernels import reference as ref
from speechrt.models.llama_layers import quantize_int4
from speechrt.models.registry import resolve


@pytest.mark.parametrize("shape", [(1, 576), (3, 7, 256), (8, 96)])
def test_linear_int8_matches_definition(shape):
    g = torch.Generator().manual_seed(0)
    K, N = shape[-1], 200
    w = torch.randint(-127, 128, (N, K), dtype=torch.int8, generator=g)
    s = torch.rand(N, generator=g) * 0.01 + 1e-3
    x = torch.randn(*shape, generator=g).bfloat16()
    fast = ref.linear_int8(x, w, s.bfloat16())
    exact = x.float() @ (w.float() * s.bfloat16().float()[:, None]).t()
    assert fast.shape == (*shape[:-1], N) and fast.dtype == torch.bfloat16
    assert torch.allclose(fast.float(), exact, rtol=2e-2, atol=2e-2 * exact.abs().max().item())
    exact32 = x.float() @ (w.float() * s[:, None]).t()
    assert torch.allclose(ref.linear_int8_ref(x.float(), w, s), exact32, rtol=1e-4, atol=1e-3)
    # a non-contiguous input (a slice of a fused projection) works too
    xx = torch.randn(shape[0], 2 * K, generator=g).bfloat16()[:, :K]
    assert torch.allclose(
        ref.linear_int8(xx, w, s.bfloat16()).float(),
        xx.float() @ (w.float() * s.bfloat16().float()[:, None]).t(),
        rtol=2e-2,
        atol=0.05,
    )


@pytest.mark.parametrize("M,K,N", [(1, 576, 960), (5, 256, 64), (8, 1536, 576)])
def test_linear_int4_matches_definition(M, K, N):
    g = torch.Generator().manual_seed(1)
    w = torch.randn(N, K, generator=g) * 0.05
    q, scale, zero = quantize_int4(w)
    deq = ((q.float().view(N, K // 32, 32) - 8) * scale[..., None] + zero[..., None]).view(N, K)
    assert (deq - w).abs().max() <= scale.max() / 2 + 1e-6  # min/max 4-bit rounding error bound
    x = torch.randn(M, K, generator=g)
    exact = x @ deq.t()
    for dt, tol in ((torch.bfloat16, 3e-2), (torch.float32, 1e-4)):
        packed, sz = ref.pack_int4(q, scale, zero, dt)
        y = ref.linear_int4(x.to(dt), packed, sz)
        assert y.shape == (M, N) and y.dtype == dt
        assert (y.float() - exact).abs().max() <= tol * exact.abs().max(), dt
    # the unpacked definition agrees with ATen's packed CPU kernel
    packed, sz = ref.pack_int4(q, scale, zero, torch.bfloat16)
    assert packed.shape[-1] == K // 2  # packed two per byte on the CPU
    a = ref.linear_int4(x.bfloat16(), packed, sz).float()
    b = ref.linear_int4_ref(x.bfloat16(), q, sz).float()
    assert (a - b).abs().max() <= 3e-2 * b.abs().max()


def test_gqa_attention_equals_repeated_heads():
    g = torch.Generator().manual_seed(2)
    q = torch.randn(2, 9, 5, 64, generator=g)
    k, v = torch.randn(2, 3, 11, 64, generator=g), torch.randn(2, 3, 11, 64, generator=g)
    lengths = torch.tensor([11, 7])
    a = ref.attention(q, k, v, causal=True, lengths=lengths)
    kr, vr = k.repeat_interleave(3, dim=1), v.repeat_interleave(3, dim=1)
    b = ref.attention(q, kr, vr, causal=True, lengths=lengths)
    assert torch.allclose(a, b, atol=1e-5)


def test_kernel_set_has_the_llama_ops():
    ops = kernels.select("torch", "cpu")
    for name in ("rms_norm", "rotary", "attention", "silu_mul", "linear", "linear_int8", "pack_int4", "linear_int4"):
        assert name in ops


def test_dtype_choices():
    cpu = torch.device("cpu")
    assert torch_lm.resolve_format(None, cpu, has_q4=True) == "int4"
    assert torch_lm.resolve_format(None, cpu, has_q4=False) == "int8"
    assert torch_lm.resolve_format("bf16", cpu) == "bfloat16"
    with pytest.raises(UserError, match="unsupported dtype 'int3'.*valid: .*bfloat16"):
        torch_lm.resolve_format("int3", cpu)


def test_unknown_backend_and_device():
    from speechrt.pipelines.lm import load_lm

    with pytest.raises(UserError, match="valid backends: torch"):
        load_lm(backend="tensorflow")
    with pytest.raises(UserError, match="unsupported device"):
        load_lm(backend="torch", device="tpu")


@pytest.mark.parametrize("dense_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("fmt", ["int4", "int8"])
@pytest.mark.parametrize("rows", [1, 15, 16, 37])
def test_dense_prefill_copy_matches_the_quantized_weights(fmt, rows, dense_dtype):
    """Linear(dense=dtype) keeps the dequantized weights in that dtype (bf16 where the CPU has native bf16,
    float32 elsewhere) and uses them for inputs of at least DENSE_MIN_ROWS rows (prefill); fewer rows take
    the weight-only kernel. Both compute with the same weight values: they agree to bf16 accuracy, on
    either side of the threshold."""
    from speechrt.models.llama_layers import DENSE_MIN_ROWS, Linear

    g = torch.Generator().manual_seed(rows)
    N, K = 208, 576  # ATen's packed int4 CPU layout needs N % 16 == 0
    w = torch.randn(N, K, generator=g) * 0.05
    ops = kernels.select("torch", torch.device("cpu"))
    q4 = quantize_int4(w) if fmt == "int4" else None
    dense = Linear(ops, w, fmt, torch.device("cpu"), q4, dense=dense_dtype)
    plain = Linear(ops, w, fmt, torch.device("cpu"), q4)
    assert plain.dense is None and dense.dense.dtype == dense_dtype and dense.dense.shape == (N, K)
    x = torch.randn(rows, K, generator=g).bfloat16()
    y, y_ref = dense(x), plain(x)
    assert y.dtype == torch.bfloat16 and y.shape == (rows, N) and torch.isfinite(y).all()
    assert (y.float() - y_ref.float()).abs().max() <= 2e-2 * y_ref.float().abs().max()
    if rows >= DENSE_MIN_ROWS:
        assert torch.equal(y, torch.nn.functional.linear(x.to(dense_dtype), dense.dense).bfloat16())
    else:
        assert torch.equal(y, y_ref)


# -- int4 on the CPU through kernels/cpu_decode (backends/torch/cpu_lm.py) ---------------------------------------


@pytest.fixture(scope="module")
def cpu_int4():
    from speechrt import backends
    from speechrt.kernels.cpu_decode import unavailable

    if unavailable():
        pytest.skip(f"the CPU int4 kernel does not run here: {unavailable()}")
    return backends.get("torch").lm(resolve(None, "lm"), dtype="int4")


def test_int4_on_the_cpu_takes_the_kernel(cpu_int4, monkeypatch):
    from speechrt import backends
    from speechrt.backends.torch.cpu_lm import CpuInt4LMRunner

    assert isinstance(cpu_int4, CpuInt4LMRunner) and "AVX2 kernel" in cpu_int4.info.threads
    assert cpu_int4.info.precision == "int4" and cpu_int4.info.backend == "torch"
    monkeypatch.setenv("SPEECHRT_CPU_DECODE", "0")  # turned off: ATen's weight-only kernels
    other = backends.get("torch").lm(resolve(None, "lm"), dtype="int4")
    assert type(other) is torch_lm.TorchLMRunner and other.info.precision == "int4"


def test_int4_long_prompts_batches_and_bad_prompts(cpu_int4):
    """Prompts longer than one call (max_rows rows) equal the same prompt continued from a cut; a batch of
    prompts equals them one by one, and a bad prompt (a token past the vocabulary) fails alone; more
    sequences than one call takes step together as they do alone."""
    r = cpu_int4
    g = torch.Generator().manual_seed(5)
    n = r.model.max_rows
    long = torch.randint(0, r.config.vocab_size, (2 * n + 7,), generator=g)
    c = r.new_cache(n + 3, 2 * n + 16)
    whole = r.prefill(c, 0, long)
    r.prefill(c, 1, long[: n - 5])
    cut = r.prefill(c, 1, long[n - 5 :], start=n - 5)
    assert torch.equal(whole, cut) and c.lengths[:2] == [len(long)] * 2
    prompts = [torch.randint(0, r.config.vocab_size, (t,), generator=g) for t in (5, n, 9)]
    bad = torch.tensor([1, 2, r.config.vocab_size])
    out = r.prefill_many(c, [(2, prompts[0], 0), (3, bad, 0), (4, prompts[1], 0), (5, prompts[2], 0)])
    assert isinstance(out[1], RuntimeError) and "vocabulary" in str(out[1])
    single = r.new_cache(1, 2 * n + 16)
    for got, p in zip([out[0], out[2], out[3]], prompts):
        assert torch.equal(got, r.prefill(single, 0, p))
    ok = r.prefill_many(c, [(2, prompts[0], 0), (4, prompts[1], 0), (5, prompts[2], 0)])
    assert all(torch.equal(a, b) for a, b in zip(ok, [out[0], out[2], out[3]]))
    # n + 3 sequences in one decode step: two calls, each row as it steps alone
    for s in range(6, n + 3):
        r.prefill(c, s, prompts[0])
    slots = [s for s in range(n + 3) if s != 3]
    tokens = torch.randint(0, r.config.vocab_size, (len(slots),), generator=g)
    before = list(c.lengths)
    k0, v0 = c.k.clone(), c.v.clone()
    both = r.decode_step(c, slots, tokens)
    assert both.shape == (len(slots), r.config.vocab_size)
    assert all(c.lengths[s] == before[s] + 1 for s in slots) and c.lengths[3] == before[3]
    for i in (0, len(slots) - 1):
        alone = type(c)(k0.clone(), v0.clone(), list(before))
        assert torch.equal(r.decode_step(alone, [slots[i]], tokens[i : i + 1])[0], both[i])
