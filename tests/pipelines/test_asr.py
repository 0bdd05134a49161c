"""The speech recognition pipeline's options: an initial prompt and the language, in the batched path the
server runs (decode_utterances) and in long-form transcription (which, like openai/whisper, conditions
its first window on the initial prompt)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from speechrt.errors import UserError
from speechrt.pipelines.asr import TranscribeOptions, WindowResult
from speechrt.pipelines.speech_regions import compression_ratio
from speechrt.pipelines.whisper_loops import cut_repeat_said_too_fast

SPEECH = "The museum opens at nine and closes at five on weekdays."
PROMPT = "Opening hours of the city museum, nine to five."


def test_initial_prompt_in_a_batch_equals_long_form(asr, synth):
    """With a prompt, the batched path (prompt after <|startofprev|>, no-speech probability read at
    <|startoftranscript|>, drafts checked after the prompt) gives long-form transcription's greedy tokens."""
    audio = synth(SPEECH)
    long = asr.transcribe(audio, 16000, without_timestamps=True, temperatures=(0.0,), initial_prompt=PROMPT)
    opts = TranscribeOptions(without_timestamps=True, initial_prompt=PROMPT)
    batch = asr.transcribe_batch([audio, audio[: len(audio) // 2]], opts)[0]
    assert batch.tokens == long.segments[0].tokens and batch.text == long.text
    drafted = asr.transcribe_batch([audio], opts, [batch.tokens[:4] + [13]])[0]
    assert drafted.tokens == batch.tokens
    # the prompt is used: its style (numbers in words) carries over, where plain decoding writes digits
    plain = asr.transcribe_batch([audio], TranscribeOptions(without_timestamps=True))[0]
    assert "9" in plain.text and "nine" in batch.text, (plain.text, batch.text)


def test_language_is_checked_against_the_model(asr):
    assert asr.languages() == ["en"] and asr.check_language("en") == "en" and asr.check_language(None) is None
    with pytest.raises(UserError, match="valid: en.*English-only"):
        asr.check_language("fr")
    with pytest.raises(UserError, match="language 'de'"):
        asr.options(language="de")
    with pytest.raises(UserError, match="language 'de'"):
        asr.transcribe_batch([], TranscribeOptions(language="de"))


def test_trimmed_context_is_batch_independent_and_drafts_still_check(asr, synth):
    """With the encoder over each utterance's audio (plus a second), an utterance's transcript does not
    depend on the others of its batch (their lengths set the batch's window), and a draft checked in one
    pass gives the same tokens. A greedy loop is cut to one copy."""
    short, long_ = synth("Turn off the lights."), synth(SPEECH + " " + SPEECH)
    opts = TranscribeOptions(without_timestamps=True, trim_context=True, trim_margin=1.0, stop_repeats=3)
    alone = asr.transcribe_batch([short], opts)[0]
    both = asr.transcribe_batch([short, long_], opts)
    assert both[0].tokens == alone.tokens and "lights" in alone.text.lower()
    assert both[1].text.lower().count("museum") == 2  # said twice, at a speaker's pace: both copies stay
    drafted = asr.transcribe_batch([short, long_], opts, [alone.tokens[:2], both[1].tokens[:5] + [11]])
    assert [d.tokens for d in drafted] == [b.tokens for b in both]
    assert both[0].text.count("lights") == 1  # this one loops: "Turn off the lights... Turn off the lights..."
    looped = asr.transcribe_batch([short], replace(opts, stop_repeats=0))[0]
    assert looped.text.count("lights") > 3 and looped.tokens[: len(alone.tokens)] == alone.tokens


def test_a_batch_is_featurized_in_one_pass_and_transcribed_as_before(asr, synth):
    """transcribe_batch's log-mel of the whole batch in one pass (utterance_mels) is what each utterance's own
    log-mel window (utterance_mel, what it used before) gives, cut to the trimmed window; decoded from the
    per-utterance windows the batch gives the same tokens and text."""
    import torch

    from speechrt.models.audio import HOP_LENGTH, trimmed_frames, utterance_mel
    from speechrt.pipelines.whisper_decoding import decode_utterances

    audios = [synth("Turn off the lights."), synth(SPEECH)[:-123], synth("Yes.")]
    opts = TranscribeOptions(without_timestamps=True, trim_context=True, trim_margin=1.0, stop_repeats=3)
    runner, seen = asr.runner, []
    encode = runner.encode

    def recording(mel, stop=None, frames=None):
        seen.append(mel)
        return encode(mel, stop, frames)

    runner.encode = recording
    try:
        got = asr.transcribe_batch(audios, opts)
    finally:
        runner.encode = encode
    frames, length = trimmed_frames([len(a) // HOP_LENGTH for a in audios], opts.trim_margin)
    mels = torch.stack([utterance_mel(a, runner.config.n_mels) for a in audios])[:, :, :length]
    torch.testing.assert_close(seen[0], mels, rtol=1e-5, atol=1e-5)
    with torch.inference_mode():
        want = decode_utterances(asr.decoder, mels, opts, None, None, frames)
    assert [g.tokens for g in got] == [w.tokens for w in want] and "lights" in got[0].text.lower()
    assert [g.text for g in got] == [w.text for w in want] and "museum" in got[1].text.lower()
    assert asr.transcribe_batch([], opts) == []  # (an empty batch: nothing to featurize)


def test_a_repeat_said_faster_than_anyone_speaks_keeps_one_copy(asr):
    """A greedy loop that ends by itself after two copies (seen in a batch of eight server finals: "Please
    remember to close the windows." twice over a 2.3-s cut) keeps one copy; the same text over audio long
    enough to have said it twice, a text that is not all copies, and a short span said over a short cut
    stay as they are."""
    tok = asr.tokenizer
    once = " Please remember to close the windows."

    def result(text):
        return WindowResult(tok.encode(text), text.strip(), -0.1, 0.01, 0.0, 1.0)

    doubled = result(once * 2)
    assert cut_repeat_said_too_fast(doubled, tok, 2.32)
    assert doubled.text == once.strip() and doubled.tokens == tok.encode(once)
    assert doubled.compression_ratio == compression_ratio(once.strip())
    thrice = result(once * 3)
    assert cut_repeat_said_too_fast(thrice, tok, 3.0) and thrice.text == once.strip()
    for text, seconds in [
        (once * 2, 4.5),
        (once + " Please remember to close the door.", 2.32),
        (" No. No.", 0.5),
        (once, 1.0),
    ]:
        res = result(text)
        assert not cut_repeat_said_too_fast(res, tok, seconds), text
        assert res.text == text.strip() and res.tokens == tok.encode(text)


def test_long_form_trims_the_last_window_to_its_audio(asr):
    """The 58-s passage takes three windows; the last holds a few seconds of audio. By default that window's
    encoder pass covers its audio and a 5-s margin (not 30 s). At a 1-s margin a segment decoded after the audio's
    end (float32 said the last sentence again, from 59.6 s of 58.0) is dropped. (Whole windows: the CLI's
    --whole-windows test and test_whisper's faster-whisper comparison.)"""
    from speechrt.cli_asr import sample_path
    from speechrt.models.audio import HOP_LENGTH, N_FRAMES, SAMPLE_RATE, TRIM_STEP, load_audio
    from speechrt.models.wer import wer

    audio = load_audio(sample_path().with_name("passage.flac"))
    ref = sample_path().with_name("passage.txt").read_text()
    runner, lengths = asr.runner, []
    encode = runner.encode

    def recording(mel, stop=None, frames=None):
        lengths.append((mel.shape[-1], frames))
        return encode(mel, stop, frames)

    runner.encode = recording
    try:
        for options, margin in (
            ({}, 5.0),
            ({"trim_context": True, "trim_margin": 1.0}, 1.0),
        ):
            lengths.clear()
            out = asr.transcribe(audio, 16000, **options)
            assert len(lengths) >= 2 and all(n == N_FRAMES and f is None for n, f in lengths[:-1]), lengths
            n, (valid,) = lengths[-1]
            assert n < N_FRAMES // 2 and n % TRIM_STEP == 0 and valid <= n < valid + TRIM_STEP, lengths
            assert valid - margin * SAMPLE_RATE / HOP_LENGTH < 6 * SAMPLE_RATE / HOP_LENGTH  # <6 s of audio
            assert all(s.start < out.duration for s in out.segments) and out.segments[-1].end > 50
            assert ref.split()[-1].strip(".") in out.text.split()[-1] and wer(ref, out.text) <= 0.05, out.text
    finally:
        del runner.encode
