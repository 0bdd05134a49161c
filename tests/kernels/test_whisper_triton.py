"""A tiny random-weight Whisper built with the Triton kernel set gives the reference kernel set's outputs
(encoder, full forward, and cached decode steps), in the Triton interpreter."""

from __future__ import annotations

import pytest
import torch

from speechrt import kernels
from speechrt.models.whisper import Whisper, WhisperConfig

pytestmark = pytest.mark.usefixtures("interpret")

CFG = WhisperConfig(
    n_mels=8,
    n_audio_ctx=12,
    n_audio_state=32,
    n_audio_head=2,
    n_audio_layer=2,
    n_vocab=97,
    n_text_ctx=16,
    n_text_state=32,
    n_text_head=2,
    n_text_layer=2,
)


@pytest.fixture(scope="module")
def models():
    torch.manual_seed(0)
    ref = Whisper(CFG, kernels.select("torch", "cpu"))
    with torch.no_grad():
        for name, p in ref.named_parameters():
            p.copy_(torch.randn_like(p) * (0.3 if "weight" in name and p.dim() > 1 else 0.1))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRITON_INTERPRET", "1")
        tri = Whisper(CFG, kernels.select("triton", "cpu"))
    tri.load_state_dict(ref.state_dict())
    return ref.eval(), tri.eval()


def _close(a, b, tol=2e-4):
    assert torch.isfinite(a).all() and torch.isfinite(b).all()
    torch.testing.assert_close(a, b, rtol=tol, atol=tol)


@torch.inference_mode()
def test_encoder_and_full_forward(models):
    ref, tri = models
    mel = torch.randn(2, CFG.n_mels, 2 * CFG.n_audio_ctx, generator=torch.Generator().manual_seed(1))
    tokens = torch.tensor([[1, 5, 9, 3, 7], [2, 2, 8, 40, 96]])
    _close(tri.encoder(mel), ref.encoder(mel))
    _close(tri(mel, tokens), ref(mel, tokens))


@torch.inference_mode()
def test_cached_decode_steps(models):
    """Prompt of 3 tokens, then single-token steps (the decode attention kernel over the KV cache and
    the cross-attention over the encoder states): the same logits as the reference at every step."""
    ref, tri = models
    mel = torch.randn(2, CFG.n_mels, 2 * CFG.n_audio_ctx, generator=torch.Generator().manual_seed(2))
    outs = []
    for m in (ref, tri):
        xa = m.encoder(mel)
        cross = m.cross_kv(xa)
        caches = m.new_cache(2, 8, xa.dtype, xa.device)
        steps = [m.decoder(torch.tensor([[1, 4, 6], [3, 3, 90]]), caches, 0, cross)]
        offset = 3
        for tok in ([[11], [12]], [[50], [0]], [[7], [7]]):
            steps.append(m.decoder(torch.tensor(tok), caches, offset, cross))
            offset += 1
        outs.append(steps)
    for a, b in zip(*outs):
        assert a.shape == (2, CFG.n_vocab)
        _close(b, a)


@torch.inference_mode()
@pytest.mark.parametrize("which", ["reference", "triton"])
def test_fixed_shape_decode_step_matches_offset_path(models, which):
    """The decode step the triton backend captures as a CUDA graph (position tensor, cache written by
    index, attention over the whole cache masked by length) gives the logits of the offset path, and
    leaves the same cache contents."""
    m = models[0] if which == "reference" else models[1]
    mel = torch.randn(3, CFG.n_mels, 2 * CFG.n_audio_ctx, generator=torch.Generator().manual_seed(3))
    xa = m.encoder(mel)
    cross = m.cross_kv(xa)
    a = m.new_cache(3, 10, xa.dtype, xa.device)
    b = m.new_cache(3, 10, xa.dtype, xa.device)
    prompt = torch.tensor([[1, 4], [3, 3], [5, 60]])
    _close(m.decoder(prompt, b, 0, cross), m.decoder(prompt, a, 0, cross), tol=1e-6)
    toks = [[[11], [12], [13]], [[50], [0], [96]], [[7], [7], [7]]]
    for i, tok in enumerate(toks):
        t = torch.tensor(tok)
        want = m.decoder(t, a, 2 + i, cross)
        got = m.decoder(t, b, 0, cross, position=torch.tensor([2 + i]))
        _close(got, want)
    for (ka, va), (kb, vb) in zip(a, b):
        _close(kb[:, :, :5], ka[:, :, :5], tol=1e-6), _close(vb[:, :, :5], va[:, :, :5], tol=1e-6)
    with pytest.raises(ValueError, match="one token per row"):
        m.decoder(prompt, b, 0, cross, position=torch.tensor([5]))


@torch.inference_mode()
@pytest.mark.parametrize(
    "which,dtype",
    [("reference", torch.float32), ("triton", torch.float32), ("triton", torch.float16)],  # bf16: kernel tests
)
def test_fused_decoder_step_equals_the_unfused_step(models, which, dtype):
    """models/whisper_fused.py's decoder step (each LayerNorm folded into its projection, the cache written by the
    Q/K/V kernel, biases and residuals in the projections' epilogues), through the fused Triton kernels and through
    their references: greedy steps from a prompt over 3 rows with different encoder lengths give the unfused
    fixed-shape step's ids and logits (float32 1e-4; 16-bit within its rounding) and leave the same caches."""
    from speechrt.kernels.reference import WHISPER_FUSED_OPS
    from speechrt.kernels.triton_fused_whisper import OPS
    from speechrt.models.whisper_fused import decoder_step_fused

    src = models[0] if which == "reference" else models[1]
    m = Whisper(CFG, src.decoder.ops).eval()
    m.load_state_dict(src.state_dict())
    m = m.to(dtype)
    fops = WHISPER_FUSED_OPS if which == "reference" else OPS
    mel = torch.randn(3, CFG.n_mels, 2 * CFG.n_audio_ctx, generator=torch.Generator().manual_seed(4))
    cross = [(k.to(dtype), v.to(dtype)) for k, v in models[0].cross_kv(models[0].encoder(mel))]  # inputs of both
    lengths = torch.tensor([12, 7, 9])
    a = m.new_cache(3, 10, dtype, "cpu")
    prompt = torch.tensor([[1, 4], [3, 3], [5, 60]])
    m.decoder(prompt, a, 0, cross, cross_lengths=lengths)
    b = [(k.clone(), v.clone()) for k, v in a]
    tok = torch.tensor([[11], [12], [13]])
    tol = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 2e-2}[dtype]
    compared = 0
    for i in range(3):
        p = torch.tensor([2 + i])
        want = m.decoder(tok, a, 0, cross, position=p, cross_lengths=lengths)
        got = decoder_step_fused(m.decoder, fops, tok, b, cross, p, lengths)
        assert got.dtype == want.dtype == torch.float32 and got.shape == want.shape == (3, CFG.n_vocab)
        _close(got, want, tol=tol * want.abs().amax().item())
        top2 = want.topk(2).values
        clear = (top2[:, 0] - top2[:, 1]) > 2 * tol * want.abs().amax()  # ids compared where rounding cannot flip them
        assert torch.equal(got.argmax(-1)[clear], want.argmax(-1)[clear])
        compared += int(clear.sum())
        tok = want.argmax(-1, keepdim=True)
    assert compared >= 5
    for want_kv, got_kv in zip(a, b):
        for w, g in zip(want_kv, got_kv):
            _close(g[:, :, :5].float(), w[:, :, :5].float(), tol=tol)
    with pytest.raises(ValueError, match="one token per row"):
        decoder_step_fused(m.decoder, fops, prompt, b, cross, torch.tensor([5]), lengths)


@torch.inference_mode()
def test_fused_decoder_step_launches(models):
    """The fused step's launches, counted in the interpreter: per decoder layer the six fused kernels and one per
    decode attention (self and cross: the splits merged in the same launch; two launches each before), plus one for
    the embeddings and one for the final norm and the logits, each passing triton_pdl's arguments;
    no torch op computes anything (views and no-op conversions only). The unfused step launches about twice as many."""
    from kernel_checks import LaunchTrace  # tests/
    from triton.runtime.interpreter import InterpretedFunction

    from speechrt.kernels import triton_fused_whisper, triton_pdl
    from speechrt.kernels.triton_fused_whisper import OPS
    from speechrt.models.whisper_fused import decoder_step_fused

    if not isinstance(triton_fused_whisper._norm_linear_kernel, InterpretedFunction):
        pytest.skip("counts the interpreter's launches; the kernels are compiled for a GPU in this process")
    m = models[1]
    caches = m.new_cache(2, 8, torch.float32, "cpu")
    cross = [(torch.randn(2, 2, 12, 16), torch.randn(2, 2, 12, 16)) for _ in range(CFG.n_text_layer)]
    tok, pos, lengths = torch.tensor([[3], [4]]), torch.tensor([5]), torch.tensor([12, 9])
    with pytest.MonkeyPatch.context() as mp:
        trace = LaunchTrace(mp)
        launched, torch_ops, gated = trace.launched, trace.torch_ops, trace.gated
        mp.setattr(triton_pdl, "args", lambda device: {"PDL": False})  # triton_pdl's arguments: a marker
        with trace.ops():
            decoder_step_fused(m.decoder, OPS, tok, caches, cross, pos, lengths)
        fused = len(launched)
        assert torch_ops == [] and fused == (6 + 2) * CFG.n_text_layer + 2, (torch_ops, launched)
        assert all(gated), [n for n, g in zip(launched, gated) if not g]
        with trace.ops():
            m.decoder(tok, caches, 0, cross, position=pos, cross_lengths=lengths)
    assert len(launched) - fused + len(torch_ops) >= 2 * fused, (launched[fused:], torch_ops)
