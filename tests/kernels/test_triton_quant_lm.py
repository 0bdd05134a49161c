"""The language model on the Triton kernel set with int4 (W4A16) and fp8 (E4M3) weights, in the Triton interpreter on
a tiny random Llama: its logits and greedy ids equal those of the float32 reference model built from the same
weights dequantized (the 4-bit groups as a GGUF file gives them; fp8 quantized at load, absmax / 448 per channel),
so what is checked is the wiring and the kernels, not the quantization error."""

from __future__ import annotations

from functools import partial

import pytest
import torch

from speechrt import kernels
from speechrt.kernels import reference as ref
from speechrt.models.llama import Llama, LlamaConfig, layer_tensors
from speechrt.models.llama_layers import quantize_int4

pytestmark = pytest.mark.usefixtures("interpret")
CFG = LlamaConfig(
    vocab_size=97, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, hidden_dim=96, max_seq_len=32, tie_embeddings=False
)
LINEAR = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")
CPU = torch.device("cpu")


def weights(seed=0):
    g = torch.Generator().manual_seed(seed)
    shapes = {"tok_embeddings": (CFG.vocab_size, CFG.dim), "output": (CFG.vocab_size, CFG.dim), "norm": (CFG.dim,)}
    D = CFG.head_dim
    per_layer = {
        "wq": (CFG.n_heads * D, CFG.dim),
        "wk": (CFG.n_kv_heads * D, CFG.dim),
        "wv": (CFG.n_kv_heads * D, CFG.dim),
        "wo": (CFG.dim, CFG.n_heads * D),
        "w_gate": (CFG.hidden_dim, CFG.dim),
        "w_up": (CFG.hidden_dim, CFG.dim),
        "w_down": (CFG.dim, CFG.hidden_dim),
        "attn_norm": (CFG.dim,),
        "ffn_norm": (CFG.dim,),
    }
    for i in range(CFG.n_layers):
        shapes.update({f"layers.{i}.{n}": per_layer[n] for n in layer_tensors(CFG)})
    out = {}
    for name, shape in shapes.items():
        t = torch.randn(shape, generator=g)
        out[name] = 1 + 0.1 * t if len(shape) == 1 else t * shape[-1] ** -0.5
    return out


def greedy(model, prompt, steps=6, feed=None):
    """Greedy ids and logits [1 + steps, vocab] from prompt; `feed`: the tokens to feed instead of its own."""
    cache = model.new_cache(1, CFG.max_seq_len)
    logits = [model.prefill(cache, 0, prompt)]
    ids = [int(logits[-1].argmax())]
    for i in range(steps):
        logits.append(model.decode_step(cache, [0], torch.tensor([(feed or ids)[i]]))[0])
        ids.append(int(logits[-1].argmax()))
    return ids, torch.stack(logits).float()


def check(model, reference, tol=3e-2):
    """Fed the reference's greedy ids, the model's logits are within `tol` of the largest and pick the same ids
    wherever the reference's best two are further apart than that (bf16 activations against float32)."""
    prompt = torch.tensor([5, 17, 3, 88, 41, 9, 60])
    want_ids, want = greedy(reference, prompt)
    ids, logits = greedy(model, prompt, feed=want_ids)
    assert torch.isfinite(logits).all()
    bound = tol * want.abs().amax().item()
    assert (logits - want).abs().amax().item() < bound
    top2 = want.topk(2, dim=-1).values
    clear = (top2[:, 0] - top2[:, 1] > 2 * bound).tolist()
    assert sum(clear) >= 3, "too few clear choices to compare (bad test input)"
    assert [a for a, c in zip(ids, clear) if c] == [b for b, c in zip(want_ids, clear) if c]


def test_int4_model_equals_its_dequantized_float32_model():
    w = weights()
    q4 = {}
    for i in range(CFG.n_layers):
        for n in LINEAR:
            name = f"layers.{i}.{n}"
            q, s, z = quantize_int4(w[name])
            q4[name] = (q, s, z)
            w[name] = ref.dequantize_int4(q, torch.stack([s.t(), z.t()], -1))  # exactly what the kernel reads
    # the head stays int8 in the int4 format: give it int8-exact rows
    head = w["output"]
    scale = head.abs().amax(1, keepdim=True) / 127
    w["output"] = torch.round(head / scale) * scale
    ops = kernels.select("triton", CPU)
    model = Llama(CFG, w, ops, CPU, "int4", q4=q4)
    assert model.layers[0].wqkv.weight.shape == ((CFG.n_heads + 2 * CFG.n_kv_heads) * CFG.head_dim, CFG.dim // 2)
    check(model, Llama(CFG, w, kernels.select("torch", CPU), CPU, "float32"))


@pytest.mark.parametrize("impl", ["triton", "torch"])
def test_fp8_model_equals_its_dequantized_float32_model(impl):
    """On the Triton kernel set, and on the reference op (the torch backend's `--dtype fp8`, any device)."""
    w = weights(1)
    model = Llama(CFG, w, kernels.select(impl, CPU), CPU, "fp8")
    assert model.layers[0].w_down.weight.dtype == torch.float8_e4m3fn and model.output.weight.dtype == torch.int8
    for name in [f"layers.{i}.{n}" for i in range(CFG.n_layers) for n in LINEAR]:
        q, s = ref.quantize_fp8(w[name])  # per output channel: the fused Q|K|V and gate|up rows get the same
        w[name] = q.float() * s[:, None]
    scale = w["output"].abs().amax(1, keepdim=True) / 127  # the head stays int8
    w["output"] = torch.round(w["output"] / scale) * scale
    check(model, Llama(CFG, w, kernels.select("torch", CPU), CPU, "float32"))


def test_fp8_is_a_language_model_dtype():
    from speechrt.backends.torch.lm import resolve_format

    assert resolve_format("fp8", CPU) == "fp8"
    with pytest.raises(Exception, match="fp8"):
        resolve_format("fp4", CPU)


@pytest.mark.parametrize("fmt", ["int4", "int4+int8", "fp8", "int8"])
def test_fused_decode_step_equals_the_unfused_one(fmt):
    """models/llama_fused.py's step on quantized weights (kernels/triton_fused_quant.py: the weights dequantized in
    the fused kernels' K loops) equals Llama.decode_range's unfused quantized step (the W4A16 / FP8 / int8 linears
    apart from the norms, rotary and adds) on three rows at once: logits and the keys and values written; and the
    references (kernels/reference_quant.py) agree. int4: 4-bit groups of the fused Q|K|V, gate|up and the rest;
    int4+int8: a file's 4-bit blocks for all but the down projections, which int4 models keep in int8."""
    from speechrt.kernels import reference_quant, triton_fused_quant
    from speechrt.models.llama_fused import decode_range_fused, fused_unsupported

    w, q4 = weights(2), None
    if fmt == "int4+int8":
        fmt = "int4"
        q4 = {f"layers.{i}.{n}": quantize_int4(w[f"layers.{i}.{n}"]) for i in range(2) for n in LINEAR[:-1]}
    assert fused_unsupported(CFG, fmt) is None
    model = Llama(CFG, w, kernels.select("triton", CPU), CPU, fmt, q4=q4)
    assert model.layers[0].w_gate_up.fmt == fmt and model.layers[1].wqkv.scale is not None
    assert model.layers[1].w_down.fmt == ("int8" if q4 else fmt)
    cache = model.new_cache(3, 16)
    g = torch.Generator().manual_seed(0)
    cache.k.copy_(torch.randn(cache.k.shape, generator=g)), cache.v.copy_(torch.randn(cache.v.shape, generator=g))
    k0, v0 = cache.k.clone(), cache.v.clone()
    tokens, pos = torch.tensor([5, 96, 17]), torch.tensor([15, 0, 9])
    out = {}
    for name, step in (
        ("unfused", model.decode_range),
        ("fused", partial(decode_range_fused, model, triton_fused_quant.OPS)),
        ("reference", partial(decode_range_fused, model, reference_quant.FUSED_QUANT_OPS)),
    ):
        cache.k.copy_(k0), cache.v.copy_(v0)
        with torch.inference_mode():
            logits = step(cache, 0, tokens, pos, cache.max_seq)
        out[name] = logits, cache.k.clone(), cache.v.clone()
    want, want_k, want_v = out["unfused"]
    assert torch.isfinite(want).all() and not torch.equal(want_k, k0)
    # bf16 activations rounded at other points (the norms folded in, one residual stream): measured 2.0-2.9 % of
    # the largest logit here, as the float bf16 model's fused step (kernels/triton_fused.py) differs from its unfused
    # one (2.2 %); a weight misread would be ~100 %
    for name in ("fused", "reference"):
        got, k, v = out[name]
        bound = 5e-2 * want.abs().max().item()
        torch.testing.assert_close(got, want, rtol=0, atol=bound)
        top2 = want.topk(2, dim=-1).values
        clear = top2[:, 0] - top2[:, 1] > 2 * bound  # the same greedy id where it is not a near tie
        assert torch.equal(got.argmax(-1)[clear], want.argmax(-1)[clear])
        for c, w in ((k, want_k), (v, want_v)):  # layer 0's from the same input; layer 1's as the logits
            torch.testing.assert_close(c[0].float(), w[0].float(), rtol=2e-2, atol=2e-2)
            torch.testing.assert_close(c.float(), w.float(), rtol=0, atol=5e-2 * w.abs().max().item())
