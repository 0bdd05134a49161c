"""Hugging Face Whisper directories and openai-whisper .pt checkpoints load and match transformers'
logits on the same (random, tiny) weights."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

from speechrt.models.registry import resolve

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module", params=[(80, 51864, 4), (128, 51866, 6)], ids=["en-80mel", "multi-128mel"])
def hf_model(request, tmp_path_factory):
    n_mels, vocab, ffn_mult = request.param
    torch.manual_seed(n_mels)
    cfg = transformers.WhisperConfig(
        vocab_size=vocab,
        num_mel_bins=n_mels,
        d_model=64,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64 * ffn_mult,
        decoder_ffn_dim=64 * ffn_mult,
        max_source_positions=1500,
        max_target_positions=448,
        decoder_start_token_id=50257,
        pad_token_id=50256,
        bos_token_id=50256,
        eos_token_id=50256,
    )
    model = transformers.WhisperForConditionalGeneration(cfg).eval()
    with torch.no_grad():  # random but not degenerate: layer norms and biases away from identity/zero
        for n, p in model.named_parameters():
            if "layer_norm" in n or n.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
    d = tmp_path_factory.mktemp("hf") / "whisper-tiny-random"
    model.save_pretrained(d, safe_serialization=True)
    shutil.copy(resolve(None, "asr").path / "tokenizer.json", d / "tokenizer.json")
    return model, d


def _features(n_mels, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, n_mels, 3000, generator=g) * 0.5


def _our_logits(model_path, mel, tokens):
    from speechrt.backends import get

    runner = get("torch").asr(resolve(model_path, "asr"), device="cpu", dtype="float32")
    with torch.inference_mode():
        return runner.model(mel, tokens)


def test_hf_directory_matches_transformers(hf_model):
    model, d = hf_model
    assert resolve(d, "asr").format == "hf-whisper"
    mel = _features(model.config.num_mel_bins)
    tokens = torch.tensor([[50257, 50362, 440, 2068, 7586, 21831, 13]])
    with torch.no_grad():
        ref = model(input_features=mel, decoder_input_ids=tokens).logits
    ours = _our_logits(d, mel, tokens)
    assert torch.isfinite(ours).all()
    torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-4)


def _to_openai(model) -> dict:
    """The openai-whisper checkpoint layout ({'dims', 'model_state_dict'}) of a transformers model."""
    c = model.config
    sd = {k.removeprefix("model."): v for k, v in model.state_dict().items()}
    out = {}
    ren = [
        ("embed_positions.weight", "positional_embedding"),
        ("embed_tokens", "token_embedding"),
        ("encoder.layer_norm", "encoder.ln_post"),
        ("decoder.layer_norm", "decoder.ln"),
        ("layers", "blocks"),
        ("self_attn_layer_norm", "attn_ln"),
        ("encoder_attn_layer_norm", "cross_attn_ln"),
        ("final_layer_norm", "mlp_ln"),
        ("self_attn.", "attn."),
        ("encoder_attn.", "cross_attn."),
        ("q_proj", "query"),
        ("k_proj", "key"),
        ("v_proj", "value"),
        ("out_proj", "out"),
        ("fc1", "mlp.0"),
        ("fc2", "mlp.2"),
    ]
    for k, v in sd.items():
        if k.startswith("proj_out"):
            continue
        for a, b in ren:
            k = k.replace(a, b)
        out[k] = v.clone()
    dims = dict(
        n_mels=c.num_mel_bins,
        n_vocab=c.vocab_size,
        n_audio_ctx=c.max_source_positions,
        n_audio_state=c.d_model,
        n_audio_head=c.encoder_attention_heads,
        n_audio_layer=c.encoder_layers,
        n_text_ctx=c.max_target_positions,
        n_text_state=c.d_model,
        n_text_head=c.decoder_attention_heads,
        n_text_layer=c.decoder_layers,
    )
    return {"dims": dims, "model_state_dict": out}


def test_openai_pt_checkpoint_matches_transformers(hf_model, tmp_path):
    model, d = hf_model
    if model.config.encoder_ffn_dim != 4 * model.config.d_model:
        pytest.skip("openai checkpoints always use 4x MLP width")
    pt = tmp_path / "tiny-random.pt"
    torch.save(_to_openai(model), pt)
    assert resolve(pt, "asr").format == "openai-whisper-pt"
    mel = _features(model.config.num_mel_bins, 1)
    tokens = torch.tensor([[50257, 50363, 1169, 318]])
    with torch.no_grad():
        ref = model(input_features=mel, decoder_input_ids=tokens).logits
    torch.testing.assert_close(_our_logits(pt, mel, tokens), ref, rtol=1e-4, atol=1e-4)


def test_multilingual_hf_model_transcribes_with_language_detection(hf_model):
    """The full pipeline runs on a multilingual (random) model: language detection + decoding."""
    model, d = hf_model
    if model.config.vocab_size < 51865:
        pytest.skip("English-only model")
    from speechrt.pipelines.asr import load_asr

    # the copied tiny.en tokenizer.json holds every language token of the multilingual vocabulary
    asr = load_asr(d, "torch")
    assert asr.tokenizer.multilingual
    res = asr.transcribe(np.zeros(16000, np.float32), 16000, temperatures=(0.0,), sample_len=8)
    assert res.language in asr.tokenizer.languages
