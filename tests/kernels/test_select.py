import pytest
import torch

from speechrt import kernels


def test_torch_set_is_frozen_and_complete():
    ops = kernels.select("torch", "cpu")
    assert {"layer_norm", "rms_norm", "attention", "gelu", "linear", "rotary", "silu_mul"} <= set(ops.names())
    with pytest.raises(AttributeError, match="frozen"):
        ops.gelu = None
    with pytest.raises(AttributeError, match="ops: "):
        _ = ops.no_such_op


def test_unknown_impl_lists_valid():
    with pytest.raises(ValueError, match="valid: torch, triton, auto"):
        kernels.select("cuda-magic", "cpu")


def test_explicit_triton_on_cpu_fails_clearly(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(RuntimeError, match="triton"):
        kernels.select("triton", "cpu")


def test_auto_falls_back_to_reference_on_cpu(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    ops = kernels.select("auto", "cpu")
    assert set(ops.sources.values()) == {"torch"}


@pytest.mark.parametrize("Tq,Tk,H,Hkv", [(1, 7, 4, 2), (5, 5, 4, 4), (3, 11, 6, 1)])
def test_reference_attention_causal_alignment_and_lengths(Tq, Tk, H, Hkv):
    """Causal masking aligns the last query with the last key; `lengths` hides padded keys. Checked
    against an explicit softmax computation."""
    g = torch.Generator().manual_seed(Tq * 100 + Tk)
    B, D = 2, 8
    q = torch.randn(B, H, Tq, D, generator=g)
    k = torch.randn(B, Hkv, Tk, D, generator=g)
    v = torch.randn(B, Hkv, Tk, D, generator=g)
    lengths = torch.tensor([Tk, Tk - 1])
    out = kernels.select("torch").attention(q, k, v, causal=True, lengths=lengths)
    kk, vv = k.repeat_interleave(H // Hkv, 1), v.repeat_interleave(H // Hkv, 1)
    s = q @ kk.transpose(-1, -2) / D**0.5
    i = torch.arange(Tq)[:, None] + Tk - Tq
    j = torch.arange(Tk)[None]
    mask = (j <= i)[None, None] & (j[None, None] < lengths[:, None, None, None])
    ref = torch.softmax(s.masked_fill(~mask, float("-inf")), -1) @ vv
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_reference_norms_with_residual():
    ops = kernels.select("torch")
    x, r, w, b = torch.randn(3, 5, 33), torch.randn(3, 5, 33), torch.randn(33), torch.randn(33)
    y, s = ops.layer_norm(x, w, b, 1e-5, residual=r)
    torch.testing.assert_close(s, x + r)
    torch.testing.assert_close(y, torch.nn.functional.layer_norm(x + r, (33,), w, b, 1e-5))
    y, s = ops.rms_norm(x, w, 1e-6, residual=r)
    ref = (x + r) / torch.sqrt(((x + r) ** 2).mean(-1, keepdim=True) + 1e-6) * w
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-5)
