"""The fused decode-step kernels (kernels/triton_fused.py) against their references (composed from the unfused
reference ops), in the Triton interpreter on the CPU: odd widths (dim 72, head_dim 24, hidden 200), grouped heads
(3 / 1), 1, 3 and 5 rows, an odd cache length, strided inputs, the Qwen2 bias and Qwen3 head norms, every dtype
the kernels claim, and a NaN that must reach the output. On a GPU: SPEECHRT_TEST_DEVICE=cuda (conftest.py)."""

from __future__ import annotations

import pytest
import torch
from fused_cases import DIM, HIDDEN, HKV, SLOTS, D, H, S, caches, qkv_case, quantized, strided_rows  # tests/
from kernel_checks import DEVICE, DTYPES, close, rand  # tests/kernel_checks.py

from speechrt.kernels import reference as ref

pytestmark = pytest.mark.usefixtures("interpret")


@pytest.fixture(scope="module")
def fused():
    from speechrt.kernels import triton_fused

    return triton_fused


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("M,bias,qk_norm", [(1, False, False), (3, True, False), (5, False, True)])
def test_norm_qkv_rope(fused, dtype, M, bias, qk_norm):
    """Q equals the reference's; the keys and values land at each row's (slot, position) and nothing else in
    the cache changes."""
    x, kw = qkv_case(M, dtype, bias, qk_norm)
    kc, vc = caches(dtype)
    rk, rv = kc.clone(), vc.clone()
    close(fused.norm_qkv_rope(x, k_cache=kc, v_cache=vc, **kw), ref.norm_qkv_rope(x, k_cache=rk, v_cache=rv, **kw))
    close(kc, rk)
    close(vc, rv)
    untouched = torch.ones(SLOTS, S, dtype=torch.bool)
    untouched[torch.arange(1, 1 + M), kw["pos"].cpu()] = False
    assert torch.equal(kc.permute(0, 2, 1, 3)[untouched], caches(dtype)[0].permute(0, 2, 1, 3)[untouched])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("M", [1, 5])
def test_norm_logits(fused, dtype, M):
    """The final RMSNorm folded into the output projection (97 columns: a ragged last tile; rows strided), float32 out:
    the reference's (norm, projection in the activations' dtype, then float32), and in 16 bits no further from the
    float32 truth than it (x1.5); no rows, no launch."""
    x = strided_rows(M, DIM, dtype, 90)
    g, w = rand(DIM, dtype=dtype, seed=91, scale=0.5) + 1, rand(97, DIM, dtype=dtype, seed=92, scale=DIM**-0.5)
    got = fused.norm_logits(x, g, 1e-5, w)
    assert got.dtype == torch.float32 and got.shape == (M, 97)
    assert torch.equal(got.to(dtype).float(), got)  # values of the activations' dtype, as the reference's
    want, truth = ref.norm_logits(x, g, 1e-5, w), ref.norm_logits(x.float(), g.float(), 1e-5, w.float())
    close(got.to(dtype), want.to(dtype), truth)
    assert fused.norm_logits(x[:0], g, 1e-5, w).shape == (0, 97)


@pytest.mark.parametrize("dtype", DTYPES)
def test_token_inputs(fused, dtype):
    """The Llama step's embeddings of tokens given as a strided column (as a step's [N, 1] tokens are), an odd
    width, and each row's key count pos + 1 in int32: exactly the reference's; no rows, no launch; an embedding
    without a unit column stride refused."""
    emb = rand(97, DIM + 5, dtype=dtype, seed=80)[:, :DIM]  # rows strided by DIM + 5
    tokens = torch.tensor([[5, 0], [96, 0], [0, 0]], device=DEVICE)[:, 0]
    pos = torch.tensor([12, 0, 7], device=DEVICE)
    got, want = fused.token_inputs(tokens, emb, pos), ref.token_inputs(tokens, emb, pos)
    assert torch.equal(got[0], want[0]) and got[0].dtype == dtype
    assert torch.equal(got[1], want[1]) and got[1].dtype == torch.int32 and got[1].tolist() == [13, 1, 8]
    none = fused.token_inputs(tokens[:0], emb, pos[:0])
    assert none[0].shape == (0, DIM) and none[1].shape == (0,)
    with pytest.raises(ValueError, match="unit column stride"):
        fused.token_inputs(tokens, emb.t().contiguous().t(), pos)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("M", [1, 3, 5])
def test_linear_residual(fused, dtype, M):
    x = strided_rows(M, H * D, dtype, 10)
    w = rand(DIM, H * D, dtype=dtype, seed=11, scale=(H * D) ** -0.5)
    if M == 3:  # the weight as a transposed view too (column stride DIM): the kernel takes both strides
        w = w.t().contiguous().t()
    r = rand(M, DIM, dtype=dtype, seed=12)
    close(fused.linear_residual(x, w, r), ref.linear_residual(x, w, r))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("M", [1, 3, 5])
def test_norm_gate_up(fused, dtype, M):
    x = strided_rows(M, DIM, dtype, 20)
    g = rand(DIM, dtype=dtype, seed=21, scale=0.5) + 1
    w = rand(2 * HIDDEN, DIM, dtype=dtype, seed=22, scale=DIM**-0.5)
    truth = ref.norm_gate_up(x.float(), g.float(), 1e-5, w.float())
    close(fused.norm_gate_up(x, g, 1e-5, w), ref.norm_gate_up(x, g, 1e-5, w), truth)


def test_nan_propagates(fused):
    """A NaN in a row's input reaches that row's outputs (norm's sum of squares, the products), never
    another row's: no kernel turns it into a finite value."""
    dtype = torch.float32
    x, kw = qkv_case(3, dtype, qk_norm=True)
    x[1, 5] = float("nan")
    kc, vc = caches(dtype)
    q = fused.norm_qkv_rope(x, k_cache=kc, v_cache=vc, **kw)
    assert q[1].isnan().all() and torch.isfinite(q[[0, 2]]).all()
    assert kc[2, 0, 0].isnan().all() and vc[2, 0, 0].isnan().all()  # row 1: slot s0 + 1, position 0
    assert torch.isfinite(kc[1, 0, 12]).all() and torch.isfinite(vc[3, 0, 7]).all()
    w = rand(2 * HIDDEN, DIM, seed=22, scale=DIM**-0.5)
    y = fused.norm_gate_up(x, kw["norm_w"], 1e-5, w)
    assert y[1].isnan().all() and torch.isfinite(y[[0, 2]]).all()
    r = rand(3, DIM, seed=12)
    r[2, 3] = float("nan")
    y = fused.linear_residual(rand(3, H * D, seed=10), rand(DIM, H * D, seed=11), r)
    assert y[2, 3].isnan() and torch.isfinite(y[:2]).all() and torch.isfinite(y[2, :3]).all()


# The Whisper decoder step's ops (kernels/triton_fused_whisper.py): LayerNorm folded into the projection that reads it
WH = DIM // D  # Whisper: as many key/value heads as query heads, dim = heads x head_dim


@pytest.fixture(scope="module")
def fused_whisper():
    from speechrt.kernels import triton_fused_whisper

    return triton_fused_whisper


def ln_params(dtype, seed, n=DIM):
    """A LayerNorm's weight and bias away from 1 and 0."""
    return rand(n, dtype=dtype, seed=seed, scale=0.5) + 1, rand(n, dtype=dtype, seed=seed + 1, scale=0.3)


def offset_rows(m, dtype, seed):
    """Rows whose mean is far from zero next to their spread (30 +- 1; Whisper's residual stream has channels that
    large): a fold applied after the matmul (rstd (W x g) - rstd mean (W g) + W b) misses float32's 1e-5 there (2.3e-5
    of the largest output at d 384 against 2.1e-6 for the two-pass LayerNorm, measured in float64)."""
    return strided_rows(m, DIM, dtype, seed) + 30


def f32(a):
    """A floating tensor in float32 (the reference's float32 truth); anything else as it is."""
    return a.float() if isinstance(a, torch.Tensor) and a.is_floating_point() else a


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("M", [1, 3, 5])
def test_norm_qkv_cache(fused_whisper, dtype, M):
    """Q equals the reference's; K and V land at each row's position of its own cache row, and nothing else in the
    caches changes. Row 1 of 3 writes position 0; 5 rows share one position (a stride-0 pos, as the decode step's)."""
    x = offset_rows(M, dtype, 30)
    g, b = ln_params(dtype, 31)
    w = rand(3 * DIM, DIM, dtype=dtype, seed=33, scale=DIM**-0.5)
    bias = rand(3 * DIM, dtype=dtype, seed=34)
    pos = torch.tensor([7], device=DEVICE).expand(M) if M == 5 else torch.tensor([12, 0, 7][:M], device=DEVICE)
    kc = rand(SLOTS, WH, S, D, dtype=dtype, seed=35)[:M]
    vc = rand(SLOTS, WH, S, D, dtype=dtype, seed=36)[:M]
    rk, rv = kc.clone(), vc.clone()
    args = (x, g, b, 1e-5, w, bias, pos)
    truth = ref.norm_qkv_cache(*(f32(a) for a in args), rk.float(), rv.float())
    close(fused_whisper.norm_qkv_cache(*args, kc, vc), ref.norm_qkv_cache(*args, rk, rv), truth)
    close(kc, rk)
    close(vc, rv)
    untouched = torch.ones(M, S, dtype=torch.bool)
    untouched[torch.arange(M), pos.cpu()] = False
    before = rand(SLOTS, WH, S, D, dtype=dtype, seed=35)[:M].permute(0, 2, 1, 3)
    assert torch.equal(kc.permute(0, 2, 1, 3)[untouched], before[untouched])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("M,act,n", [(1, None, 51), (3, "gelu", HIDDEN), (5, None, DIM)])
def test_norm_linear(fused_whisper, dtype, M, act, n):
    """LayerNorm + projection + bias (an odd width of 51, as a vocabulary's, out in float32 as the logits are), and +
    GELU (the MLP's fc1)."""
    x = offset_rows(M, dtype, 40)
    g, b = ln_params(dtype, 41)
    w = rand(n, DIM, dtype=dtype, seed=43, scale=DIM**-0.5)
    if M == 5:  # the weight as a transposed view (column stride n): the kernel takes both strides
        w = w.t().contiguous().t()
    bias = rand(n, dtype=dtype, seed=44) if M != 5 else None
    args = (x, g, b, 1e-5, w, bias)
    kw = {"act": act, "out_dtype": torch.float32 if n == 51 else None}
    truth = ref.norm_linear(*(f32(a) for a in args), **kw)
    out, want = fused_whisper.norm_linear(*args, **kw), ref.norm_linear(*args, **kw)
    if n == 51:  # the float32 logits hold the activation dtype's values (rounded there, as the unfused path's)
        assert out.dtype == torch.float32 and torch.equal(out.to(dtype).float(), out)
        out, want, truth = out.to(dtype), want.to(dtype), truth.to(dtype)
    close(out, want, truth)


@pytest.mark.parametrize("dtype", DTYPES)
def test_linear_residual_bias(fused, dtype):
    x = strided_rows(3, DIM, dtype, 50)
    w = rand(DIM, DIM, dtype=dtype, seed=51, scale=DIM**-0.5)
    r, bias = rand(3, DIM, dtype=dtype, seed=52), rand(DIM, dtype=dtype, seed=53)
    close(fused.linear_residual(x, w, r, bias), ref.linear_residual(x, w, r, bias))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("B,cross", [(1, False), (3, True)])
def test_step_inputs(fused_whisper, dtype, B, cross):
    """The token + position embeddings (the tokens a strided column, as the step's [B, 1] tokens are) and the int32
    key counts: exactly the reference's."""
    emb, pemb = rand(97, DIM, dtype=dtype, seed=70), rand(S, DIM, dtype=dtype, seed=71)
    tokens = torch.tensor([[5, 0], [96, 0], [0, 0]], device=DEVICE)[:B, 0]
    position = torch.tensor([S - 1], device=DEVICE)
    cl = torch.tensor([12, 7, 9], device=DEVICE)[:B] if cross else None
    got, want = (
        fused_whisper.step_inputs(tokens, emb, pemb, position, cl),
        ref.step_inputs(tokens, emb, pemb, position, cl),
    )
    assert torch.equal(got[0], want[0]) and got[0].dtype == dtype
    assert torch.equal(got[1], want[1]) and got[1].dtype == torch.int32 and got[1].tolist() == [S] * B
    assert (got[2] is None and want[2] is None) if not cross else torch.equal(got[2], want[2])


def test_whisper_ops_nan_confined(fused_whisper):
    """A NaN in one row's input reaches that row's outputs (its mean, its variance), never another row's; rows past
    the last, masked in the kernel, are not written."""
    x = offset_rows(3, torch.float32, 60)
    x[1, 5] = float("nan")
    g, b = ln_params(torch.float32, 61)
    w = rand(3 * DIM, DIM, seed=63, scale=DIM**-0.5)
    kc, vc = torch.zeros(3, WH, S, D, device=DEVICE), torch.zeros(3, WH, S, D, device=DEVICE)
    q = fused_whisper.norm_qkv_cache(x, g, b, 1e-5, w, None, torch.tensor([2, 2, 2], device=DEVICE), kc, vc)
    assert q[1].isnan().all() and torch.isfinite(q[[0, 2]]).all()
    assert kc[1, :, 2].isnan().all() and vc[1, :, 2].isnan().all()
    assert torch.isfinite(kc[[0, 2]]).all() and torch.isfinite(vc[[0, 2]]).all()
    assert (kc[:, :, [0, 1, 3]] == 0).all()
    y = fused_whisper.norm_linear(x, g, b, 1e-5, w[:HIDDEN], act="gelu")
    assert y[1].isnan().all() and torch.isfinite(y[[0, 2]]).all()
    with pytest.raises(ValueError, match="act is None or 'gelu'"):
        fused_whisper.norm_linear(x, g, b, 1e-5, w, act="relu")


# The same ops on quantized weights (kernels/triton_fused_quant.py) against kernels/reference_quant.py (the weight
# dequantized, then the references above): int4 in groups of 32 / 64 / 128 (K 96 / 192 / 128: the dims an int4
# tile needs), FP8 E4M3 and int8 per output channel (K 72 and 100: not a multiple of the K tile), odd N
# (37 outputs, a hidden width of 45)
QUANT = [("int4", 32, 96), ("int4", 64, 192), ("int4", 128, 128), ("fp8", 0, DIM), ("int8", 0, 100)]


@pytest.fixture(scope="module")
def fq():
    from speechrt.kernels import triton_fused_quant

    return triton_fused_quant


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fmt,G,K", QUANT)
@pytest.mark.parametrize("M,bias,qk_norm", [(1, False, False), (5, True, True)])
def test_quant_norm_qkv_rope(fq, dtype, fmt, G, K, M, bias, qk_norm):
    """Q, K and V of the quantized projection (+ the Qwen2 bias, + the Qwen3 head norms, grouped heads) equal the
    reference's, at each row's (slot, position)."""

    x, kw = qkv_case(M, dtype, bias, qk_norm, seed=K + M, dim=K)
    kw["wqkv"], _ = quantized(fmt, G, (H + 2 * HKV) * D, K, seed=M)
    kc = quant_qkv_equals_reference(fq, x, kw, dtype)
    assert not torch.equal(kc, caches(dtype)[0])


def quant_qkv_equals_reference(fq, x, kw, dtype):
    """fq.norm_qkv_rope's Q and cache writes against reference_quant's on fresh caches -> the caches it wrote."""
    from speechrt.kernels import reference_quant as rq

    kc, vc = caches(dtype)
    rk, rv = kc.clone(), vc.clone()
    close(fq.norm_qkv_rope(x, k_cache=kc, v_cache=vc, **kw), rq.norm_qkv_rope(x, k_cache=rk, v_cache=rv, **kw))
    close(kc, rk)
    close(vc, rv)
    return kc


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fmt,G,K", QUANT)
def test_quant_linear_residual_and_norm_gate_up(fq, dtype, fmt, G, K):
    """The o / down projection + residual (37 outputs) and RMSNorm + gate / up + SiLU (hidden 45) of 3 rows: the
    reference's, and in 16 bits no further from the float32 truth than the reference (x1.5)."""
    from speechrt.kernels import reference_quant as rq

    x = strided_rows(3, K, dtype, K)
    w, wf = quantized(fmt, G, 37, K, seed=1)
    r = rand(3, 37, dtype=dtype, seed=2)
    truth = ref.linear_residual(x.float(), wf, r.float())
    close(fq.linear_residual(x, w, r), rq.linear_residual(x, w, r), truth)
    g = rand(K, dtype=dtype, seed=3, scale=0.5) + 1
    w, wf = quantized(fmt, G, 90, K, seed=4)
    truth = ref.norm_gate_up(x.float(), g.float(), 1e-5, wf)
    close(fq.norm_gate_up(x, g, 1e-5, w), rq.norm_gate_up(x, g, 1e-5, w), truth)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fmt,G,K", [("int4", 128, 1024), ("fp8", 0, 1200)])
def test_quant_linear_residual_split_k(fq, dtype, fmt, G, K):
    """A one-row step's projection + residual (+ a bias) with K split among programs (int4: 2 splits of 512; fp8: 640
    and 560, the last not a whole K tile), their float32 partial sums added up by the tile's last split."""
    from speechrt.kernels import reference_quant as rq

    x = rand(1, K, dtype=dtype, seed=6)
    w, wf = quantized(fmt, G, 37, K, seed=7)
    r, b = rand(1, 37, dtype=dtype, seed=8), rand(37, dtype=dtype, seed=9)
    from speechrt.kernels import triton_fused_split as fs

    bk = fq.fused_config(fq.FORMATS[w[0].dtype], G)(1, dtype)["BLOCK_K"]
    assert fs.k_splits(2, K, bk, DEVICE) == ((2, 512) if G else (2, 640))  # 37 columns: 2 tiles
    truth = ref.linear_residual(x.float(), wf, r.float(), b.float())
    close(fq.linear_residual(x, w, r, b), rq.linear_residual(x, w, r, b), truth)


@pytest.mark.parametrize("fmt,G,K", [QUANT[0], QUANT[3]])
def test_quant_nan_confined_and_bad_weights(fq, fmt, G, K):
    """A NaN in a row's input reaches that row's outputs, never another row's; a weight the kernels cannot read is
    refused in one line that says what is valid."""
    x = strided_rows(3, K, torch.bfloat16, 5)
    x[1, 7] = float("nan")
    g = rand(K, dtype=torch.bfloat16, seed=3) + 1
    w, _ = quantized(fmt, G, 90, K, seed=4)
    y = fq.norm_gate_up(x, g, 1e-5, w)
    assert y[1].isnan().all() and torch.isfinite(y[[0, 2]]).all()
    y = fq.linear_residual(x, quantized(fmt, G, 37, K, seed=1)[0], rand(3, 37, dtype=torch.bfloat16, seed=2))
    assert y[1].isnan().all() and torch.isfinite(y[[0, 2]]).all()
    with pytest.raises(ValueError, match="valid: "):
        fq.norm_gate_up(x[:, :-32], g, 1e-5, w)
    with pytest.raises(TypeError, match="float8_e4m3fn or int8, not torch.int32"):
        fq.norm_gate_up(x, g, 1e-5, (w[0].to(torch.int32), w[1]))


# K split among programs (kernels/triton_fused_split.py): float (K 150: the last split 22 columns, not a whole K tile of
# 64; K 1024: the split the rule itself picks for these 5 tiles on the CPU, 2 of 512), int4 (G 32: 3 splits of one
# group's tile), fp8 and int8 (3 and 2 splits), forced through SPLITS where the rule would not split a tiny shape
F32, F16, BF16 = DTYPES
SPLIT_CASES = [("float", 0, 150, 3, t) for t in DTYPES] + [("float", 0, 1024, None, BF16)]
SPLIT_CASES += [("int4", 32, 96, 3, t) for t in DTYPES] + [("fp8", 0, 150, 2, t) for t in (F32, BF16)]
SPLIT_CASES += [("int8", 0, 150, 3, F16)]


@pytest.mark.parametrize("fmt,G,K,splits,dtype", SPLIT_CASES)
def test_split_k_ops(fq, monkeypatch, dtype, fmt, G, K, splits):
    """norm_qkv_rope (1 row; and 3 rows at positions 12, 0 and 7 with the Qwen2 bias and the Qwen3 head norms),
    norm_gate_up and linear_residual (3 rows; with Whisper's bias) with K split: each split's partial sums (and sums
    of squares), added up in order by each tile's last split (rstd, bias, head norms, rotary, cache writes; SiLU;
    bias and residual), equal the reference's (the second launch: test_fused_merge.py)."""
    from speechrt.kernels import reference_quant as rq
    from speechrt.kernels import triton_fused_split as fs

    monkeypatch.setattr(fs, "SPLITS", splits)
    bk = 32 if fmt == "int4" else 64  # the K tile of these shapes (fused_config / config)
    want = 2 if splits is None else splits
    assert fs.k_splits(5, K, bk, DEVICE, splits)[0] == want and fs.k_splits(2, K, bk, DEVICE, splits)[0] == want
    for M, extras in ((1, False), (3, True)):
        x, kw = qkv_case(M, dtype, extras, extras, seed=K + M, dim=K)
        if fmt != "float":
            kw["wqkv"], _ = quantized(fmt, G, (H + 2 * HKV) * D, K, seed=M)
        quant_qkv_equals_reference(fq, x, kw, dtype)
    g = rand(K, dtype=dtype, seed=3, scale=0.5) + 1
    w, wf = (
        quantized(fmt, G, 90, K, seed=4) if fmt != "float" else (rand(90, K, dtype=dtype, seed=4, scale=K**-0.5),) * 2
    )
    truth = ref.norm_gate_up(x.float(), g.float(), 1e-5, wf.float())
    close(fq.norm_gate_up(x, g, 1e-5, w), rq.norm_gate_up(x, g, 1e-5, w), truth)
    r, b = rand(3, 90, dtype=dtype, seed=5), rand(90, dtype=dtype, seed=6)
    truth = ref.linear_residual(x.float(), wf.float(), r.float(), b.float())
    close(fq.linear_residual(x, w, r, b), rq.linear_residual(x, w, r, b), truth)


def test_split_rule_at_model_shapes(monkeypatch):
    """The rule's splits of a one-row step on an H100 (132 SMs: 264 programs aimed at): Llama-3.2-1B's norm_qkv_rope
    (96 tiles; Qwen3: 48 whole heads) splits K 2048 in 3 (4: 8 K tiles a split at least), its gate/up (256 tiles)
    does not, its o and down projections (64 tiles, K 2048 and 8192) in 4 and 5; SmolLM2-135M's norm-folded ops (30
    and 48 tiles, K 576: 9 tiles of 64) and o projection (18) do not (int4's K tile of 32 at G 32: in 2), its down
    projection (K 1536) in 3; SPLITS overrides the rule."""
    from speechrt.kernels import triton_fused_split as fs

    monkeypatch.setattr(fs, "target_programs", lambda device=None: 264)  # what an H100 reports
    assert fs.k_splits(96, 2048, 64) == (3, 704) and fs.k_splits(48, 2048, 64) == (4, 512)
    assert fs.k_splits(256, 2048, 64) == (1, 2048)
    assert fs.k_splits(30, 576, 64) == (1, 576) and fs.k_splits(48, 576, 64) == (1, 576)
    assert fs.k_splits(30, 576, 32) == (2, 288)
    assert fs.k_splits(64, 2048, 64) == (4, 512) and fs.k_splits(64, 8192, 64) == (5, 1664)
    assert fs.k_splits(18, 576, 64) == (1, 576) and fs.k_splits(18, 1536, 64) == (3, 512)
    assert fs.k_splits(256, 2048, 64, splits=1) == (1, 2048) and fs.k_splits(96, 2048, 64, splits=2) == (2, 1024)


def test_tiles_knob(fused):
    """triton_fused.TILES: unset, the float ops' tiles are config()'s defaults; set (using_tiles), its entries replace
    them (BLOCK_HALF but where whole heads are needed) and the ops still equal their references, K split or not;
    restored after the block, an exception too; an unknown tile is refused."""
    assert fused.TILES is None
    for M, half, whole in ((1, None, False), (8, 12, False), (16, 12, True), (40, None, False)):
        for dtype in (torch.bfloat16, torch.float32):
            assert fused.tiles(M, dtype, half, whole) == fused.config(M, dtype, half, whole)
    assert fused.config(1, torch.bfloat16) == dict(BLOCK_M=16, BLOCK_K=64, num_warps=4, num_stages=2, BLOCK_N=32)
    assert fused.config(40, torch.bfloat16, 12) == dict(
        BLOCK_M=32, BLOCK_K=64, num_warps=4, num_stages=2, BLOCK_HALF=16
    )
    t = {"BLOCK_N": 64, "BLOCK_K": 16, "BLOCK_HALF": 8, "num_warps": 2, "num_stages": 3}
    with fused.using_tiles(t):
        assert fused.tiles(3, torch.float32) == dict(BLOCK_M=16, BLOCK_K=16, num_warps=2, num_stages=3, BLOCK_N=64)
        assert fused.tiles(3, torch.float32, 12)["BLOCK_HALF"] == 8
        assert fused.tiles(3, torch.float32, 12, whole_head=True)["BLOCK_HALF"] == 16  # the whole head, as config()
        x, kw = qkv_case(3, torch.float32)
        kc, vc = caches(torch.float32)
        rk, rv = kc.clone(), vc.clone()
        close(fused.norm_qkv_rope(x, k_cache=kc, v_cache=vc, **kw), ref.norm_qkv_rope(x, k_cache=rk, v_cache=rv, **kw))
        close(kc, rk), close(vc, rv)
        x, w, r = rand(3, HIDDEN, seed=1), rand(DIM, HIDDEN, seed=2, scale=HIDDEN**-0.5), rand(3, DIM, seed=3)
        close(fused.linear_residual(x, w, r), ref.linear_residual(x, w, r))  # K 200: 13 K tiles, no split
        g, wgu = rand(DIM, seed=4) + 1, rand(2 * HIDDEN, DIM, seed=5, scale=DIM**-0.5)
        close(fused.norm_gate_up(x[:, :DIM], g, 1e-5, wgu), ref.norm_gate_up(x[:, :DIM], g, 1e-5, wgu))
    assert fused.TILES is None
    with pytest.raises(RuntimeError), fused.using_tiles(t):
        raise RuntimeError("restored anyway")
    assert fused.TILES is None
    with fused.using_tiles({"BLOCK_Q": 8}), pytest.raises(ValueError, match="unknown tile 'BLOCK_Q'; valid: BLOCK_N"):
        fused.tiles(1, torch.float32)
