"""Whisper large-v3-turbo's and distil-large-v3's layer structure at reduced width (tests/whisper_large.py: 128 mels,
the 51866-token vocabulary, 4 and 2 decoder layers) built with the Triton kernel set, in the Triton interpreter:
the encoder output and the decoder's logits of a large-v3 prompt (cached, then a step) of the torch kernel set
(whose runner equals transformers: tests/models/test_whisper_large.py). A short window keeps the interpreter
quick; the kernels do not depend on the window's length."""

from __future__ import annotations

import pytest
import torch

from speechrt import kernels
from speechrt.models.audio import load_audio, utterance_mel
from speechrt.models.registry import resolve
from speechrt.models.whisper import Whisper
from speechrt.models.whisper_loaders import load_weights
from speechrt.pipelines.asr import SAMPLE_SPEECH

pytestmark = pytest.mark.usefixtures("interpret")
pytest.importorskip("transformers", reason="the models are written by transformers")
wl = pytest.importorskip("whisper_large")


def _close(a, b):
    assert torch.isfinite(a).all() and torch.isfinite(b).all()
    torch.testing.assert_close(a, b, rtol=2e-4, atol=2e-4)


def _models(variant, tmp_path):
    w = load_weights(resolve(wl.save_hf(wl.model(variant), tmp_path / variant), "asr"))
    out = []
    for impl in ("torch", "triton"):
        m = Whisper(w.config, kernels.select(impl, "cpu")).eval()
        m.load_state_dict(w.state, strict=False)
        out.append(m)
    return out


@pytest.fixture(scope="module")
def turbo(tmp_path_factory):
    """large-v3-turbo's structure with the torch and the Triton kernel sets (built once for the module)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRITON_INTERPRET", "1")  # (the `interpret` fixture, function-scoped, comes after this one)
        return _models("large-v3-turbo", tmp_path_factory.mktemp("turbo"))


@torch.inference_mode()
def test_encoder_and_decoder_steps_equal_the_reference_kernels(turbo):
    """The encoder, the decoder over a large-v3 prompt into the cache, then a step over the cache (the states before
    the vocabulary projection; that one is below). large-v3-turbo's 4 decoder layers (distil-large-v3's 2 are the
    same kernels, fewer times)."""
    mel = utterance_mel(load_audio(SAMPLE_SPEECH), 128)[None, :, :64]  # 0.64 s: 32 encoder positions
    outs = []
    for m in turbo:
        xa = m.encoder(mel)
        cross = m.cross_kv(xa)
        caches = m.new_cache(1, 8, xa.dtype, xa.device)
        prompt = torch.tensor([[wl.SOT, wl.YUE, wl.TRANSCRIBE, wl.NO_TIMESTAMPS]])
        step = torch.tensor([[440]])
        outs.append((xa, m.decoder.hidden(prompt, caches, 0, cross), m.decoder.hidden(step, caches, 4, cross)))
    for a, b in zip(*outs):
        _close(b, a)


@pytest.mark.slow
@torch.inference_mode()
def test_logits_over_the_large_v3_vocabulary(tmp_path):
    """The tied projection onto the 51866 tokens (not a multiple of any block: the last block is masked); one call,
    10 s in the interpreter."""
    ref, tri = _models("distil-large-v3", tmp_path)
    h = torch.randn(2, 64, generator=torch.Generator().manual_seed(0))
    want = ref.decoder.logits(h)
    assert want.shape == (2, 51866)
    _close(tri.decoder.logits(h), want)


@torch.inference_mode()
def test_fused_decoder_step_at_the_large_v3_turbo_structure(turbo):
    """models/whisper_fused.py's step on the fused ops' references, on large-v3-turbo's structure as its loader maps
    it (4 decoder layers, 51866 tokens, the key projection's missing bias): the unfused step's logits (1e-4) and ids,
    step after step (the Triton kernels are held to these references in tests/kernels/test_triton_fused.py, and run the
    whole step on a smaller vocabulary in test_whisper_triton.py)."""
    from speechrt.kernels.reference import WHISPER_FUSED_OPS
    from speechrt.models.whisper_fused import decoder_step_fused

    m = turbo[0]
    mel = utterance_mel(load_audio(SAMPLE_SPEECH), 128)[None, :, :64]
    cross = m.cross_kv(m.encoder(mel))
    a, b = m.new_cache(1, 8, torch.float32, "cpu"), m.new_cache(1, 8, torch.float32, "cpu")
    prompt = torch.tensor([[wl.SOT, wl.YUE, wl.TRANSCRIBE, wl.NO_TIMESTAMPS]])
    m.decoder(prompt, a, 0, cross), m.decoder(prompt, b, 0, cross)
    tok = torch.tensor([[440]])
    for i in range(3):
        p = torch.tensor([4 + i])
        want = m.decoder(tok, a, 0, cross, position=p)
        got = decoder_step_fused(m.decoder, WHISPER_FUSED_OPS, tok, b, cross, p)
        assert want.shape == (1, 51866)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        assert got.argmax() == want.argmax()
        tok = want.argmax(-1, keepdim=True)
