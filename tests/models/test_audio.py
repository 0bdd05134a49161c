import numpy as np
import pytest
import soundfile as sf
import torch

from speechrt.models.audio import AudioError, load_audio, log_mel_spectrogram, mel_filters_np


@pytest.mark.parametrize("n_mels", [80, 128])
def test_mel_filters_match_faster_whisper(n_mels):
    fe = pytest.importorskip("faster_whisper.feature_extractor")
    ref = fe.FeatureExtractor.get_mel_filters(16000, 400, n_mels)
    ours = mel_filters_np(n_mels)
    assert ours.shape == ref.shape == (n_mels, 201)
    np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("n", [16000, 16000 * 7 + 123])
def test_log_mel_matches_faster_whisper(n):
    fe = pytest.importorskip("faster_whisper.feature_extractor")
    rng = np.random.default_rng(n)
    audio = (rng.standard_normal(n) * 0.1).astype(np.float32)
    ref = fe.FeatureExtractor(feature_size=80)(audio, padding=160)
    ours = log_mel_spectrogram(audio, 80, padding=160).numpy()
    assert ours.shape == ref.shape
    assert np.isfinite(ours).all()
    np.testing.assert_allclose(ours, ref, atol=2e-4)


def test_load_audio_any_rate_and_channels(tmp_path):
    t = np.arange(44100 * 2) / 44100
    tone = 0.5 * np.sin(2 * np.pi * 440 * t)
    stereo = np.stack([tone, tone], 1).astype(np.float32)
    for ext in ("wav", "flac", "ogg"):
        p = tmp_path / f"x.{ext}"
        sf.write(p, stereo, 44100)
        a = load_audio(p)
        assert a.dtype == np.float32 and a.ndim == 1
        assert abs(len(a) - 32000) <= 2
        # the tone survives resampling: dominant frequency still 440 Hz
        spec = np.abs(np.fft.rfft(a[:16000]))
        assert abs(np.argmax(spec) - 440) <= 1
    pcm16 = (tone * 32767).astype(np.int16)
    a = load_audio(pcm16, source_rate=44100)
    assert abs(float(np.abs(a).max()) - 0.5) < 0.02


def test_bad_audio_inputs(tmp_path):
    with pytest.raises(AudioError, match="no such file"):
        load_audio(tmp_path / "missing.wav")
    empty = tmp_path / "empty.wav"
    empty.write_bytes(b"")
    with pytest.raises(AudioError, match="empty"):
        load_audio(empty)
    text = tmp_path / "notes.wav"
    text.write_text("this is not audio at all\n" * 20)
    with pytest.raises(AudioError, match="not a readable audio file.*WAV, FLAC"):
        load_audio(text)
    silent = tmp_path / "zero.wav"
    sf.write(silent, np.zeros((0, 1), np.float32), 16000)
    with pytest.raises(AudioError):
        load_audio(silent)
    with pytest.raises(AudioError, match="sample rate"):
        load_audio(np.zeros(10, np.float32))
    with pytest.raises(AudioError, match="NaN"):
        load_audio(np.full(100, np.nan, np.float32), source_rate=16000)
    with pytest.raises(AudioError, match="float"):
        load_audio(np.zeros(100, np.int64), source_rate=16000)
    for rate in (0, -16000, 0.5, "16000", True):
        with pytest.raises(AudioError, match="invalid sample rate"):
            load_audio(np.zeros(100, np.float32), source_rate=rate)


def test_audio_bytes_and_file_objects_are_read_and_named_in_errors(tmp_path):
    """A file's bytes or a binary file object is audio like its path; what cannot be read is named as a person
    would name it (the audio bytes, the file's path), never as `<_io.BytesIO object at 0x...>`."""
    import io

    from speechrt.cli_asr import sample_path

    expected = load_audio(sample_path())
    np.testing.assert_array_equal(load_audio(io.BytesIO(sample_path().read_bytes())), expected)
    np.testing.assert_array_equal(load_audio(sample_path().read_bytes()), expected)
    with open(sample_path(), "rb") as f:
        np.testing.assert_array_equal(load_audio(f), expected)
    for junk in (io.BytesIO(b"junk" * 10), b"junk" * 10):
        with pytest.raises(AudioError) as e:
            load_audio(junk)
        assert str(e.value).startswith("the audio bytes: not a readable audio file (Format not recognised"), e.value
        assert "object at 0x" not in str(e.value) and "readable formats: WAV" in str(e.value)
    with pytest.raises(AudioError, match="^the audio bytes are empty$"):
        load_audio(b"")
    text = tmp_path / "notes.wav"
    text.write_text("this is not audio at all\n" * 20)
    with open(text, "rb") as f, pytest.raises(AudioError, match=f"^{text}: not a readable audio file"):
        load_audio(f)
    with pytest.raises(AudioError) as e:  # a path: named once, not again in soundfile's "Error opening '...'"
        load_audio(text)
    assert str(e.value).count(str(text)) == 1, e.value


def test_the_api_refuses_a_zero_sample_rate(tmp_path):
    """transcribe(array, sample_rate=0) is an error, not an array taken as 16 kHz (None is 16 kHz)."""
    import speechrt

    asr = speechrt.load_asr(backend="torch")
    with pytest.raises(AudioError, match="invalid sample rate 0"):
        asr.transcribe(np.zeros(16000, np.float32), 0)
    assert asr.transcribe(np.zeros(16000, np.float32)).text.strip() == ""


@pytest.mark.parametrize("n", [1600, 16001, 160 * 1234 + 77, 480000])
def test_utterance_mel_equals_padded_window(n):
    """utterance_mel (N_FFT zeros appended) equals Whisper's window built from 30 s of padding."""
    from speechrt.models.audio import HOP_LENGTH, N_FRAMES, log_mel_spectrogram, pad_or_trim_frames, utterance_mel

    a = np.random.default_rng(n).standard_normal(n).astype(np.float32) * 0.1
    a[: n // 3] *= 0.01
    ref = pad_or_trim_frames(log_mel_spectrogram(a, 80, padding=N_FRAMES * HOP_LENGTH)[:, : n // HOP_LENGTH])
    got = utterance_mel(a, 80)
    assert got.shape == (80, N_FRAMES)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n_mels", [80, 128])
def test_batched_utterance_mels_equal_each_utterance_alone(n_mels):
    """utterance_mels (every row's signal end to end, one STFT, each row floored at its own maximum) gives each
    row Whisper's window (utterance_mel is its one-row case), for a batch of odd, very short (no whole frame,
    shorter than the STFT's mirror), loud and quiet and 30-s utterances, whole windows and trimmed ones, and an
    empty batch."""
    from speechrt.models.audio import HOP_LENGTH, N_FRAMES, log_mel_spectrogram, pad_or_trim_frames, utterance_mels

    def window(a):  # Whisper's: the content frames of 30 s of padding's spectrogram, then zeros
        return pad_or_trim_frames(
            log_mel_spectrogram(a, n_mels, padding=N_FRAMES * HOP_LENGTH)[:, : len(a) // HOP_LENGTH]
        )

    rng = np.random.default_rng(n_mels)
    lengths = [16001, 0, 1, 159, 160, 201, 399, 160 * 1234 + 77, 480000, 33333, 480000 - 1, 7]
    audios = [rng.standard_normal(n).astype(np.float32) * rng.choice([1e-4, 0.1, 0.9]) for n in lengths]
    audios[7][: len(audios[7]) // 3] *= 0.01  # a quiet start: the floor is the row's own
    want = torch.stack([window(a) for a in audios])
    got = utterance_mels(audios, n_mels)
    assert got.shape == (len(lengths), n_mels, N_FRAMES)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(utterance_mels(audios[2:4] + audios[:1], n_mels, length=96), want[[2, 3, 0], :, :96])
    assert utterance_mels([], n_mels).shape == (0, n_mels, N_FRAMES)
    # the rows taken out of the batch's frames as a GPU does (one gather) and as the CPU does (a copy per row)
    from speechrt.models.audio import _rows_copied, _rows_gathered

    frames = torch.randn(n_mels, 50)
    starts, content = np.array([0, 9, 30]), np.array([7, 0, 12])
    for length in (12, 20):
        want = _rows_copied(frames, starts, content, length)
        assert want[2, :, :12].equal(frames[:, 30:42]) and not want[1].any() and not want[0, :, 7:].any()
        assert _rows_gathered(frames.clone(), starts, content, length).equal(want)
