"""Whisper on the torch backend against its peers: CTranslate2 (same model.bin), faster-whisper
(transcripts), transformers (Hugging Face layout), on speech synthesized for the test."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from speechrt.models.audio import N_FRAMES, log_mel_spectrogram, pad_or_trim_frames
from speechrt.models.registry import ModelError, resolve
from speechrt.models.wer import wer
from speechrt.models.whisper_loaders import load_ct2, read_ct2

SENTENCES = [
    "The weather will be sunny tomorrow with a light breeze from the west.",
    "Please remember to close the windows before you leave the house.",
    "She bought three apples, a loaf of bread and a bottle of milk.",
    "The meeting has been moved to Thursday afternoon at two o'clock.",
    "Our train was delayed because of a signal problem near the station.",
    "He plays the piano every evening after dinner.",
    "The museum opens at nine and closes at five on weekdays.",
    "Can you tell me the way to the nearest post office?",
    "The children built a sand castle on the beach.",
    "Turn left at the traffic lights and then go straight ahead.",
    "My sister is studying chemistry at the university.",
    "The library has thousands of books about history and science.",
    "We watched a documentary about whales last night.",
    "The restaurant on the corner serves excellent pasta.",
    "Dogs need regular exercise and a healthy diet.",
    "The river flows quietly through the green valley.",
    "I would like a cup of coffee with a little sugar, please.",
    "The new phone has a bigger screen and a better camera.",
    "Farmers are worried about the lack of rain this summer.",
    "The pilot announced that we would land in twenty minutes.",
    "Reading before bed helps many people fall asleep.",
    "The company plans to open a new office in the spring.",
]


@pytest.fixture(scope="module")
def ct2_model():
    ctranslate2 = pytest.importorskip("ctranslate2")
    return ctranslate2.models.Whisper(
        str(resolve(None, "asr").path), device="cpu", compute_type="float32", intra_threads=2
    )


@pytest.fixture(scope="module")
def fw_model():
    fw = pytest.importorskip("faster_whisper")
    return fw.WhisperModel(str(resolve(None, "asr").path), device="cpu", compute_type="float32", cpu_threads=2)


def test_ct2_parser_reads_every_variable():
    _, _, arrays = read_ct2(resolve(None, "asr").path / "model.bin")
    assert arrays["decoder/projection/weight"] is arrays["decoder/embeddings/weight"]  # alias resolved
    assert arrays["encoder/conv1/weight"].shape == (384, 80, 3)
    w = load_ct2(resolve(None, "asr").path)
    assert w.config.n_audio_layer == 4 and w.config.n_vocab == 51864 and w.config.n_text_head == 6
    assert all(torch.isfinite(t).all() for t in w.state.values())


def test_encoder_matches_ctranslate2(asr, ct2_model, synth):
    import ctranslate2

    audio = synth(SENTENCES[0])
    mel = pad_or_trim_frames(log_mel_spectrogram(audio, 80, padding=N_FRAMES * 160))[None]
    ours = asr.runner.encode(mel).states.float().numpy()
    ref = np.array(ct2_model.encode(ctranslate2.StorageView.from_array(np.ascontiguousarray(mel.numpy()))))
    assert ours.shape == ref.shape == (1, 1500, 384)
    assert np.isfinite(ours).all()
    rel = np.abs(ours - ref).max() / np.abs(ref).max()
    assert rel <= 1e-3, rel


def test_cached_decoding_matches_full_forward(asr, synth):
    """The KV-cached step path gives the logits of the uncached full forward pass."""
    m = asr.runner.model
    mel = pad_or_trim_frames(log_mel_spectrogram(synth(SENTENCES[1]), 80, padding=N_FRAMES * 160))[None]
    tokens = torch.tensor([[50257, 50363, 5492, 3505, 284, 1969, 262, 9168]])
    with torch.inference_mode():
        full = m(mel, tokens)[0]
        enc = asr.runner.encode(mel)
        st = asr.runner.start(enc, 1, 16)
        step_logits = [asr.runner.decode_step(st, tokens[:, :3])[0]]
        for i in range(3, tokens.shape[1]):
            step_logits.append(asr.runner.decode_step(st, tokens[:, i : i + 1])[0])
    torch.testing.assert_close(torch.stack(step_logits), full[2:], rtol=1e-4, atol=1e-4)


def test_tokenizer_suppression_lists_match_model_config(asr):
    cfg = json.loads((resolve(None, "asr").path / "config.json").read_text())
    assert asr.tokenizer.suppress_ids((-1,)) == sorted(cfg["suppress_ids"])
    assert set(asr.tokenizer.non_speech_tokens) < set(cfg["suppress_ids"])
    assert asr.tokenizer.encode(" ") + [asr.tokenizer.eot] == cfg["suppress_ids_begin"]
    assert asr.tokenizer.decode(asr.tokenizer.encode(" Hello, world!")) == " Hello, world!"


def test_greedy_transcripts_identical_to_faster_whisper(asr, fw_model, synth):
    texts = SENTENCES[:6] + [" ".join(SENTENCES[6:9])]
    for text in texts:
        audio = synth(text)
        ours = asr.transcribe(audio, 16000, beam_size=1)
        segs, _ = fw_model.transcribe(audio, beam_size=1, vad_filter=False)
        segs = list(segs)
        assert ours.text == "".join(s.text for s in segs).strip()
        assert [s.text for s in ours.segments] == [s.text for s in segs]
        for a, b in zip(ours.segments, segs):
            assert abs(a.start - b.start) < 0.021 and abs(a.end - b.end) < 0.021


def test_long_form_identical_to_faster_whisper(asr, fw_model):
    """58 s passage, three 30-second windows seeking by timestamps (whole windows, as faster-whisper's)."""
    from speechrt.cli_asr import sample_path
    from speechrt.models.audio import load_audio

    audio = load_audio(sample_path().with_name("passage.flac"))
    ours = asr.transcribe(audio, 16000, trim_context=False)
    segs = list(fw_model.transcribe(audio, beam_size=1, vad_filter=False)[0])
    assert len(ours.segments) == len(segs) > 4
    assert [s.text for s in ours.segments] == [s.text for s in segs]
    assert ours.segments[-1].end > 50
    assert all(a.end <= b.start + 1e-6 for a, b in zip(ours.segments, ours.segments[1:]))
    ref = sample_path().with_name("passage.txt").read_text()
    assert wer(ref, ours.text) <= 0.05


def test_word_error_rate_on_synthesized_sentences(asr, synth):
    """Every sentence, spoken four to a recording (about 17 s: one window, one encoder pass for four; each
    sentence alone is transcribed by the faster-whisper comparisons above)."""
    assert len(SENTENCES) >= 20
    refs = [" ".join(SENTENCES[i : i + 4]) for i in range(0, len(SENTENCES), 4)]
    hyps = [
        asr.transcribe(np.concatenate([synth(s) for s in SENTENCES[i : i + 4]]), 16000).text
        for i in range(0, len(SENTENCES), 4)
    ]
    assert wer(refs, hyps) <= 0.05, list(zip(refs, hyps))


def test_beam_search(asr, fw_model, synth):
    refs = SENTENCES[9:13]
    hyps = []
    for s in refs:
        audio = synth(s)
        ours = asr.transcribe(audio, 16000, beam_size=5)
        theirs = "".join(x.text for x in fw_model.transcribe(audio, beam_size=5, vad_filter=False)[0]).strip()
        assert wer(theirs, ours.text) <= 0.1, (ours.text, theirs)
        hyps.append(ours.text)
    assert wer(refs, hyps) <= 0.05


def test_without_timestamps_and_silence(asr, fw_model, synth):
    """Without timestamp tokens the transcript is faster-whisper's greedy one on the same audio (that
    includes its mistakes: tiny.en hears SENTENCES[2] as "Cheebot 3 apples" when it may not time it)."""
    refs = SENTENCES[:6]
    hyps = []
    for s in refs:
        audio = synth(s)
        r = asr.transcribe(audio, 16000, without_timestamps=True)
        theirs = "".join(
            x.text
            for x in fw_model.transcribe(
                audio,
                beam_size=1,
                temperature=0.0,
                without_timestamps=True,
                vad_filter=False,
                condition_on_previous_text=False,
            )[0]
        ).strip()
        assert wer(theirs, r.text) <= 0.1 and len(r.segments) == 1, (r.text, theirs)
        hyps.append(r.text)
    assert wer(refs, hyps) <= 0.1, list(zip(refs, hyps))
    silence = asr.transcribe(np.zeros(16000 * 3, np.float32), 16000)
    assert silence.text == "" or silence.segments[0].no_speech_prob > 0.3


def test_truncated_and_foreign_model_files(tmp_path):
    src = resolve(None, "asr").path
    bad = tmp_path / "truncated"
    bad.mkdir()
    for f in ("config.json", "tokenizer.json"):
        shutil.copy(src / f, bad / f)
    (bad / "model.bin").write_bytes((src / "model.bin").read_bytes()[:1_000_000])
    with pytest.raises(ModelError, match="truncated"):
        load_ct2(resolve(bad, "asr").path)
    (bad / "model.bin").write_bytes(b"GGUF" + b"\0" * 100)
    with pytest.raises(ModelError, match="not a CTranslate2 model file"):
        load_ct2(bad)
    from speechrt.pipelines.asr import load_asr

    (bad / "model.bin").write_bytes((src / "model.bin").read_bytes()[:500])
    with pytest.raises(ModelError):
        load_asr(bad, "torch")
    pt = tmp_path / "model.pt"
    torch.save({"weights": torch.zeros(3)}, pt)
    with pytest.raises(ModelError, match="not an openai-whisper checkpoint"):
        load_asr(pt, "torch")


def test_drafted_greedy_equals_plain_greedy(asr, synth):
    """transcribe_batch with drafts (checked in one pass, then stepwise from the first wrong token) gives
    plain greedy decoding's tokens and log probabilities, whatever the drafts: the transcript of the
    first part of the speech (the streaming server's case), the full answer, the answer plus junk,
    junk alone, empty, and a draft longer than the sample budget; rows of one batch with different
    drafts."""
    from speechrt.pipelines.asr import TranscribeOptions

    transcribe_batch = asr.transcribe_batch
    # the server's live windows (and 5x faster)
    opts = TranscribeOptions(without_timestamps=True, trim_context=True, trim_margin=1.0)
    audios = [synth(SENTENCES[i]) for i in (0, 7, 9)]
    plain = transcribe_batch(audios, opts)
    assert all(p.tokens for p in plain)
    rng = np.random.default_rng(0)
    for k, (audio, ref) in enumerate(zip(audios, plain)):
        part = transcribe_batch([audio[: len(audio) * 3 // 5]], opts)[0].tokens
        junk = rng.integers(0, asr.tokenizer.eot, 6).tolist()
        for draft in (part, ref.tokens, ref.tokens + junk, junk, [], ref.tokens[:2] + [asr.tokenizer.eot] + junk):
            got = transcribe_batch([audio], opts, [draft])[0]
            assert got.tokens == ref.tokens, (k, draft, got.text, ref.text)
            assert abs(got.avg_logprob - ref.avg_logprob) < 1e-4
    short = TranscribeOptions(without_timestamps=True, trim_context=True, trim_margin=1.0, sample_len=4)
    capped = transcribe_batch(audios[:1], short)[0]
    assert transcribe_batch(audios[:1], short, [plain[0].tokens])[0].tokens == capped.tokens
    assert len(capped.tokens) == 4
    drafts = [plain[0].tokens[:3], None, plain[2].tokens + junk]
    batch = transcribe_batch(audios, opts, drafts)
    assert [b.tokens for b in batch] == [p.tokens for p in plain]
    with pytest.raises(ValueError, match="2 drafts for 3"):
        transcribe_batch(audios, opts, drafts[:2])


def test_an_opening_round_capped_at_its_tokens_sends_the_whole_decodes_first_word(asr, synth):
    """The streaming server's opening rounds (a turn's first words) decode OPENING_TOKENS tokens only, and send
    the first word of a hypothesis of two or more (Turn.agree): on real speech cut where openings run (0.6-1.5 s
    of it; benchmarks.opening_study), that word is the whole greedy decode's, and the cap stops most rounds. (The
    tokens after it may differ where two are near a tie at the audio's end: the decoder's cache is sized by the
    cap, which moves the last bits of its sums; "the meeting at" vs "the meeting at the".)"""
    from benchmarks.opening_study import SPEECH_S, study
    from speechrt.streaming.realtime.policy import OPENING_TOKENS

    data = [(SENTENCES[i], synth(SENTENCES[i])) for i in (1, 3, 10, 16)]  # (0.3 s of silence before the speech)
    whole, capped = study(asr, data, [None, OPENING_TOKENS], lead_s=0.3)
    assert whole["rounds"] == capped["rounds"] == len(data) * len(SPEECH_S)
    assert whole["sends"] == capped["sends"] == capped["same"] == capped["rounds"], capped
    assert capped["cut"] >= capped["rounds"] // 2 and whole["cut"] == 0
