"""Whisper large-v3, large-v3-turbo and distil-large-v3: the 128-bin log-mel equals transformers'
WhisperFeatureExtractor on real speech; large-v3's tokenizer maps languages to its ids (yue at 50358, every
later special token one above v2's); and random-weight models of their layer structure at reduced width
(tests/whisper_large.py), from Hugging Face folders and CTranslate2 directories, give
WhisperForConditionalGeneration's encoder outputs, decoder logits and greedy ids (language given, and detected)
on the backends that run Whisper here (torch; the ONNX export on ONNX Runtime; the Triton kernels:
tests/kernels/test_whisper_large_triton.py)."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch

from speechrt import backends
from speechrt.models.audio import load_audio, log_mel_spectrogram, utterance_mel
from speechrt.models.registry import resolve
from speechrt.models.whisper_tokenizer import WhisperTokenizer
from speechrt.pipelines.asr import SAMPLE_SPEECH, ASRPipeline, TranscribeOptions

transformers = pytest.importorskip("transformers", reason="the peer: pip install 'speechrt[peers]'")
wl = pytest.importorskip("whisper_large")

N = 12  # greedy tokens compared


@pytest.fixture(scope="module")
def speech():
    return load_audio(SAMPLE_SPEECH)  # 7.4 s of real speech


@pytest.fixture(scope="module")
def mel(speech):
    return utterance_mel(speech, 128)[None]


def test_log_mel_128_bins_equals_transformers_feature_extractor(speech):
    """WhisperFeatureExtractor(feature_size=128) pads the audio to 30 s; our log-mel of the same padded audio is
    its features, and the utterance window the pipelines build holds the same content frames."""
    fe = transformers.WhisperFeatureExtractor(feature_size=128)
    ref = fe(speech, sampling_rate=16000, return_tensors="np").input_features[0]
    assert ref.shape == (128, 3000)
    padded = np.zeros(480000, np.float32)
    padded[: len(speech)] = speech
    ours = log_mel_spectrogram(padded, 128).numpy()
    assert ours.shape == ref.shape and np.ptp(ref) > 1.0
    np.testing.assert_allclose(ours, ref, rtol=0, atol=1e-5)
    n = len(speech) // 160
    np.testing.assert_allclose(utterance_mel(speech, 128)[:, :n].numpy(), ref[:, :n], rtol=0, atol=1e-5)


def test_large_v3_language_and_special_token_ids(tmp_path):
    """large-v3's 100 languages ('yue' last) and the special tokens after them at their published ids."""
    tok = WhisperTokenizer(wl.write_tokenizer(tmp_path / "tokenizer.json"), True, wl.VOCAB - 51765 - 1)
    assert len(tok.languages) == 100 and tok.languages[-1] == "yue"
    assert tok.sot_sequence("yue", "transcribe") == [wl.SOT, wl.YUE, wl.TRANSCRIBE]
    assert tok.sot_sequence("en", "translate") == [wl.SOT, 50259, wl.TRANSLATE]
    assert tok.sot_sequence("su", "transcribe") == [wl.SOT, 50357, wl.TRANSCRIBE]
    assert (tok.sot_prev, tok.no_speech, tok.no_timestamps, tok.timestamp_begin) == (
        wl.SOT_PREV,
        wl.NO_SPEECH,
        wl.NO_TIMESTAMPS,
        wl.NO_TIMESTAMPS + 1,
    )
    assert tok.language_ids == list(range(50259, 50359))


@pytest.fixture(scope="module", params=list(wl.VARIANTS))
def written(request, mel, tmp_path_factory):
    """(HF folder, CTranslate2 directory, transformers' outputs) of a variant whose model detects 'yue' in `mel`:
    its encoder output, logits of TOKENS, and greedy ids (language detected, and 'en') with the suppression our
    pipeline applies."""
    m = wl.model(request.param)
    wl.prefer_language(m, mel, "yue")
    root = tmp_path_factory.mktemp(request.param)
    hf = wl.save_hf(m, root / "hf")
    suppress = WhisperTokenizer(hf / "tokenizer.json", True, 100).suppress_ids(())
    with torch.inference_mode():
        ref = {
            "encoder": m.model.encoder(mel).last_hidden_state,
            "logits": m(input_features=mel, decoder_input_ids=TOKENS).logits,
            "decoder_layers": m.config.decoder_layers,
        }
        for language in (None, "en"):
            ref[language] = wl.greedy_hf(m, mel, suppress, N, language)
    ct2 = {}
    if importlib.util.find_spec("ctranslate2"):  # its converter writes the CTranslate2 directories (the peers extra)
        ct2 = {"ct2": wl.save_ct2(hf, root / "ct2"), "ct2vocab": wl.save_ct2(hf, root / "ct2vocab", False)}
    return hf, ct2, ref


def _ct2(ct2: dict, fmt: str):
    if fmt not in ct2:
        pytest.skip("ctranslate2 (its converter) is not installed: pip install 'speechrt[peers]'")
    return ct2[fmt]


TOKENS = torch.tensor([[wl.SOT, wl.YUE, wl.TRANSCRIBE, wl.NO_TIMESTAMPS, 440, 2068, 7586, 21831, 13]])


def _runner(path, backend="torch"):
    return backends.get(backend).asr(resolve(path, "asr"), device="cpu", dtype="float32")


@pytest.mark.parametrize("fmt", ["hf", "ct2"])
@torch.inference_mode()
def test_encoder_outputs_and_decoder_logits_equal_transformers(written, mel, fmt):
    hf, ct2, ref = written
    model = resolve(hf if fmt == "hf" else _ct2(ct2, fmt), "asr")
    assert model.format == {"hf": "hf-whisper", "ct2": "ct2-whisper"}[fmt]
    runner = _runner(model.path)
    c = runner.config
    assert (c.n_mels, c.n_vocab, c.n_audio_layer, c.n_text_layer) == (128, 51866, 4, ref["decoder_layers"])
    enc = runner.model.encoder(mel)
    assert enc.shape == ref["encoder"].shape == (1, 1500, 64)
    torch.testing.assert_close(enc, ref["encoder"], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(runner.model(mel, TOKENS), ref["logits"], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("source", ["hf-torch", "hf-onnxruntime", "ct2-torch", "ct2vocab-torch"])
def test_greedy_ids_and_language_detection_equal_transformers(written, speech, source):
    """Greedy transcripts of real speech, the language detected (the model's is 'yue') and given ('en'): the
    decoder prompt takes large-v3's language and task ids, and the ids equal transformers' generate. ct2vocab: a
    CTranslate2 directory as its converter writes it by default, with vocabulary.json and no tokenizer.json."""
    hf, ct2, ref = written
    fmt, backend = source.split("-")
    asr = ASRPipeline(_runner(hf if fmt == "hf" else _ct2(ct2, fmt), backend))
    assert asr.languages()[-1] == "yue" and len(asr.languages()) == 100
    assert asr.detect_language(speech, 1)[0][0] == "yue"
    for language in (None, "en"):
        opts = TranscribeOptions(
            without_timestamps=True, language=language, suppress_blank=False, suppress_tokens=(), sample_len=N
        )
        got = asr.transcribe_batch([speech], opts)[0].tokens
        assert len(set(ref[language])) > 1, ref[language]  # not one token repeated
        assert got == ref[language], (source, language)
    assert ref[None] != ref["en"]  # the language token made a difference


def test_tokenizer_from_a_ctranslate2_vocabulary(written):
    """A CTranslate2 directory without tokenizer.json: the tokenizer made from its vocabulary.json has large-v3's
    special tokens at their ids and encodes text as tokenizer.json does."""
    from tokenizers import Tokenizer

    hf, ct2, _ = written
    assert not (_ct2(ct2, "ct2vocab") / "tokenizer.json").exists()
    ours = Tokenizer.from_file(str(resolve_tokenizer(ct2["ct2vocab"])))
    real = Tokenizer.from_file(str(hf / "tokenizer.json"))
    assert ours.get_vocab_size() == real.get_vocab_size() == 51866
    assert [ours.token_to_id(t) for t in ("<|yue|>", "<|nospeech|>", "<|30.00|>")] == [wl.YUE, wl.NO_SPEECH, 51865]
    for text in (" The quick brown fox, it's 3:45 pm!", " Der Hund läuft über die Straße.", " 你好，世界。", " ♪♪ «x»"):
        assert ours.encode(text, add_special_tokens=False).ids == real.encode(text, add_special_tokens=False).ids
    # the symbols suppressed by default (encoded, as openai-whisper finds them) are the same tokens
    derived = WhisperTokenizer(resolve_tokenizer(ct2["ct2vocab"]), True, 100)
    assert derived.non_speech_tokens == WhisperTokenizer(hf / "tokenizer.json", True, 100).non_speech_tokens


def resolve_tokenizer(path):
    from speechrt.models.whisper_loaders import load_weights

    return load_weights(resolve(path, "asr")).tokenizer_path


def test_a_folder_with_other_copies_of_the_weights_loads_its_model_safetensors(written, tmp_path):
    """openai/whisper-large-v3 carries float32 shards (model.fp32-*.safetensors) beside its model.safetensors:
    the model is model.safetensors (or what model.safetensors.index.json names), the others are not read."""
    import shutil

    from safetensors.torch import load_file, save_file

    hf, _, ref = written
    d = shutil.copytree(hf, tmp_path / "with-copies")
    other = {k: torch.zeros_like(v) for k, v in load_file(str(d / "model.safetensors")).items()}
    save_file(other, str(d / "model.zz-copy.safetensors"))
    with torch.inference_mode():
        enc = _runner(d).model.encoder(utterance_mel(load_audio(SAMPLE_SPEECH), 128)[None])
    torch.testing.assert_close(enc, ref["encoder"], rtol=1e-4, atol=1e-4)
