"""GGUF loader: tensor types, Q/K un-permutation, the 4-bit blocks kept for int4, and bad files.

Small Llama GGUFs are written here with the `gguf` package's writer. Weights of the types gguf-py can
quantize (F16, BF16, Q8_0, Q4_0, Q4_1) come from random floats; the K-quants (Q4_K, Q6_K) are random
blocks with finite scales, and our dequantized values are checked against transformers' independent
torch dequantizer of the same bytes.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")

from speechrt.models import gguf_loader, registry  # noqa: E402
from speechrt.models.lm_text import byte_alphabet  # noqa: E402
from speechrt.models.registry import ModelError  # noqa: E402

T = gguf.GGMLQuantizationType
DIM, HEADS, KV, FF, VOCAB = 256, 4, 2, 512, 300


def _kquant_blocks(rng, qtype, rows, cols):
    """Random K-quant bytes [rows, bytes] with small finite f16 scales (random f16 could be inf/NaN)."""
    bs, bb = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(rows, cols // bs, bb), dtype=np.uint8)
    d = rng.uniform(1e-3, 2e-2, size=(rows, cols // bs)).astype(np.float16).view(np.uint8).reshape(rows, cols // bs, 2)
    if qtype == T.Q6_K:  # ... ql[128] qh[64] scales[16] d
        raw[..., bb - 2 :] = d
    else:  # Q4_K: d, dmin, scales[12], qs[128]
        raw[..., 0:2] = d
        raw[..., 2:4] = d
    return raw.reshape(rows, -1)


def write_llama_gguf(path, types: dict[str, T], arch="llama", extra_tensor=None, seed=0):
    """A 2-layer Llama GGUF; `types` maps 'attn_q', 'ffn_down', ... (and 'token_embd') to a tensor type."""
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(2)
    w.add_context_length(128)
    w.add_embedding_length(DIM)
    w.add_feed_forward_length(FF)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_vocab_size(VOCAB)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    alpha = list(byte_alphabet().values())
    toks = alpha + ["Ġt"] + [f"<tok{i}>" for i in range(VOCAB - len(alpha) - 3)] + ["<|im_start|>", "<|im_end|>"]
    w.add_token_list(toks)
    w.add_token_types([1] * (VOCAB - 2) + [3, 3])
    w.add_token_merges(["Ġ t"])
    w.add_eos_token_id(VOCAB - 1)
    w.add_chat_template(
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    )
    originals = {}

    def add(name, shape, kind):
        qt = types.get(kind, T.F32)
        x = rng.standard_normal(shape).astype(np.float32) * 0.05
        if qt == T.F32:
            w.add_tensor(name, x)
        elif qt in (T.Q4_K, T.Q6_K, T.Q8_K):
            w.add_tensor(
                name,
                _kquant_blocks(rng, qt, shape[0], shape[1])
                if qt != T.Q8_K
                else rng.integers(0, 256, (shape[0], shape[1] // 256 * gguf.GGML_QUANT_SIZES[qt][1]), dtype=np.uint8),
                raw_dtype=qt,
            )
        else:
            w.add_tensor(name, gguf.quants.quantize(x, qt), raw_dtype=qt)
        originals[name] = x

    add("token_embd.weight", (VOCAB, DIM), "token_embd")
    add("output_norm.weight", (DIM,), "norm")
    for i in range(2):
        add(f"blk.{i}.attn_norm.weight", (DIM,), "norm")
        add(f"blk.{i}.ffn_norm.weight", (DIM,), "norm")
        add(f"blk.{i}.attn_q.weight", (DIM, DIM), "attn_q")
        add(f"blk.{i}.attn_k.weight", (KV * DIM // HEADS, DIM), "attn_k")
        add(f"blk.{i}.attn_v.weight", (KV * DIM // HEADS, DIM), "attn_v")
        add(f"blk.{i}.attn_output.weight", (DIM, DIM), "attn_output")
        add(f"blk.{i}.ffn_gate.weight", (FF, DIM), "ffn_gate")
        add(f"blk.{i}.ffn_up.weight", (FF, DIM), "ffn_up")
        add(f"blk.{i}.ffn_down.weight", (DIM, FF), "ffn_down")
    if extra_tensor:
        w.add_tensor(extra_tensor, np.zeros((4, 4), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return originals


def _hf_dequant(path, name):
    from transformers.integrations.gguf.dequant import dequantize

    t = next(t for t in gguf.GGUFReader(str(path)).tensors if t.name == name)
    flat = dequantize(torch.from_numpy(np.asarray(t.data).reshape(-1).copy()), int(t.tensor_type))
    return flat.reshape(tuple(int(d) for d in reversed(t.shape)))


def _permute(w, n_head):
    """llama.cpp's converter permutation (convert_hf_to_gguf.py LlamaModel.permute)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


@pytest.mark.parametrize("qtype,tol", [(T.F16, 1e-3), (T.BF16, 1e-2), (T.Q8_0, 2e-3), (T.Q4_0, 3e-2), (T.Q4_1, 2e-2)])
def test_types_dequantize_to_the_weights(tmp_path, qtype, tol):
    p = tmp_path / "m.gguf"
    kinds = ["attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down", "token_embd"]
    orig = write_llama_gguf(p, {k: qtype for k in kinds})
    f = gguf_loader.load(p)
    assert f.tensor_types[qtype.name] == 2 * 7 + 1
    # Q/K come back un-permuted: permuting them again gives what the file stores
    q = _permute(f.weights["layers.0.wq"].numpy(), HEADS)
    k = _permute(f.weights["layers.1.wk"].numpy(), KV)
    assert np.abs(q - orig["blk.0.attn_q.weight"]).max() < tol
    assert np.abs(k - orig["blk.1.attn_k.weight"]).max() < tol
    assert np.abs(f.weights["layers.1.w_down"].numpy() - orig["blk.1.ffn_down.weight"]).max() < tol
    assert np.abs(f.weights["tok_embeddings"].numpy() - orig["token_embd.weight"]).max() < tol
    assert (len(f.q4) == 14) == (qtype in (T.Q4_0, T.Q4_1))
    for name, (qq, s, z) in f.q4.items():  # the kept 4-bit blocks reproduce the dequantized weights exactly
        N, K = qq.shape
        w = ((qq.float().view(N, K // 32, 32) - 8) * s[..., None] + z[..., None]).view(N, K)
        assert torch.equal(w, f.weights[name]), name


@pytest.mark.parametrize("qtype", [T.Q8_0, T.Q4_0, T.Q4_1])
def test_4bit_weights_become_floats_only_when_read(tmp_path, qtype):
    """The CPU int4 kernel reads a GGUF's 4-bit blocks as they are: their float32 copies are made only for a
    runner that reads them (a cold `speechrt serve` spent ~2 s of its start dequantizing the language model's
    4-bit tensors it never used), and then equal gguf's own dequantizer's, as do the tensors read at once."""
    from gguf import quants

    from speechrt.backends.torch import cpu_lm

    p = tmp_path / "m.gguf"
    kinds = ["attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down", "token_embd"]
    write_llama_gguf(p, {k: qtype for k in kinds})
    f = gguf_loader.load(p)
    lazy = set(f.q4)
    assert len(lazy) == (14 if qtype != T.Q8_0 else 0)
    assert {n for n in f.weights if not f.weights.made(n)} == lazy
    if lazy and cpu_lm.unavailable(f.config) is None:
        cpu_lm.CpuInt4LMRunner(f, torch.device("cpu"), "int4")
        assert not any(f.weights.made(n) for n in lazy)
    reader = gguf.GGUFReader(str(p))
    for t in reader.tensors:
        if t.name.endswith("norm.weight"):
            continue
        layer = t.name.split(".")
        name = "tok_embeddings" if t.name == "token_embd.weight" else None
        if name is None:
            part = {"attn_q": "wq", "attn_k": "wk", "attn_v": "wv", "attn_output": "wo"}.get(layer[2], layer[2][4:])
            name = f"layers.{layer[1]}.{'w_' + part if layer[2].startswith('ffn') else part}"
        ref = torch.from_numpy(quants.dequantize(t.data, t.tensor_type).copy())
        ref = ref.reshape(tuple(int(d) for d in reversed(t.shape)))
        got = f.weights[name]
        if name.endswith((".wq", ".wk")):  # un-permuted: permuting them again gives what the file stores
            got = torch.from_numpy(_permute(got.numpy(), HEADS if name.endswith(".wq") else KV))
        assert torch.equal(got, ref), name
    assert all(f.weights.made(n) for n in f.weights)


def test_cpu_kernel_packed_weights_are_cached(tmp_path, monkeypatch, caplog, capfd):
    """The CPU int4 kernel's packed weights (backends/torch/cpu_lm_cache): written on the first load, read on the
    next (nothing repacked, the same logits), a broken entry rebuilt with a warning, a changed file another entry
    that replaces the old one."""
    from speechrt.backends.torch import cpu_lm, cpu_lm_cache
    from speechrt.kernels import cpu_decode

    monkeypatch.setenv("SPEECHRT_CACHE", str(tmp_path / "cache"))
    p = tmp_path / "m.gguf"
    kinds = ["attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"]
    write_llama_gguf(p, {**{k: T.Q4_1 for k in kinds}, "token_embd": T.Q8_0})
    if cpu_lm.unavailable(gguf_loader.load(p).config):
        pytest.skip(cpu_lm.unavailable(gguf_loader.load(p).config))

    def logits():
        r = cpu_lm.CpuInt4LMRunner(gguf_loader.load(p), torch.device("cpu"), "int4")
        return r.prefill(r.new_cache(1, 16), 0, torch.tensor([1, 5, 7, 2]))

    first = logits()
    assert "packing m.gguf's weights for the CPU kernel" in capfd.readouterr().err  # said, as first-use builds are
    entries = list(cpu_lm_cache.cache_root().glob("*.pt"))
    assert len(entries) == 1 and entries[0].name.startswith("m-")
    made = entries[0].stat().st_mtime_ns

    def repacked(*a, **k):
        raise AssertionError("repacked although the cache has the packed weights")

    with monkeypatch.context() as m:
        m.setattr(cpu_decode.Packed, "q4", repacked)
        m.setattr(cpu_decode.Packed, "q8", repacked)
        assert torch.equal(logits(), first)  # read from the entry, not repacked
    assert entries[0].stat().st_mtime_ns == made and "packing" not in capfd.readouterr().err
    entries[0].write_bytes(b"not a torch file")
    with caplog.at_level("WARNING", logger=cpu_lm_cache.__name__):
        assert torch.equal(logits(), first)
    assert "rebuilding the packed weights" in caplog.text
    assert len(torch.load(entries[0], weights_only=True)["data"]) == 2 * 4 + 1  # rewritten whole
    os.utime(p, ns=(made, made + 10**9))  # the file changed: a new entry, the old one removed
    assert torch.equal(logits(), first)
    now = list(cpu_lm_cache.cache_root().glob("*.pt"))
    assert len(now) == 1 and now != entries


@pytest.mark.parametrize("qtype", [T.Q4_K, T.Q6_K])
def test_kquants_match_transformers_dequantizer(tmp_path, qtype):
    pytest.importorskip("transformers")
    p = tmp_path / "k.gguf"
    write_llama_gguf(p, {"ffn_gate": qtype, "attn_q": qtype, "ffn_down": qtype})
    f = gguf_loader.load(p)
    assert torch.equal(f.weights["layers.0.w_gate"], _hf_dequant(p, "blk.0.ffn_gate.weight"))
    assert torch.equal(f.weights["layers.1.w_down"], _hf_dequant(p, "blk.1.ffn_down.weight"))
    ref_q = _hf_dequant(p, "blk.1.attn_q.weight").numpy()
    assert np.array_equal(_permute(f.weights["layers.1.wq"].numpy(), HEADS), ref_q)


def test_tiny_model_runs_in_every_format(tmp_path):
    from speechrt.backends.torch import lm as torch_lm

    p = tmp_path / "m.gguf"
    write_llama_gguf(
        p, {k: T.Q4_1 for k in ["attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"]}
    )
    rm = registry.resolve(str(p), "lm")
    ref = None
    for fmt in ("float32", "bfloat16", "int8", "int4"):
        r = torch_lm.build(rm, torch.device("cpu"), fmt)
        lg = r.prefill(r.new_cache(1, 16), 0, torch.tensor([5, 6, 7, 8]))
        assert lg.shape == (VOCAB,) and torch.isfinite(lg).all()
        ref = lg if ref is None else ref
        assert torch.corrcoef(torch.stack([lg, ref]))[0, 1] > 0.98, fmt


def test_unsupported_tensor_type(tmp_path):
    p = tmp_path / "q8k.gguf"
    write_llama_gguf(p, {"ffn_up": T.Q8_K})
    with pytest.raises(ModelError, match=r"type Q8_K.*supported types: .*Q4_1"):
        gguf_loader.load(p)


def test_unsupported_architecture(tmp_path):
    p = tmp_path / "gpt2.gguf"
    write_llama_gguf(p, {}, arch="gpt2")
    with pytest.raises(ModelError, match="architecture 'gpt2' is not supported.*llama"):
        gguf_loader.load(p)


def test_unknown_tensor(tmp_path):
    p = tmp_path / "x.gguf"
    write_llama_gguf(p, {}, extra_tensor="blk.0.attn_q.bias")
    with pytest.raises(ModelError, match="not part of the Llama architecture"):
        gguf_loader.load(p)


def test_corrupt_files(tmp_path):
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"this is not a gguf file at all" * 10)
    with pytest.raises(ModelError, match="not a readable GGUF file"):
        gguf_loader.load(junk)
    real = registry.resolve("smollm2-135m-instruct", "lm").path
    cut = tmp_path / "truncated.gguf"
    with open(real, "rb") as f:
        cut.write_bytes(f.read(3_000_000))  # header and metadata intact, tensor data cut off
    with pytest.raises(ModelError, match="truncated|not a readable GGUF"):
        gguf_loader.load(cut)


def test_registry_errors(tmp_path):
    with pytest.raises(ModelError, match="registered lm models: smollm2-135m-instruct"):
        registry.resolve("no-such-model", "lm")
    with pytest.raises(ModelError, match="asr model"):
        registry.resolve("smollm2-135m-instruct", "asr")
    (tmp_path / "weights.bin").write_bytes(b"\0" * 16)
    with pytest.raises(ModelError, match="unrecognized model file"):
        registry.resolve(str(tmp_path / "weights.bin"), "lm")


@pytest.mark.parametrize("which", ["embedded", "written"])
def test_header_reader_equals_gguf_reader(which, tmp_path):
    """models.gguf_header (one struct pass) reads the metadata and tensors GGUFReader reads: the embedded
    SmolLM2 file (Q4_1 / Q8_0 / F32, a 49k-token vocabulary with merges, int / float / bool / string
    values) and a written file with seven block types (float, 4/8-bit, K-quant)."""
    if which == "embedded":
        path = registry.resolve("smollm2-135m-instruct", "lm").path
    else:
        path = tmp_path / "m.gguf"
        write_llama_gguf(
            path,
            {
                "attn_q": T.Q4_0,
                "attn_k": T.Q4_1,
                "attn_v": T.Q8_0,
                "ffn_down": T.F16,
                "ffn_up": T.BF16,
                "ffn_gate": T.Q6_K,
                "attn_output": T.Q4_K,
            },
        )
    fast, ref = gguf_loader.open_reader(path), gguf_loader.read_with_gguf(path)
    assert fast.version == ref.version and fast.metadata.keys() == ref.metadata.keys()
    for k, v in ref.metadata.items():
        assert fast.metadata[k] == v and type(fast.metadata[k]) is type(v), k
        if isinstance(v, list) and v:
            assert {type(x) for x in fast.metadata[k]} == {type(x) for x in v}, k
    assert [t.name for t in fast.tensors] == [t.name for t in ref.tensors] and len(fast.tensors) > 10
    for a, b in zip(fast.tensors, ref.tensors):
        assert a.tensor_type == b.tensor_type and list(a.shape) == [int(d) for d in b.shape], a.name
        assert a.data.dtype == b.data.dtype and a.data.shape == b.data.shape, a.name
        assert np.array_equal(a.data, b.data, equal_nan=True), a.name
