"""kernels/cpu_decode (the AVX2 Llama decode step) against its definitions: the block matmul against
kernels.reference.block_linear on fresh random inputs and odd shapes, the packed layout against the blocks it
was given, and a whole decode step of a small random Llama against the torch model run with the same
(emulated) matmuls."""

from __future__ import annotations

import pytest
import torch

from speechrt import kernels
from speechrt.kernels import cpu_decode
from speechrt.kernels.reference import block_linear
from speechrt.models.llama import Llama, LlamaConfig, rope_tables
from speechrt.models.llama_layers import quantize_int4

pytestmark = pytest.mark.skipif(
    cpu_decode.unavailable() is not None, reason=f"the AVX2 decode step cannot run here: {cpu_decode.unavailable()}"
)


def _q4(N, K, g):
    q = torch.randint(0, 16, (N, K), dtype=torch.uint8, generator=g)
    d = torch.rand(N, K // 32, generator=g) * 0.02 + 1e-3
    z = torch.randn(N, K // 32, generator=g) * 0.05
    return q, d, z


def _rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def _agree(got: list, want: list, tight: float) -> None:
    """Logits rows of the kernel and of its definition run in torch: all within 5e-2, most within `tight`
    (1e-4 where inputs are quantized once, 1e-3 where in two terms). Float sums in another order can move an
    activation across a rounding boundary of its quantization, which moves that row's logits by ~1e-2 here
    (the remainder of a `fine` quantization crosses them more often, by less); a wrong layout, scale or offset
    moves every row by 0.3 or more."""
    errs = [_rel(a, b) for a, b in zip(got, want)]
    assert len(errs) >= 3 and max(errs) < 5e-2, errs
    assert sum(e < tight for e in errs) >= 0.6 * len(errs), errs


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize(
    "N,K,M", [(1, 32, 1), (13, 64, 3), (200, 576, 1), (577, 1536, 8), (96, 96, 17), (1031, 160, cpu_decode.MAX_ROWS)]
)
def test_block_matmul_matches_definition(bits, N, K, M):
    g = torch.Generator().manual_seed(N * K + M + bits)
    if bits == 4:
        q, d, z = _q4(N, K, g)
        p = cpu_decode.Packed.q4(q, d, z)
        d, z = d.half().float(), z.half().float()  # the layout keeps fp16 scales
    else:
        w = torch.randn(N, K, generator=g) * torch.rand(N, 1, generator=g)
        p = cpu_decode.Packed.q8(w)
        q, d, z = p.blocks()
        # half a step of rounding, and the scale kept in fp16 (127 steps x 2^-11 of it)
        assert (q.float() * d.repeat_interleave(32, 1) - w).abs().max() <= 0.57 * d.max()
    got = p.blocks()
    assert torch.equal(got[0].to(q.dtype), q) and torch.equal(got[1], d)
    assert (got[2] is None and z is None) or torch.equal(got[2], z)
    x = torch.randn(M, K, generator=g) * 3
    x[0, :5] *= 40  # an outlier block, as RMSNorm outputs have
    exact = (
        x.double()
        @ (q.double() - (8 if z is not None else 0))
        .mul(d.repeat_interleave(32, 1))
        .add(z.repeat_interleave(32, 1) if z is not None else 0)
        .t()
    )
    for threads in (1, 2):
        y = p(x, threads)
        assert y.shape == (M, N) and torch.isfinite(y).all()
        assert _rel(y, block_linear(x, q, d, z)) < 1e-5
    if M <= cpu_decode.MAX_ROWS // 2:  # the inputs in two int8 terms: the float matmul to ~1e-4
        y = p(x, 2, fine=True)
        assert _rel(y, block_linear(x, q, d, z, fine=True)) < 1e-5
        assert _rel(y, exact) < 2e-4 < _rel(p(x, 2), exact)


def test_q8_keeps_q8_0_blocks_exactly():
    """A GGUF Q8_0 tensor's dequantized values (d fp16, |q| up to 127 in each block) pack back to its blocks."""
    g = torch.Generator().manual_seed(3)
    q = torch.randint(-127, 128, (24, 96), generator=g)
    q[:, ::32] = 127  # Q8_0: max |q| is 127 in every block
    d = (torch.rand(24, 3, generator=g) * 0.01).half().float()
    bq, bd, _ = cpu_decode.Packed.q8(q.float() * d.repeat_interleave(32, 1)).blocks()
    assert torch.equal(bq.long(), q) and torch.equal(bd, d)


def test_nan_and_bad_shapes():
    g = torch.Generator().manual_seed(4)
    p = cpu_decode.Packed.q4(*_q4(16, 64, g))
    x = torch.randn(2, 64, generator=g)
    x[1, 40] = float("nan")
    y = p(x)
    assert torch.isfinite(y[0]).all() and torch.isnan(y[1]).all()
    x[1, 40] = float("inf")
    assert torch.isnan(p(x)[1]).all()
    with pytest.raises(ValueError, match="multiple of 32"):
        cpu_decode.Packed.q4(torch.zeros(4, 40, dtype=torch.uint8), torch.ones(4, 1), torch.ones(4, 1))
    with pytest.raises(ValueError, match=r"x must be \[1\.\.64, 64\]"):
        p(torch.zeros(65, 64))


def _emulating(cpu: cpu_decode.CpuLlama, cfg, w):
    """A float32 Llama of weights `w` whose kernel set's `linear` is the block matmul's definition on the
    kernel's own packed weights (matched to the model's linears in order; `fine` as the model's `fine`
    says), attending over fp16-rounded keys and values."""
    ops = kernels.select("torch", torch.device("cpu"))
    by_ptr = {}

    def linear(x, weight, bias=None):
        y = block_linear(x.reshape(-1, x.shape[-1]), *by_ptr[weight.data_ptr()].blocks(), fine=model.fine)
        return y.float().view(*x.shape[:-1], -1)

    def attention(q, k, v, **kw):  # keys and values as the kernel's fp16 cache holds them
        return ops.attention(q, k.half().float(), v.half().float(), **kw)

    table = {n: getattr(ops, n) for n in ops.names()}
    table["linear"], table["attention"] = linear, attention
    model = Llama(cfg, w, kernels.KernelSet("torch", torch.device("cpu"), table, {}), torch.device("cpu"), "float32")
    model.fine = False  # True: the matmuls as the kernel's `fine` calls (prompts)
    lins = [lin for L in model.layers for lin in (L.wqkv, L.wo, L.w_gate_up, L.w_down)] + [model.output]
    assert len(lins) == len(cpu.packs)
    by_ptr.update({lin.weight.data_ptr(): p for lin, p in zip(lins, cpu.packs)})
    return model


def _small_llama(g, q8_names=(), threads=2, tied=True):
    cfg = LlamaConfig(
        vocab_size=301, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, hidden_dim=96, max_seq_len=160, tie_embeddings=tied
    )
    shapes = {
        "wq": (64, 64),
        "wk": (32, 64),
        "wv": (32, 64),
        "wo": (64, 64),
        "w_gate": (96, 64),
        "w_up": (96, 64),
        "w_down": (64, 96),
    }
    w = {"tok_embeddings": torch.randn(301, 64, generator=g), "norm": 1 + 0.1 * torch.randn(64, generator=g)}
    if not tied:
        w["output"] = torch.randn(301, 64, generator=g) * 0.3
    q4 = {}
    for i in range(2):
        w[f"layers.{i}.attn_norm"] = 1 + 0.1 * torch.randn(64, generator=g)
        w[f"layers.{i}.ffn_norm"] = 1 + 0.1 * torch.randn(64, generator=g)
        for n, shape in shapes.items():
            name = f"layers.{i}.{n}"
            q, s, z = quantize_int4(torch.randn(*shape, generator=g) * 0.2)
            s, z = s.half().float(), z.half().float()  # what the layout keeps
            w[name] = ((q.float().view(q.shape[0], -1, 32) - 8) * s[..., None] + z[..., None]).view(q.shape)
            if n not in q8_names:
                q4[name] = (q, s, z)
    return cfg, w, q4, cpu_decode.CpuLlama(cfg, w, q4, *rope_tables(cfg), threads=threads)


@pytest.mark.parametrize("slots", [[0], [3, 1], [0, 1, 2, 3]])
@pytest.mark.parametrize(
    "q8_names,tied,fine", [((), True, False), ((), True, True), (("wk", "w_down"), True, True), ((), False, True)]
)
def test_forward_matches_the_model(slots, q8_names, tied, fine):
    """A small random Llama (GQA, odd vocabulary; some projections 8-bit; a head of its own or the embedding):
    prompts of different lengths, then a decode step of `slots`: the logits equal the torch model's run with the
    kernel's own block matmul definition and fp16 keys and values, and the cache holds the model's keys and
    values. Prompts `fine` (their matmuls' inputs in two int8 terms) or not."""
    g = torch.Generator().manual_seed(len(slots) + len(q8_names) + tied)
    cfg, w, q4, cpu = _small_llama(g, q8_names, tied=tied)
    assert [p.bits for p in cpu.packs[:4]] == [8 if "wk" in q8_names else 4, 4, 4, 8 if q8_names else 4]
    ref = _emulating(cpu, cfg, w)
    k, v = cpu.new_cache(4, 32)
    ref_cache = ref.new_cache(4, 32)
    got, want = [], []
    for s in range(4):  # prompts of different lengths, each one call
        p = torch.randint(0, 301, (3 + 5 * s,), generator=g)
        got.append(cpu(k, v, [s] * len(p), list(range(len(p))), p, [len(p) - 1], fine=fine)[0])
        ref.fine = fine
        want.append(ref.prefill(ref_cache, s, p))
        ref.fine = False
    assert _rel(k.float(), ref_cache.k) < 1e-3 and _rel(v.float(), ref_cache.v) < 1e-3  # fp16: 2^-11
    tokens = torch.randint(0, 301, (len(slots),), generator=g)
    step = cpu(k, v, slots, ref_cache.next_positions(slots), tokens)
    assert step.shape == (len(slots), 301) and torch.isfinite(step).all()
    decoded = list(ref.decode_step(ref_cache, slots, tokens))
    if fine:
        _agree(got, want, 1e-3)
        assert max(_rel(a, b) for a, b in zip(step, decoded)) < 5e-2
    else:
        _agree(got + list(step), want + decoded, 1e-4)
    with pytest.raises(ValueError, match="positions within its 32"):
        cpu(k, v, [0], [32], tokens[:1])
    with pytest.raises(RuntimeError, match="refused"):
        cpu(k, v, [0], [0], [301])  # past the vocabulary


@pytest.mark.parametrize("fine", [False, True])
def test_prompt_in_one_call_equals_token_by_token(fine):
    """A prompt's rows in one call (each row's keys written before any row attends) leave the cache and last
    logits that feeding it one token at a time does."""
    g = torch.Generator().manual_seed(9)
    cfg, w, q4, cpu = _small_llama(g)
    p = torch.randint(0, 301, (11,), generator=g)
    k1, v1 = cpu.new_cache(1, 16)
    k2, v2 = cpu.new_cache(1, 16)
    a = cpu(k1, v1, [0] * 11, list(range(11)), p, [10], fine=fine)[0]
    for i in range(11):
        b = cpu(k2, v2, [0], [i], p[i : i + 1], fine=fine)[0]
    assert torch.equal(k1, k2) and torch.equal(v1, v2) and torch.equal(a, b)


def test_long_context_split_into_parts():
    """A prompt of 120 positions in four calls, then steps of one sequence, whose kv heads' positions split into
    parts of 64 and merge: the logits are the model's, and the same bits on 1, 2 or 4 threads."""
    g = torch.Generator().manual_seed(11)
    cfg, w, q4, cpu = _small_llama(g)
    ref = _emulating(cpu, cfg, w)
    ref_cache = ref.new_cache(1, 160)
    p = torch.randint(0, 301, (120,), generator=g)
    ref.fine = True
    want = list(ref.prefill(ref_cache, 0, p, all_logits=True)[[29, 59, 89, 119]])
    ref.fine = False
    want += [ref.decode_step(ref_cache, [0], torch.tensor([t]))[0] for t in (7, 8, 9)]
    runs = []
    for threads in (1, 2, 4):
        cpu.threads = threads
        k, v = cpu.new_cache(1, 160)
        got = [
            cpu(k, v, [0] * 30, list(range(c, c + 30)), p[c : c + 30], [29], fine=True)[0] for c in range(0, 120, 30)
        ]
        got += [cpu(k, v, [0], [120 + i], [t])[0] for i, t in enumerate((7, 8, 9))]
        _agree(got[:4], want[:4], 1e-3)
        assert max(_rel(a, b) for a, b in zip(got[4:], want[4:])) < 5e-2
        runs.append(torch.stack(got))
    assert torch.equal(runs[0], runs[1]) and torch.equal(runs[0], runs[2])


def test_the_kernel_builds_and_says_why_not(tmp_path, monkeypatch):
    """Built into an empty cache (as on a fresh machine: about a second), loaded, and the same file used again;
    a compiler that fails, or none, leaves a reason, not an exception."""
    dll, why = cpu_decode.library(tmp_path)
    assert why is None and dll is not None and len(list(tmp_path.glob("cpu_decode-*.so"))) == 1
    assert cpu_decode.library(tmp_path)[1] is None and len(list(tmp_path.iterdir())) == 1
    # a VNNI build the compiler refuses (here: a flag no compiler knows) gives way to the AVX2 form
    monkeypatch.setattr(cpu_decode, "vnni_flags", lambda: ["-DSRT_VNNI", "--no-such-flag-speechrt"])
    dll, why = cpu_decode.library(tmp_path / "fallback")
    assert why is None and dll is not None and len(list((tmp_path / "fallback").glob("cpu_decode-*.so"))) == 1
    dll, why = cpu_decode.library(tmp_path / "fallback", vnni=True)
    assert dll is None and "could not build cpu_decode.c" in why
    monkeypatch.setenv("CC", "false")  # exits 1: a compiler that cannot build
    dll, why = cpu_decode.library(tmp_path / "other")
    assert dll is None and "could not build cpu_decode.c with false" in why


@pytest.mark.skipif(
    not cpu_decode.vnni_flags(),
    reason="this CPU has neither AVX-VNNI nor AVX512-VNNI with AVX512-VL "
    "(or SPEECHRT_CPU_DECODE_VNNI=0): the VNNI build cannot run here",
)
@pytest.mark.parametrize("bits", [4, 8])
def test_vnni_build_gives_the_avx2_builds_bits(tmp_path, bits):
    """vpdpbusd sums the same integers as vpmaddubsw + vpmaddwd (no pair saturates with these operands), so the
    two builds give identical outputs: decode rows, prompt rows in two terms, odd shapes, 1-64 rows."""
    plain, why = cpu_decode.library(tmp_path, vnni=False)
    vnni, why_v = cpu_decode.library(tmp_path, vnni=True)
    assert why is None and why_v is None and len(list(tmp_path.glob("cpu_decode-*.so"))) == 2
    g = torch.Generator().manual_seed(bits)
    for N, K, M in [(13, 64, 1), (577, 1536, 8), (96, 96, 17), (1031, 160, cpu_decode.MAX_ROWS)]:
        p = cpu_decode.Packed.q4(*_q4(N, K, g)) if bits == 4 else cpu_decode.Packed.q8(torch.randn(N, K, generator=g))
        x = torch.randn(M, K, generator=g) * 3
        x[0, :5] *= 40
        for fine in (False, True):
            rows = x[: cpu_decode.MAX_ROWS // 2] if fine else x
            a, b = p(rows, 2, fine, lib=plain), p(rows, 2, fine, lib=vnni)
            assert torch.isfinite(a).all() and torch.equal(a, b), (N, K, M, fine)
            # and right: an input crossing a rounding boundary of its quantization moves a small matmul by ~1e-4
            assert _rel(a, block_linear(rows, *p.blocks(), fine=fine)) < 1e-3
