"""Every Triton kernel against its torch reference, in the Triton interpreter on the CPU: odd widths,
length 1, lengths that are not multiples of the blocks, strided (non-contiguous) inputs, and each dtype
the kernels claim. Shapes are small because the interpreter runs each program in numpy.

On a GPU the same cases run compiled: `SPEECHRT_TEST_DEVICE=cuda pytest tests/kernels/test_triton_kernels.py`
(inputs drawn on the CPU with the same seeds, then moved; the reference runs on the GPU too)."""

from __future__ import annotations

import pytest
import torch
from kernel_checks import DEVICE, DTYPES, TOL, LaunchTrace, close, mutant_module, rand  # tests/kernel_checks.py

from speechrt import kernels
from speechrt.kernels import reference as ref

pytestmark = pytest.mark.usefixtures("interpret")


@pytest.fixture(scope="module")
def tri():
    with pytest.MonkeyPatch.context() as mp:  # runs before the function-scoped `interpret` fixture
        if DEVICE == "cpu":  # a GPU runs the kernels compiled: interpreting them there fails at launch
            mp.setenv("TRITON_INTERPRET", "1")
        return kernels.select("triton", DEVICE)


HOT_OPS = {"layer_norm", "rms_norm", "gelu", "silu_mul", "linear", "linear_int8", "rotary", "attention"}
HOT_OPS |= {"pack_int4", "linear_int4", "linear_fp8"}  # the quantized linears (tests/kernels/test_triton_quant.py)


def test_select_triton_covers_the_hot_ops(tri):
    """Every hot op is a Triton kernel; an op without one (if any) raises naming itself when
    called, and the 'auto' set falls back to the reference for exactly those."""
    assert set(tri.names()) == set(ref.OPS)
    assert {k for k, v in tri.sources.items() if v == "triton"} >= HOT_OPS
    missing = sorted(k for k, v in tri.sources.items() if v == "missing")
    for k in missing:
        with pytest.raises(RuntimeError, match=f"no Triton version of op '{k}'"):
            getattr(tri, k)()
    auto = kernels.select("auto", DEVICE)
    assert {k for k, v in auto.sources.items() if v == "torch"} == set(missing)
    assert {k for k, v in auto.sources.items() if v == "triton"} >= HOT_OPS


# ---------------------------------------------------------------- norms


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1, 7), (3, 5, 33), (2, 384)])
@pytest.mark.parametrize("with_res", [False, True])
def test_layer_norm(tri, dtype, shape, with_res):
    n = shape[-1]
    x, r = rand(*shape, dtype=dtype, seed=1), rand(*shape, dtype=dtype, seed=2)
    w, b = rand(n, dtype=dtype, seed=3), rand(n, dtype=dtype, seed=4)
    res = r if with_res else None
    out, exp = tri.layer_norm(x, w, b, 1e-5, residual=res), ref.layer_norm(x, w, b, 1e-5, residual=res)
    if with_res:
        close(out[0], exp[0]), close(out[1], exp[1])
    else:
        close(out, exp)
    close(tri.layer_norm(x, w, None, 1e-5), ref.layer_norm(x, w, None, 1e-5))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1, 7), (3, 5, 33), (2, 576)])
@pytest.mark.parametrize("with_res", [False, True])
def test_rms_norm(tri, dtype, shape, with_res):
    n = shape[-1]
    x, r, w = rand(*shape, dtype=dtype, seed=1), rand(*shape, dtype=dtype, seed=2), rand(n, dtype=dtype, seed=3)
    res = r if with_res else None
    out, exp = tri.rms_norm(x, w, 1e-6, residual=res), ref.rms_norm(x, w, 1e-6, residual=res)
    if with_res:
        close(out[0], exp[0]), close(out[1], exp[1])
    else:
        close(out, exp)


def test_norms_strided_inputs(tri):
    # rows of a wider buffer (row stride 40 for width 33) and a transposed view (column stride != 1)
    big, rbig = rand(4, 6, 40, seed=5), rand(4, 6, 40, seed=6)
    x, r = big[..., :33], rbig[..., 3:36]
    w, b = rand(33, seed=7), rand(33, seed=8)
    y, s = tri.layer_norm(x, w, b, 1e-5, residual=r)
    ey, es = ref.layer_norm(x, w, b, 1e-5, residual=r)
    close(y, ey), close(s, es)
    xt = rand(33, 6, seed=9).t()  # [6, 33], stride (1, 6)
    close(tri.rms_norm(xt, w, 1e-6), ref.rms_norm(xt, w, 1e-6))
    y, s = tri.rms_norm(x, w, 1e-6, residual=r)
    ey, es = ref.rms_norm(x, w, 1e-6, residual=r)
    close(y, ey), close(s, es)


def test_rms_norm_mixed_dtypes_and_broadcast_residual(tri):
    # fp16 activations with a float32 weight promote to float32, as in the reference; a residual of
    # shape [d] broadcast over the rows
    x, w, r = rand(3, 40, dtype=torch.float16, seed=1), rand(40, seed=2), rand(40, dtype=torch.float16, seed=3)
    close(tri.rms_norm(x, w, 1e-6), ref.rms_norm(x, w, 1e-6), tol=TOL[torch.float16])
    y, s = tri.rms_norm(x, w.half(), 1e-6, residual=r)
    ey, es = ref.rms_norm(x, w.half(), 1e-6, residual=r)
    close(y, ey), close(s, es)


def test_norm_empty_batch(tri):
    x, w = torch.empty(0, 33, device=DEVICE), rand(33)
    assert tri.layer_norm(x, w, w, 1e-5).shape == (0, 33)


# ---------------------------------------------------------------- activations


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1), (3, 7, 33), (2, 1100)])  # 1100 > one 1024-wide block
def test_gelu(tri, dtype, shape):
    x, b = rand(*shape, dtype=dtype, seed=1, scale=3.0), rand(shape[-1], dtype=dtype, seed=2)
    close(tri.gelu(x, b), ref.gelu(x, b))
    close(tri.gelu(x), ref.gelu(x))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1), (3, 7, 33), (2, 1100)])
def test_silu_mul(tri, dtype, shape):
    g, u = rand(*shape, dtype=dtype, seed=1, scale=3.0), rand(*shape, dtype=dtype, seed=2)
    close(tri.silu_mul(g, u), ref.silu_mul(g, u))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1), (3, 7, 33), (2, 1100)])
def test_gelu_tanh_mul(tri, dtype, shape):
    """GeGLU (Gemma's MLP): gelu with the tanh approximation of the gate, times up."""
    g, u = rand(*shape, dtype=dtype, seed=1, scale=3.0), rand(*shape, dtype=dtype, seed=2)
    close(tri.gelu_tanh_mul(g, u), ref.gelu_tanh_mul(g, u))


def test_activations_strided(tri):
    # the two halves of a fused gate/up projection [.., 2 * 45], read in place; a conv-style [B, C, T]
    gu = rand(3, 5, 90, seed=3)
    close(tri.silu_mul(gu[..., :45], gu[..., 45:]), ref.silu_mul(gu[..., :45], gu[..., 45:]))
    x = rand(2, 37, 11, seed=4).transpose(1, 2)  # [2, 11, 37], last-dim stride 11
    b = rand(37, seed=5)
    close(tri.gelu(x, b), ref.gelu(x, b))
    xs = rand(4, 50, seed=6)[:, 7:40]
    close(tri.gelu(xs, b[:33]), ref.gelu(xs, b[:33]))


# ---------------------------------------------------------------- rotary


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("B,H,Hkv,T,D,cos_batch", [(2, 6, 2, 5, 24, 1), (1, 9, 3, 1, 64, 1), (3, 4, 4, 7, 16, 3)])
def test_rotary(tri, dtype, B, H, Hkv, T, D, cos_batch):
    q, k = rand(B, H, T, D, dtype=dtype, seed=1), rand(B, Hkv, T, D, dtype=dtype, seed=2)
    ang = rand(cos_batch, 1, T, D // 2, seed=3, scale=3.0)
    cos, sin = ang.cos(), ang.sin()
    oq, ok = tri.rotary(q, k, cos, sin)
    eq, ek = ref.rotary(q, k, cos, sin)
    close(oq, eq), close(ok, ek)


def test_rotary_strided_fused_qkv(tri):
    # q, k as views of a fused projection [B, T, (H + 2 Hkv) * D] -> [B, heads, T, D] (like Llama)
    B, T, H, Hkv, D = 2, 5, 6, 2, 32
    qkv = rand(B, T, (H + 2 * Hkv) * D, seed=4)
    q = qkv[..., : H * D].view(B, T, H, D).transpose(1, 2)
    k = qkv[..., H * D : (H + Hkv) * D].view(B, T, Hkv, D).transpose(1, 2)
    ang = rand(1, 1, T, D // 2, seed=5)
    oq, ok = tri.rotary(q, k, ang.cos(), ang.sin())
    eq, ek = ref.rotary(q, k, ang.cos(), ang.sin())
    close(oq, eq), close(ok, ek)


# ---------------------------------------------------------------- linear


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("M,K,N", [(1, 33, 37), (5, 7, 70), (70, 40, 19)])  # decode, mid, prefill configs
def test_linear(tri, dtype, M, K, N):
    x, w, b = rand(M, K, dtype=dtype, seed=1), rand(N, K, dtype=dtype, seed=2), rand(N, dtype=dtype, seed=3)
    close(tri.linear(x, w, b), ref.linear(x, w, b))
    close(tri.linear(x, w), ref.linear(x, w))


def test_linear_hands_tall_products_to_the_vendor_gemm_only_when_asked(tri, monkeypatch):
    """triton_matmul.VENDOR_GEMM_MIN_ROWS = n: products of n rows or more go to torch's matmul (bit for bit torch's),
    fewer stay on the kernel; by default (None) none goes."""
    from speechrt.kernels import triton_matmul as tm

    x, w, b = rand(2, 9, 33, seed=1), rand(37, 33, seed=2), rand(37, seed=3)
    want, want16, vendor = ref.linear(x, w, b), ref.linear(x[:, :8], w, b), torch.nn.functional.linear(x, w, b)
    calls = []
    real = torch.nn.functional.linear
    monkeypatch.setattr(torch.nn.functional, "linear", lambda *a: calls.append(a[0].shape) or real(*a))
    assert tm.VENDOR_GEMM_MIN_ROWS is None
    close(tri.linear(x, w, b), want)
    assert calls == []
    monkeypatch.setattr(tm, "VENDOR_GEMM_MIN_ROWS", 18)
    assert torch.equal(tri.linear(x, w, b), vendor) and calls == [x.shape]
    close(tri.linear(x[:, :8], w, b), want16)  # 16 rows: the kernel
    assert calls == [x.shape]


def test_linear_strided_and_batched(tri):
    xb = rand(2, 3, 50, seed=4)
    x = xb[..., 5:38]  # [2, 3, 33] with row stride 50
    wt = rand(33, 21, seed=5).t()  # [21, 33] weight stored transposed: strides (1, 21)
    b = rand(21, seed=6)
    close(tri.linear(x, wt, b), ref.linear(x, wt, b))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("M,K,N", [(1, 33, 37), (3, 130, 20), (20, 64, 45)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_linear_int8(tri, dtype, M, K, N, with_bias):
    g = torch.Generator().manual_seed(M * K + N)
    w = torch.randint(-127, 128, (N, K), dtype=torch.int8, generator=g).to(DEVICE)
    scale = (torch.rand(N, generator=g) * 0.02 + 0.001).to(dtype).to(DEVICE)
    x = rand(1, M, K, dtype=dtype, seed=2)
    b = rand(N, dtype=dtype, seed=3) if with_bias else None
    close(tri.linear_int8(x, w, scale, b), ref.linear_int8(x, w, scale, b))


def test_linear_int8_rejects_float_weights(tri):
    with pytest.raises(TypeError, match="int8"):
        tri.linear_int8(rand(1, 8), rand(4, 8), rand(4))


# ---------------------------------------------------------------- attention

ATT_CASES = [
    # B, H, Hkv, Tq, Tk, D, causal, lengths
    (2, 4, 2, 5, 5, 24, False, None),  # odd head dim, tiny
    (1, 6, 3, 7, 70, 64, True, [70]),  # causal with a cache prefix, GQA, lengths = Tk
    (2, 2, 1, 67, 67, 16, True, None),  # Tq not a multiple of the 64-row query tile
    (2, 2, 2, 3, 1, 8, False, None),  # one key
    (1, 2, 1, 4, 9, 128, True, None),  # head dim 128
    (3, 4, 1, 6, 40, 32, False, [40, 17, 1]),  # padded keys per sequence
]


@pytest.mark.parametrize("B,H,Hkv,Tq,Tk,D,causal,lengths", ATT_CASES)
def test_attention_prefill_float32(tri, B, H, Hkv, Tq, Tk, D, causal, lengths):
    q, k, v = rand(B, H, Tq, D, seed=1), rand(B, Hkv, Tk, D, seed=2), rand(B, Hkv, Tk, D, seed=3)
    L = torch.tensor(lengths, device=DEVICE) if lengths else None
    close(tri.attention(q, k, v, causal=causal, lengths=L), ref.attention(q, k, v, causal=causal, lengths=L))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("case", [ATT_CASES[1], ATT_CASES[2], ATT_CASES[5]])
def test_attention_prefill_16bit(tri, dtype, case):
    B, H, Hkv, Tq, Tk, D, causal, lengths = case
    q, k, v = (
        rand(B, H, Tq, D, seed=1, dtype=dtype),
        rand(B, Hkv, Tk, D, seed=2, dtype=dtype),
        rand(B, Hkv, Tk, D, seed=3, dtype=dtype),
    )
    L = torch.tensor(lengths, device=DEVICE) if lengths else None
    close(tri.attention(q, k, v, causal=causal, lengths=L), ref.attention(q, k, v, causal=causal, lengths=L))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("tiles", [(64, 64, 4, 3), (128, 64, 8, 2), (64, 128, 8, 3)])
def test_attention_tile_sets_agree(tri, dtype, tiles):
    """The tile sets config() picks between (and the tuning sweep of docs/gpu.md tries) at a length
    none of them divides, causal or not."""
    B, H, T, D = 1, 2, 150, 64
    q, k, v = (rand(B, H, T, D, seed=s, dtype=dtype) for s in (5, 6, 7))
    bm, bn, w, st = tiles
    t = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_D": 64, "num_warps": w, "num_stages": st}
    close(tri.attention(q, k, v, tiles=t), ref.attention(q, k, v))
    close(tri.attention(q, k, v, causal=True, tiles=t), ref.attention(q, k, v, causal=True))


def test_attention_tiles_by_dtype_and_head_dim():
    from speechrt.kernels.triton_attention import config

    assert config(1500, 64, torch.float16, hip=False) == {
        "BLOCK_M": 64,
        "BLOCK_N": 64,
        "BLOCK_D": 64,
        "num_warps": 4,
        "num_stages": 3,
    }
    assert config(1500, 128, torch.float16, hip=False)["BLOCK_M"] == 128  # not measured: as before
    assert config(512, 64, torch.float16, hip=False, causal=True)["num_stages"] == 2  # causal: as before
    assert config(1500, 64, torch.float32, hip=False)["num_stages"] == 2
    assert config(1500, 64, torch.float16, hip=True)["BLOCK_N"] == 32


def test_attention_scale_and_strided_qkv(tri):
    # q, k, v as views of Whisper's fused qkv projection [B, T, 3, H, D] -> [B, H, T, D]
    B, T, H, D = 2, 9, 3, 16
    qkv = rand(B, T, 3 * H * D, seed=4).view(B, T, 3, H, D).permute(2, 0, 3, 1, 4)
    q, k, v = qkv[0], qkv[1], qkv[2]
    assert not q.is_contiguous()
    close(tri.attention(q, k, v, scale=0.3), ref.attention(q, k, v, scale=0.3))
    close(tri.attention(q, k, v, causal=True), ref.attention(q, k, v, causal=True))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("window", [1, 5, 70])
def test_attention_sliding_window(tri, dtype, window):
    """Gemma 3's sliding-window layers: each query sees the last `window` keys up to its position. A prompt after a
    cache prefix (Tq 67 over 80 keys: windows crossing the 64-row query tile and the key blocks), and decode steps
    over a padded cache whose sequences are longer, shorter and as long as the window (split counts 1 and 3)."""
    from speechrt.kernels.triton_decode_attention import decode_attention

    q, k, v = (
        rand(2, 4, 67, 32, seed=1, dtype=dtype),
        rand(2, 2, 80, 32, seed=2, dtype=dtype),
        rand(2, 2, 80, 32, seed=3, dtype=dtype),
    )
    close(tri.attention(q, k, v, causal=True, window=window), ref.attention(q, k, v, causal=True, window=window))
    q1 = rand(3, 4, 1, 32, seed=4, dtype=dtype)
    kc, vc = rand(3, 2, 200, 32, seed=5, dtype=dtype), rand(3, 2, 200, 32, seed=6, dtype=dtype)
    L = torch.tensor([200, 3, window], device=DEVICE)
    exp = ref.attention(q1, kc, vc, causal=True, lengths=L, window=window)
    close(tri.attention(q1, kc, vc, causal=True, lengths=L, window=window), exp)
    for ns in (1, 3):
        close(decode_attention(q1, kc, vc, lengths=L, num_splits=ns, window=window), exp)
    kh, vh = kc.repeat_interleave(2, dim=1), vc.repeat_interleave(2, dim=1)  # a key/value head per query head
    close(decode_attention(q1, kh, vh, lengths=L, num_splits=3, window=window), exp)


@pytest.mark.parametrize("dtype", DTYPES)
def test_decode_attention_padded_cache(tri, dtype):
    # one query per sequence over a [B, Hkv, 256, D] cache of which the first 150 slots are in use,
    # sequences of lengths 150, 1 and 77: split along the keys, merged by log-sum-exp
    B, H, Hkv, D, Tmax, Tk = 3, 6, 3, 64, 256, 150
    kc, vc = rand(B, Hkv, Tmax, D, dtype=dtype, seed=2), rand(B, Hkv, Tmax, D, dtype=dtype, seed=3)
    k, v = kc[:, :, :Tk], vc[:, :, :Tk]
    q = rand(B, H, 1, D, dtype=dtype, seed=1)
    L = torch.tensor([150, 1, 77], device=DEVICE)
    exp = ref.attention(q, k, v, causal=True, lengths=L)
    close(tri.attention(q, k, v, causal=True, lengths=L), exp)
    close(tri.attention(q, k, v, causal=False, lengths=L), exp)
    close(tri.attention(q, k, v), ref.attention(q, k, v))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("H,Hkv,D", [(6, 6, 64), (5, 1, 24), (8, 2, 128), (3, 3, 8)])
def test_decode_attention_heads_and_dims(tri, dtype, H, Hkv, D):
    """Per-head kernel (H == Hkv) and grouped kernel (query heads sharing a key/value head), head dims
    that are not powers of two or below the 16-wide tile, sequences of different lengths."""
    B, Tk = 2, 37
    q = rand(B, H, 1, D, dtype=dtype, seed=1)
    k, v = rand(B, Hkv, Tk, D, dtype=dtype, seed=2), rand(B, Hkv, Tk, D, dtype=dtype, seed=3)
    L = torch.tensor([37, 20], device=DEVICE)
    close(tri.attention(q, k, v, causal=True, lengths=L), ref.attention(q, k, v, causal=True, lengths=L))
    close(tri.attention(q, k, v, scale=0.05), ref.attention(q, k, v, scale=0.05))


@pytest.mark.parametrize("num_splits", [1, 2, 5])
def test_decode_attention_split_counts(num_splits):
    from speechrt.kernels.triton_decode_attention import decode_attention

    B, H, Hkv, D, Tk = 2, 4, 1, 40, 300  # head dim 40 (not a power of two), GQA 4:1
    q, k, v = rand(B, H, 1, D, seed=1), rand(B, Hkv, Tk, D, seed=2), rand(B, Hkv, Tk, D, seed=3)
    L = torch.tensor([300, 123], device=DEVICE)
    close(decode_attention(q, k, v, lengths=L, num_splits=num_splits), ref.attention(q, k, v, lengths=L))


def _one_launch_checks(dec, dtype, B, H, Hkv, D, window, lens, splits=(1, 2, 5)):
    """`dec` (kernels.triton_decode_attention or a mutant of it): in one launch, per split count, the output equals
    the two-launch path's (the same merge helper on the same partials: exactly, in the interpreter), the reference on
    rows with keys and zeros on rows without, and every merge counter is back to 0 (a graph replay starts clean)."""
    Tk = 300  # 5 splits of 64 keys (BLOCK_N 64; 2 x 32 at d128)
    q = rand(B, H, 1, D, dtype=dtype, seed=1)
    k, v = rand(B, Hkv, Tk, D, dtype=dtype, seed=2), rand(B, Hkv, Tk, D, dtype=dtype, seed=3)
    L = torch.tensor(lens, device=DEVICE)
    keep = L > 0
    exp = ref.attention(q[keep], k[keep], v[keep], causal=True, lengths=L[keep], window=window)
    for ns in splits:
        one = dec.decode_attention(q, k, v, lengths=L, num_splits=ns, window=window)
        two = dec.decode_attention(q, k, v, lengths=L, num_splits=ns, window=window, one_launch=False)
        if DEVICE == "cpu":
            assert torch.equal(one, two), ns
        close(one, two)
        close(one[keep], exp)
        assert one[~keep].abs().max() == 0 if not keep.all() else True
        assert dec.counters(q.device, 1).abs().max() == 0, ns


@pytest.mark.parametrize(
    "dtype,B,H,Hkv,D,window,lens",
    [
        (torch.float32, 3, 4, 4, 64, 0, [300, 0, 131]),  # per-head kernel, an empty and a full row
        (torch.float32, 1, 8, 4, 80, 0, [7]),  # group 2, d80: one key, the other splits empty
        (torch.bfloat16, 3, 8, 2, 128, 40, [300, 100, 0]),  # group 4, d128, a sliding window
        (torch.float16, 3, 8, 1, 64, 0, [1, 300, 65]),  # group 8
        (torch.float16, 1, 3, 3, 80, 70, [300]),  # per-head, d80, a window across a split boundary
    ],
)
def test_decode_attention_one_launch(dtype, B, H, Hkv, D, window, lens):
    """Decode attention in one launch (the splits merged by the program that draws the last ticket; one split
    written straight into the output) against the two-launch path and the reference, forced split counts 1, 2, 5."""
    from speechrt.kernels import triton_decode_attention as dec

    assert dec.ONE_LAUNCH is None and dec.merges_in_launch()  # not ROCm: the default merges in the launch
    _one_launch_checks(dec, dtype, B, H, Hkv, D, window, lens)


def test_decode_attention_on_rocm_merges_in_a_second_launch(monkeypatch):
    """On ROCm (torch.version.hip set) several splits are merged by the reduce kernel's second launch by default (the
    one-launch merge's memory ordering is unverified on AMD); one split still writes its output in one launch;
    ONE_LAUNCH True / False forces either. The output is the reference's every way."""
    from triton.runtime.interpreter import InterpretedFunction

    from speechrt.kernels import triton_decode_attention as dec

    if not isinstance(dec._decode_attention_kernel, InterpretedFunction):
        pytest.skip("counts the interpreter's launches; the kernels are compiled for a GPU in this process")
    launched, run = [], InterpretedFunction.run
    monkeypatch.setattr(
        InterpretedFunction, "run", lambda self, *a, **k: launched.append(self.fn.__name__) or run(self, *a, **k)
    )
    monkeypatch.setattr(torch.version, "hip", "6.4")
    q, k, v = rand(2, 4, 1, 32, seed=1), rand(2, 4, 200, 32, seed=2), rand(2, 4, 200, 32, seed=3)
    L = torch.tensor([200, 77], device=DEVICE)
    exp = ref.attention(q, k, v, causal=True, lengths=L)
    for one_launch, ns, reduce in ((None, 1, False), (None, 3, True), (True, 3, False), (False, 1, True)):
        monkeypatch.setattr(dec, "ONE_LAUNCH", one_launch)
        launched.clear()
        close(dec.decode_attention(q, k, v, lengths=L, num_splits=ns), exp)
        assert launched == ["_decode_attention_kernel"] + ["_decode_reduce_kernel"] * reduce, (one_launch, ns)


@pytest.mark.parametrize("last", ["NUM_SPLITS - 2", "NUM_SPLITS"])
def test_decode_attention_merge_mutant_fails(tmp_path, last):
    """The checks above catch a merge by the wrong program: the module with the last-ticket test off by one fails
    them (NUM_SPLITS - 2: the next-to-last program merges before the last split is written and resets the counter,
    which the last then leaves at 1; NUM_SPLITS: no program merges). At 2 splits the first mutant would heal itself
    (the reset lets the last program draw ticket 0 and merge again), so 5."""
    from speechrt.kernels import triton_decode_attention as dec

    mutant = mutant_module(dec, "ticket == NUM_SPLITS - 1", f"ticket == {last}", 2, tmp_path)
    for H, Hkv in ((2, 2), (4, 2)):  # the per-head and the grouped kernel
        with pytest.raises(AssertionError):
            _one_launch_checks(mutant, torch.float32, 1, H, Hkv, 16, 0, [300], splits=(5,))


def test_decode_attention_counters_persist():
    """One zeroed counter buffer per (device, thread), the same tensor across calls (a captured graph holds its
    address), grown to B x key/value heads when a call needs more, the smaller one kept alive."""
    from speechrt.kernels import triton_decode_attention as dec

    dev = torch.device(DEVICE)
    a = dec.counters(dev, 8)
    assert a.dtype == torch.int32 and a.numel() >= dec.MIN_COUNTERS and dec.counters(dev, 8) is a
    b = dec.counters(dev, a.numel() + 1)
    assert b.numel() == a.numel() + 1 and b.abs().max() == 0 and dec.counters(dev, 8) is b
    assert any(x is a for bufs in dec._COUNTERS.values() for x in bufs)


@torch.inference_mode()
def test_llama_fused_decode_step_launches(monkeypatch):
    """The fused Llama decode step's launches, counted in the interpreter on a tiny random model (SmolLM2's layout:
    grouped heads) over a cache long enough to split: the embeddings and key counts, per layer the four fused kernels
    and ONE decode attention (the splits merged in the same launch; two launches before), then the final norm folded
    into the logits. SmolLM2-135M's 30 layers: 152 launches a step (its down projection's K, 1536, splits in 3, merged
    in the same launch). Each launch passes triton_pdl's arguments; no torch op computes anything."""
    from triton.runtime.interpreter import InterpretedFunction

    from speechrt.kernels import triton_decode_attention as dec
    from speechrt.kernels import triton_fused, triton_pdl
    from speechrt.models.llama import Llama, LlamaConfig, layer_tensors
    from speechrt.models.llama_fused import decode_range_fused

    if not isinstance(dec._decode_attention_grouped_kernel, InterpretedFunction):
        pytest.skip("counts the interpreter's launches; the kernels are compiled for a GPU in this process")
    cfg = LlamaConfig(vocab_size=50, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, hidden_dim=48, max_seq_len=300)
    D, g = cfg.dim // cfg.n_heads, torch.Generator().manual_seed(0)
    shape = {"wq": (4 * D, 32), "wk": (2 * D, 32), "wv": (2 * D, 32), "wo": (32, 4 * D), "w_gate": (48, 32)}
    shape.update(w_up=(48, 32), w_down=(32, 48), attn_norm=(32,), ffn_norm=(32,))
    w = {"tok_embeddings": torch.randn(50, 32, generator=g) * 0.2, "norm": torch.ones(32)}
    for i in range(cfg.n_layers):
        w.update({f"layers.{i}.{n}": torch.randn(shape[n], generator=g) * 0.2 for n in layer_tensors(cfg)})
    model = Llama(cfg, w, kernels.select("triton", "cpu"), torch.device("cpu"), "float32")
    cache = model.new_cache(2, 300)
    assert dec.config(2 * cfg.n_kv_heads, 300, D, 2)["NUM_SPLITS"] > 1  # the merge, not the one-split path
    step = (model, triton_fused.OPS, cache, 0, torch.tensor([3, 4]), torch.tensor([280, 5]), 300)
    decode_range_fused(*step)  # once before, as a graph's warm-up: the merge counters made (a zeros op)
    trace = LaunchTrace(monkeypatch)
    # every launch takes triton_pdl's arguments (on a Hopper GPU with it enabled: PDL and launch_pdl; here a marker)
    monkeypatch.setattr(triton_pdl, "args", lambda device: {"PDL": False})
    with trace.ops():
        decode_range_fused(*step)
    launched, gated = trace.launched, trace.gated
    assert trace.torch_ops == [], trace.torch_ops
    assert (
        launched.count("_decode_attention_grouped_kernel") == cfg.n_layers and "_decode_reduce_kernel" not in launched
    )
    assert launched[0] == "_token_inputs_kernel" and launched[-1] == "_norm_logits_kernel", launched
    assert len(launched) == 5 * cfg.n_layers + 2, launched
    assert all(gated), [n for n, g in zip(launched, gated) if not g]
    assert dec.counters(torch.device("cpu"), 1).abs().max() == 0


def test_pdl_launches_only_where_enabled_on_an_nvidia_sm_90_gpu(monkeypatch):
    """triton_pdl.args: PDL's constexpr and Triton's launch option only with ENABLED, on an NVIDIA GPU of compute
    capability 9.0 or later (a device faked here), with compiled kernels; nothing elsewhere (the plain kernels)."""
    from speechrt.kernels import triton_pdl

    cuda = torch.device("cuda", 0)
    monkeypatch.setattr(triton_pdl, "ENABLED", True)
    assert triton_pdl.args(torch.device("cpu")) == {}
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(torch.version, "hip", None)
    for capability, want in (((9, 0), {"PDL": True, "launch_pdl": True}), ((8, 0), {})):
        triton_pdl._capable.cache_clear()
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None, c=capability: c)
        assert triton_pdl.args(cuda) == want, capability
    assert triton_pdl.supported(cuda) is False
    triton_pdl._capable.cache_clear()
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: (9, 0))
    monkeypatch.setattr(torch.version, "hip", "6.4")
    assert triton_pdl.args(cuda) == {}  # ROCm
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert triton_pdl.args(cuda) == {}  # the interpreter
    monkeypatch.delenv("TRITON_INTERPRET")
    monkeypatch.setattr(triton_pdl, "ENABLED", False)
    assert triton_pdl.args(cuda) == {}
    triton_pdl._capable.cache_clear()


def test_split_rule_follows_the_devices_multiprocessor_count():
    """Splits along the cache until batch x key/value heads x splits reaches PROGRAMS_PER_SM per SM / CU: an
    MI300X's 304 CUs split a long cache twice as finely as an H100's 132 SMs; a short cache, or a batch that fills
    the device, is not split; never more splits than chunks of 4 key blocks."""
    from speechrt.kernels import triton_decode_attention as dec

    def splits(programs, Tk, sms, D=64):
        c = dec.config(programs, Tk, D, 4, target=dec.PROGRAMS_PER_SM * sms)
        assert c["NUM_SPLITS"] <= -(-Tk // (4 * c["BLOCK_N"])) and c["NUM_SPLITS"] * c["SPLIT_LEN"] >= Tk
        return c["NUM_SPLITS"]

    assert dec.PROGRAMS_PER_SM == 2 and dec.target_programs("cpu") == 2 * dec.DEFAULT_SMS  # no GPU: an H100's
    assert (splits(8 * 8, 4096, 132), splits(8 * 8, 4096, 304)) == (5, 10)  # batch 8, 8 kv heads, 4096 positions
    assert splits(1 * 8, 4096, 132) == splits(1 * 8, 4096, 304) == 16  # batch 1: as fine as 4 key blocks allow
    assert splits(64 * 8, 4096, 132) == splits(64 * 8, 4096, 108) == 1  # batch 64 fills the device
    assert splits(8, 200, 304) == 1  # a short cache


def test_decode_attention_empty_sequence_gives_zeros():
    """A sequence with no valid key (length 0) gets zeros, not NaN (the reference has no defined
    output there); the other sequences are unaffected."""
    from speechrt.kernels.triton_decode_attention import decode_attention

    q, k, v = rand(2, 2, 1, 16, seed=1), rand(2, 2, 50, 16, seed=2), rand(2, 2, 50, 16, seed=3)
    out = decode_attention(q, k, v, lengths=torch.tensor([0, 50], device=DEVICE), num_splits=3)
    assert torch.isfinite(out).all()
    assert out[0].abs().max() == 0
    close(out[1:], ref.attention(q[1:], k[1:], v[1:]))


def test_attention_rejects_bad_shapes(tri):
    with pytest.raises(ValueError, match="not a multiple"):
        tri.attention(rand(1, 5, 2, 8), rand(1, 2, 2, 8), rand(1, 2, 2, 8))
    with pytest.raises(ValueError, match="do not match"):
        tri.attention(rand(1, 2, 2, 8), rand(1, 2, 2, 16), rand(1, 2, 2, 16))
