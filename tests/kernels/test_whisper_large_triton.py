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


@torch.inference_mode()
def test_encoder_and_decoder_steps_equal_the_reference_kernels(tmp_path):
    """The encoder, the decoder over a large-v3 prompt into the cache, then a step over the cache (the states before
    the vocabulary projection; that one is below). large-v3-turbo's 4 decoder layers (distil-large-v3's 2 are the
    same kernels, fewer times)."""
    mel = utterance_mel(load_audio(SAMPLE_SPEECH), 128)[None, :, :64]  # 0.64 s: 32 encoder positions
    outs = []
    for m in _models("large-v3-turbo", tmp_path):
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
