"""The quantized linear kernels against their dequantize-then-matmul references (kernels/reference.py), in the
Triton interpreter on the CPU: W4A16 (kernels/triton_int4_matmul.py) in the GGUF's Q4_0 / Q4_1 / Q4_K forms and
AWQ / GPTQ-style groups of 32 / 64 / 128 with zero points, FP8 E4M3 (kernels/triton_fp8_matmul.py) as W8A16 and
W8A8; 1, 3 and 17 rows, K not a multiple of the K tile (fp8; int4 tiles divide the group), odd N, split-K
one-row steps, every activation dtype, every E4M3 value, and a NaN that must reach the output. On a GPU:
SPEECHRT_TEST_DEVICE=cuda (conftest.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from kernel_checks import DEVICE, DTYPES, close, rand  # tests/kernel_checks.py

from speechrt.kernels import reference as ref

pytestmark = pytest.mark.usefixtures("interpret")


@pytest.fixture(scope="module")
def i4():
    from speechrt.kernels import triton_int4_matmul

    return triton_int4_matmul


@pytest.fixture(scope="module")
def f8():
    from speechrt.kernels import triton_fp8_matmul

    return triton_fp8_matmul


def awq_groups(N, K, G, seed):
    """AWQ / GPTQ-style: q 0..15, float16 scales, integer zero points, per group of G along K."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (N, K), generator=g, dtype=torch.uint8)
    scale = (torch.rand(N, K // G, generator=g) * 0.02 + 0.005).half()
    zp = torch.randint(0, 16, (N, K // G), generator=g)
    return q, scale, zp


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("M,N,K,G", [(1, 37, 96, 32), (3, 45, 192, 64), (17, 33, 256, 128), (1, 64, 2048, 32)])
def test_int4_awq_groups(i4, dtype, M, N, K, G):
    """G 32 / 64 / 128 (K tiles of 32 / 64 / 128); (1, 64, 2048) splits K among programs."""
    q, scale, zp = awq_groups(N, K, G, seed=M + N)
    q, s, z = ref.int4_from_zero_points(q, scale, zp)
    packed, sz = i4.pack_int4(q.to(DEVICE), s.to(DEVICE), z.to(DEVICE), dtype)
    assert packed.shape == (N, K // 2) and packed.dtype == torch.uint8
    assert torch.equal(i4.unpack_int4(packed).cpu(), q)
    # the kernel's format holds the groups' own values exactly: (q - zp) * scale
    exact = ((q.float().view(N, -1, G) - zp.float()[..., None]) * scale.float()[..., None]).view(N, K)
    assert torch.equal(ref.dequantize_int4(q, sz.cpu()), exact)
    x = rand(M, K, dtype=dtype, seed=M)
    close(i4.linear_int4(x, packed, sz), ref.linear_int4_ref(x, q.to(DEVICE), sz))
    assert (i4.config(M, N, K, dtype, G)["SPLIT_K"] > 1) == (K == 2048)  # the split and its sums kernel ran


@pytest.mark.parametrize("dtype", DTYPES)
def test_int4_strided_3d_input_and_nan(i4, dtype):
    N, K = 41, 64
    q, scale, zp = awq_groups(N, K, 32, seed=5)
    q, s, z = ref.int4_from_zero_points(q, scale, zp)
    packed, sz = i4.pack_int4(q.to(DEVICE), s.to(DEVICE), z.to(DEVICE), dtype)
    x = rand(2, 3, K + 6, dtype=dtype, seed=9)[..., 3 : 3 + K]  # rows strided, a [2, 3, K] view
    close(i4.linear_int4(x, packed, sz), ref.linear_int4_ref(x, q.to(DEVICE), sz))
    x = x.clone()
    x[1, 2, 7] = float("nan")
    y = i4.linear_int4(x, packed, sz)
    assert torch.isnan(y[1, 2]).all() and torch.isfinite(y[0]).all() and torch.isfinite(y[1, :2]).all()


def _gguf_tensor(kind, N, K, seed):
    """A GGUF tensor of `kind` quantized by the gguf package from random floats, and its float32 dequantization."""
    gguf = pytest.importorskip("gguf")
    from gguf import quants

    qt = getattr(gguf.GGMLQuantizationType, kind)
    rng = np.random.default_rng(seed)
    if kind == "Q4_K":  # gguf cannot quantize to Q4_K: random super-blocks (6-bit scales, mins, nibbles) instead
        raw = rng.integers(0, 256, (N, K // 256, 144), dtype=np.uint8)
        raw[..., 0:4] = (rng.random((N, K // 256, 2)) * [2e-3, 4e-3]).astype(np.float16).view(np.uint8)
        raw = raw.reshape(N, -1)
    else:
        raw = quants.quantize(rng.standard_normal((N, K)).astype(np.float32) * 0.05, qt)

    class T:  # what models/gguf_loader's block readers take
        data = raw
        tensor_type = qt

    return T, torch.from_numpy(quants.dequantize(raw, qt).reshape(N, K).astype(np.float32))


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1", "Q4_K"])
def test_int4_gguf_blocks_exact(i4, kind):
    """The GGUF's blocks through the loader and pack_int4 dequantize to gguf's own float32 values, bit for bit,
    and the kernel equals the float32 matmul with them (3 rows, odd N)."""
    from speechrt.models.gguf_loader import Q4_BLOCKS

    N, K = 7, 512
    t, w = _gguf_tensor(kind, N, K, seed=3)
    q, s, z = Q4_BLOCKS[kind](t, (N, K))
    packed, sz = i4.pack_int4(q.to(DEVICE), s.to(DEVICE), z.to(DEVICE), torch.float32)
    assert torch.equal(ref.dequantize_int4(i4.unpack_int4(packed).cpu(), sz.cpu()), w)
    x = rand(3, K, seed=4)
    close(i4.linear_int4(x, packed, sz), x @ w.to(DEVICE).T)


def test_int4_refuses_bad_shapes(i4):
    q = torch.zeros(4, 96, dtype=torch.uint8)
    with pytest.raises(ValueError, match="a multiple of 32"):
        i4.pack_int4(q, torch.ones(4, 5), torch.zeros(4, 5))
    packed, sz = i4.pack_int4(q, torch.ones(4, 3), torch.zeros(4, 3))
    with pytest.raises(ValueError, match="valid: packed"):
        i4.linear_int4(rand(1, 64), packed, sz)


def fp8_weights(N, K, seed):
    w, s = ref.quantize_fp8(rand(N, K, seed=seed, scale=0.05).cpu())
    return w.to(DEVICE), s.to(DEVICE)


def test_quantize_fp8_per_channel():
    w = rand(5, 40, seed=1).cpu()
    w[2] = 0
    q, s = ref.quantize_fp8(w)
    assert q.dtype == torch.float8_e4m3fn and s.dtype == torch.float32 and s[2] == 1
    assert torch.equal(q.float().abs().amax(1)[[0, 1, 3, 4]], torch.full((4,), 448.0))
    err = (q.float() * s[:, None] - w).abs() / w.abs().amax(1, keepdim=True).clamp_min(1e-12)
    assert err.max() <= 2**-4  # E4M3: 3 mantissa bits, half an ulp of 1/8 relative to the row's top


def test_fp8_every_e4m3_value(f8):
    """The W8A16 path decodes E4M3 bytes by integer ops: all 254 finite values (subnormals, zeros, +-448) come
    out exact (x is the identity, so y holds the weights)."""
    w = torch.arange(256, dtype=torch.uint8).view(2, 128).view(torch.float8_e4m3fn)
    finite = torch.isfinite(w.float())
    y = f8.linear_fp8(torch.eye(128, device=DEVICE), w.to(DEVICE), torch.ones(2, device=DEVICE), act_fp8=False)
    assert torch.equal(y.T.cpu()[finite], w.float()[finite]) and (~finite).sum() == 2


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("M,N,K", [(1, 37, 96), (3, 45, 200), (17, 33, 130)])
def test_fp8_w8a16(f8, dtype, M, N, K):
    w, s = fp8_weights(N, K, seed=M)
    x = rand(M, K, dtype=dtype, seed=M + 1)
    close(f8.linear_fp8(x, w, s, act_fp8=False), ref.linear_fp8(x, w, s))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("M,N,K", [(1, 37, 96), (17, 33, 200)])
def test_fp8_w8a8(f8, dtype, M, N, K):
    """Activations whose per-row scaling lands on E4M3 values (the Triton 3.9 interpreter's float32 -> fp8
    conversion rounds wrongly past half an ulp, so rounding itself is left to the GPU run): each row is E4M3
    values times a power of two, its largest 448 times that."""
    w, s = fp8_weights(N, K, seed=M)
    g = torch.Generator().manual_seed(M)
    x = torch.randn(M, K, generator=g).to(torch.float8_e4m3fn).float() * 2.0 ** torch.randint(-8, 2, (M, 1))
    x[:, 5] = 448 * 2.0 ** torch.log2(x.abs().amax(1) / 448).ceil()
    x = x.to(dtype).to(DEVICE)
    expected = ref.linear_fp8(x, w, s, act_fp8=True)
    close(f8.linear_fp8(x, w, s, act_fp8=True), expected)
    # the activations were rounded: the W8A8 reference is not the W8A16 one on x with noise below E4M3's ulp
    x2 = (x.float() * (1 + 1e-3 * rand(M, K, seed=2))).to(dtype)
    assert not torch.equal(ref.linear_fp8(x2, w, s, act_fp8=False), ref.linear_fp8(x2, w, s, act_fp8=True))


@pytest.mark.parametrize("act_fp8", [False, True])
def test_fp8_nan_reaches_output(f8, act_fp8):
    w, s = fp8_weights(9, 64, seed=1)
    x = rand(3, 64, dtype=torch.bfloat16, seed=2)
    x[1, 3] = float("nan")
    y = f8.linear_fp8(x, w, s, act_fp8=act_fp8)
    assert torch.isnan(y[1]).all() and torch.isfinite(y[[0, 2]]).all()
    with pytest.raises(TypeError, match="float8_e4m3fn"):
        f8.linear_fp8(x, w.float(), s)
