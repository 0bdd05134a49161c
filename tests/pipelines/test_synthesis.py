"""Streaming synthesis on the real voice (chunked vs whole-sentence audio per backend: tests/backends/
test_conformance.py): context and crossfade, the background flow, first audio after one short window, text arriving
token by token, controls (rate, noise, speaker, sample rate, format) and errors."""

from __future__ import annotations

import wave

import numpy as np
import pytest
import soundfile as sf
import soxr
import torch

from speechrt.backends.base import TTSRunner
from speechrt.backends.tts_plan import WINDOW_GROWTH, makespan
from speechrt.backends.tts_runner import flow_pieces
from speechrt.errors import UserError
from speechrt.pipelines.tts import SynthesisOptions, load_tts, stream_latent, windows

LONG = (
    "When the morning train finally pulled into the quiet station, the travelers gathered their heavy bags "
    "and walked slowly toward the old wooden bridge that crossed the river."
)


pytestmark = pytest.mark.usefixtures("one_cpu_thread")


@pytest.fixture(scope="module")
def torch_tts():
    return load_tts(backend="torch")


def test_windows_cover_and_grow():
    for parallel in (1, 2):
        for frames, largest in ((700, 256), (2000, 400), (790, 400)):
            w = windows(frames, 16, largest, parallel)
            sizes = [b - a for a, b in w]
            assert w[0] == (0, 16) and w[-1][1] == frames
            assert all(a == b for (_, a), (b, _) in zip(w, w[1:]))  # contiguous
            assert sizes[:2] == [16, 16 * WINDOW_GROWTH] and max(sizes) <= largest
            grown = [16 * WINDOW_GROWTH**i for i in range(len(sizes))]
            k = next(i for i, (s, g) in enumerate(zip(sizes, grown)) if s != min(g, largest))  # the split
            tail = sizes[k:]
            assert k >= 2 and len(tail) % parallel == 0 and max(tail) - min(tail) <= 1  # workers finish together
    # two workers, 30 words: the rest after two windows fits in two, so it is two (few borders)
    assert [b - a for a, b in windows(790, 16, 400, 2)] == [16, 48, 363, 363]
    assert windows(20, 16, 256) == [(0, 20)]  # a short tail joins the window before it
    assert [b - a for a, b in windows(100, 16, 256, 2)] == [16, 48, 36]  # no window under 2 * first
    assert [b - a for a, b in windows(133, 16, 400, 2)] == [16, 48, 69]  # nor a split into windows under 4 * first
    assert [b - a for a, b in windows(200, 16, 400, 2)] == [16, 48, 68, 68]


def test_windows_wait_for_the_background_flow():
    """With the flow computed in the background, one piece per window (flow_cost: its work per frame over
    the generator's), a rest split one window per worker shrinks window by window by (1 + flow_cost), so
    that the worker that computes the flow, which vocodes the last window, ends with the others."""
    assert [b - a for a, b in windows(700, 16, 400, 2, 0.3)] == [16, 48, 359, 277]  # 359 = 1.3 x 277
    assert [b - a for a, b in windows(791, 16, 400, 2, 0.3)] == [16, 48, 400, 327]  # none over `largest`
    sizes = [b - a for a, b in windows(1064, 16, 400, 4, 0.3)]
    assert sizes[:2] == [16, 48] and all(abs(x / y - 1.3) < 0.02 for x, y in zip(sizes[2:], sizes[3:]))
    # not where a window would be under 4 * first frames, nor where the windows outnumber the workers
    assert [b - a for a, b in windows(200, 16, 400, 2, 0.3)] == [16, 48, 68, 68]
    assert windows(2000, 16, 400, 2, 0.3) == windows(2000, 16, 400, 2)


def test_windows_end_together_when_the_latent_is_ready():
    """With the whole latent ready (context > 0: no background flow), the windows after the first are sized
    so that workers taking them in order end together, never later than the plan without it (makespan)."""
    assert [b - a for a, b in windows(133, 16, 400, 2, 0.0, 11)] == [16, 64, 53]  # 5 words; was 16, 48, 69
    assert [b - a for a, b in windows(200, 16, 400, 2, 0.0, 11)] == [16, 48, 84, 52]  # was 16, 48, 68, 68
    # by hand, 133 frames: worker A vocodes 16 + 11 then 11 + 53 frames (91), B 11 + 64 + 11 (86); before,
    # A 27 + 80 = 107 while B idled after 70
    assert makespan([(0, 16), (16, 80), (80, 133)], 133, 11, 2) == 91
    assert makespan([(0, 16), (16, 64), (64, 133)], 133, 11, 2) == 107
    for parallel in (2, 3, 4):
        for frames in range(17, 420, 7):
            plain = windows(frames, 16, 400, parallel)
            w = windows(frames, 16, 400, parallel, 0.0, 11)
            assert w[0] == plain[0] and w[-1][1] == frames and all(a == b for (_, a), (b, _) in zip(w, w[1:]))
            assert all(b > a for a, b in w) and max(b - a for a, b in w) <= 400
            assert makespan(w, frames, 11, parallel) <= makespan(plain, frames, 11, parallel)
            # a window that starts beside the first is due when its audio ends: none over 4 x first
            assert w == plain or w[1][1] - w[1][0] <= 4 * 16
            assert windows(frames, 16, 400, parallel, 0.3, 11) == windows(frames, 16, 400, parallel, 0.3)
    assert windows(300, 16, 400, 1, 0.0, 11) == windows(300, 16, 400, 1)  # one worker: nothing to balance


def test_crossfade_hides_missing_context(torch_tts):
    """Without context a window border is a discontinuity; with it, none (the reason for context + crossfade)."""
    r = torch_tts.runner
    o = torch_tts.options(noise_scale=0.0, noise_w=0.0)
    lat = r.latent(next(torch_tts.text.sentences(LONG)), o)
    whole = r.vocode(lat, 0, lat.frames).numpy()
    naive = np.concatenate([r.vocode(lat, a, b).numpy() for a, b in windows(lat.frames, 16, 256)])
    assert np.abs(naive - whole).max() > 1e-2


def test_background_flow_equals_whole_flow(torch_tts):
    """The torch runner runs the flow on the first windows' frames at once and on the rest in the background,
    in pieces, one per later window, each released when done; with the flow's receptive field as context,
    the pieces equal the whole-sentence flow."""
    r = torch_tts.runner
    o = torch_tts.options(noise_scale=0.0, noise_w=0.0)
    ids = next(torch_tts.text.sentences(LONG))
    lat = r.latent(ids, o)
    ends = [e for e, _ in lat.pieces]
    assert lat.ready < ends[0] and ends == sorted(ends) and ends[-1] == lat.frames and len(ends) >= 2
    lat.wait_for(ends[0] - 1)
    assert lat.pieces[0][1].done()
    lat.wait_for(lat.frames)
    assert all(f.done() and f.exception() is None for _, f in lat.pieces)
    short = r.latent(next(torch_tts.text.sentences("The weather is nice today.")), o)
    # its flow past the first windows' frames is short: all of it at once, no background piece
    assert short.ready is None and not short.pieces and short.frames > r.head_frames(short.frames, o)
    with torch.inference_mode():
        m, logs = r.model.prior(torch.tensor([ids]), o.length_scale, 0.0)
        whole = r.model.latent(m, logs, 0.0)
    assert whole.shape == lat.z.shape and (whole - lat.z).abs().max() <= 1e-4


def test_flow_pieces_follow_the_windows():
    """One piece per window that reads past what is done (its end + context), short ones merged forward."""
    wins = windows(790, 16, 400, 2)  # 16, 48, 363, 363
    assert flow_pieces(790, 77, wins, 13, 66) == [64 + 363 + 13, 790]
    assert flow_pieces(790, 790, wins, 13, 66) == []  # all done at once
    one = windows(790, 16, 400, 1)  # 16, 48, 144, 291, 291
    assert flow_pieces(790, 77, one, 13, 66) == [64 + 144 + 13, 208 + 291 + 13, 790]
    assert flow_pieces(790, 77, one, 13, 200) == [512, 790]  # 77 -> 221 is under 200 frames: merged


def test_one_worker_runs_the_pieces_before_the_windows(torch_tts):
    """With a single worker, the flow's pieces must be queued ahead of the windows that read them (a window
    waiting on a piece queued behind it would wait forever): a long sentence on one worker finishes, and
    its audio equals the two-worker runner's."""
    import threading

    from speechrt.backends.threads import ThreadPolicy
    from speechrt.backends.tts_runner import TorchTTSRunner

    r = torch_tts.runner
    one = TorchTTSRunner(r.model, r.voice, torch.device("cpu"), torch.float32, ThreadPolicy(1, 1, True))
    assert one.parallel == 1
    o = torch_tts.options(noise_scale=0.0, noise_w=0.0)
    ids = next(torch_tts.text.sentences(LONG))
    out = {}
    t = threading.Thread(
        target=lambda: out.update(a=torch.cat(list(stream_latent(one, one.latent(ids, o), o)))), daemon=True
    )
    t.start()
    t.join(120)
    assert not t.is_alive(), "one worker deadlocked on a flow piece"
    lat = one.latent(ids, o)
    assert len(lat.pieces) >= 2  # one worker: windows of 16, 48, 144, ... -> several pieces
    two = torch.cat(list(stream_latent(r, r.latent(ids, o), o)))
    assert out["a"].shape == two.shape and (out["a"] - two).abs().max() <= 1e-4


def test_a_failed_flow_piece_fails_its_windows(torch_tts):
    """An error in a background flow piece reaches every window that waits for its frames (raised there, not
    a hang), and the runner keeps serving the next sentence."""
    import threading

    from speechrt.backends.threads import ThreadPolicy
    from speechrt.backends.tts_runner import TorchTTSRunner

    r = torch_tts.runner
    one = TorchTTSRunner(r.model, r.voice, torch.device("cpu"), torch.float32, ThreadPolicy(1, 2, True))
    o = torch_tts.options(noise_scale=0.0, noise_w=0.0)
    ids = next(torch_tts.text.sentences(LONG))
    flow = one._flow

    def broken(z_p, start, end, g, wide=None):
        if start > 0:
            raise RuntimeError("flow piece failed")
        return flow(z_p, start, end, g, wide)

    one._flow = broken
    out = {}

    def speak():
        try:
            list(stream_latent(one, one.latent(ids, o), o))
        except RuntimeError as e:
            out["error"] = str(e)

    t = threading.Thread(target=speak, daemon=True)
    t.start()
    t.join(120)
    assert not t.is_alive() and out.get("error") == "flow piece failed"
    del one._flow  # the method again
    assert len(torch.cat(list(stream_latent(one, one.latent(ids, o), o)))) > 0


def test_a_cancelled_flow_task_releases_its_pieces():
    """Pieces whose background task never ran (cancelled in the pool's queue) fail instead of leaving their
    windows waiting forever."""
    from concurrent.futures import CancelledError, Future

    from speechrt.backends.base import Latent
    from speechrt.backends.tts_runner import release

    task, pieces = Future(), [(40, Future()), (80, Future())]
    task.add_done_callback(lambda t: release(t, pieces))
    lat = Latent(torch.zeros(1, 2, 80), None, 10, pieces)
    lat.wait_for(5)  # frames already there: no wait
    assert task.cancel()
    with pytest.raises(CancelledError):
        lat.wait_for(60)
    assert all(f.done() for _, f in pieces)


class CountingRunner:
    """The real runner, counting vocoder calls (to see how much work precedes the first chunk)."""

    def __init__(self, runner):
        self.r, self.calls = runner, []
        self.hop_length, self.context_frames, self.sample_rate = (
            runner.hop_length,
            runner.context_frames,
            runner.sample_rate,
        )
        self.flow_cost = runner.flow_cost

    parallel = 1
    plan_windows = TTSRunner.plan_windows

    def vocode(self, latent, a, b):
        self.calls.append((a, b))
        return self.r.vocode(latent, a, b)

    def vocode_async(self, latent, a, b):
        return TTSRunner.vocode_async(self, latent, a, b)


def test_first_chunk_needs_one_short_window(torch_tts):
    r = torch_tts.runner
    o = torch_tts.options()
    lat = r.latent(next(torch_tts.text.sentences(LONG)), o)
    c = CountingRunner(r)
    first = next(stream_latent(c, lat, o))
    assert len(c.calls) == 1 and c.calls[0] == (0, o.first_chunk_frames + r.context_frames)
    assert len(first) == o.first_chunk_frames * r.hop_length
    assert c.calls[0][1] < lat.frames / 10  # the first audio costs under a tenth of the sentence's vocoding


def test_api_streams_sentence_by_sentence(torch_tts):
    chunks = list(torch_tts.synthesize("Good morning. " + LONG, seed=3))
    assert all(c.dtype == np.float32 for c in chunks) and len(chunks) >= 6
    st = torch_tts.last_stats
    assert st.audio_seconds == pytest.approx(sum(len(c) for c in chunks) / 22050)
    assert 0 < st.first_audio_seconds < st.compute_seconds


def test_seed_makes_noise_reproducible(torch_tts):
    a = torch_tts.synthesize_array("Say it again.", seed=7)
    b = torch_tts.synthesize_array("Say it again.", seed=7)
    c = torch_tts.synthesize_array("Say it again.", seed=8)
    assert np.array_equal(a, b) and not (len(a) == len(c) and np.array_equal(a, c))


def test_rate_changes_duration(torch_tts):
    text = "This sentence is spoken at different speeds."
    normal = torch_tts.synthesize_array(text, noise_w=0.0, noise_scale=0.0)
    fast = torch_tts.synthesize_array(text, noise_w=0.0, noise_scale=0.0, rate=1.5)
    slow = torch_tts.synthesize_array(text, noise_w=0.0, noise_scale=0.0, length_scale=1.5)
    assert len(fast) / len(normal) == pytest.approx(1 / 1.5, rel=0.1)
    assert len(slow) / len(normal) == pytest.approx(1.5, rel=0.1)


def test_output_rate_and_formats(torch_tts, tmp_path):
    text = "Resampled output."
    base = torch_tts.synthesize_array(text, noise_w=0.0, noise_scale=0.0)
    at16 = np.concatenate(list(torch_tts.synthesize(text, noise_w=0.0, noise_scale=0.0, sample_rate=16000)))
    assert len(at16) == pytest.approx(len(base) * 16000 / 22050, abs=2)
    pcm = b"".join(torch_tts.synthesize(text, noise_w=0.0, noise_scale=0.0, format="pcm16"))
    pcm = np.frombuffer(pcm, "<i2")
    assert len(pcm) == len(base) and np.abs(pcm / 32767.0 - base).max() <= 1 / 32767 + 1e-6
    torch_tts.synthesize_to_file(text, tmp_path / "a.wav", sample_rate=24000, noise_w=0.0, noise_scale=0.0)
    with wave.open(str(tmp_path / "a.wav")) as w:
        assert (w.getframerate(), w.getsampwidth(), w.getnchannels()) == (24000, 2, 1)
        assert w.getnframes() == pytest.approx(len(base) * 24000 / 22050, abs=2)
    torch_tts.synthesize_to_file(text, tmp_path / "a.f32", noise_w=0.0, noise_scale=0.0)
    assert np.array_equal(np.fromfile(tmp_path / "a.f32", np.float32), base)
    # encoded files (PyAV): FLAC exact to 16 bits; MP3, Ogg Opus (resampled to 24 kHz, a rate Opus takes) and AAC
    # the same speech after their codec's delay
    for suffix, rate, tol in (
        (".flac", 22050, 1.5 / 32767),
        (".mp3", 22050, None),
        (".ogg", 24000, None),
        (".aac", 22050, None),
    ):
        torch_tts.synthesize_to_file(text, tmp_path / f"b{suffix}", noise_w=0.0, noise_scale=0.0)
        audio, sr = read_any(tmp_path / f"b{suffix}")
        ref = base if sr == 22050 else soxr.resample(base, 22050, sr)
        assert sr == rate, suffix
        if tol is not None:
            assert len(audio) == len(ref) and np.abs(audio - ref).max() <= tol
        else:
            assert correlation_after_delay(audio, ref) > 0.9, suffix
    # a suffix it cannot write: an error naming the valid ones, and no file (a named format writes it)
    with pytest.raises(UserError, match=r"cannot write '\.m4a' audio files: valid suffixes are \.wav.*\.mp3"):
        torch_tts.synthesize_to_file(text, tmp_path / "a.m4a")
    assert not (tmp_path / "a.m4a").exists()
    torch_tts.synthesize_to_file(text, tmp_path / "a.m4a", format="wav", noise_w=0.0, noise_scale=0.0)
    assert (tmp_path / "a.m4a").read_bytes()[:4] == b"RIFF"


def test_a_path_that_cannot_be_written_is_one_error_before_synthesis(torch_tts, tmp_path):
    """The pipeline's own check (speechrt.outputs): a UserError saying what is wrong with the path, where
    open() would raise IsADirectoryError / FileNotFoundError."""
    with pytest.raises(UserError, match=r"is a directory; give a file path, such as .*out\.wav"):
        torch_tts.synthesize_to_file("Hello.", tmp_path)
    with pytest.raises(UserError, match=r"the directory .*missing does not exist"):
        torch_tts.synthesize_to_file("Hello.", tmp_path / "missing" / "a.wav")
    with pytest.raises(UserError, match=r"cannot write in /proc"):
        torch_tts.synthesize_to_file("Hello.", "/proc/speechrt-test.wav")


def read_any(path) -> tuple[np.ndarray, int]:
    """float32 mono and its rate: libsndfile where it reads the file, else PyAV (AAC)."""
    try:
        return sf.read(path, dtype="float32")
    except sf.LibsndfileError:
        import av

        with av.open(str(path)) as f:
            rate = f.streams.audio[0].rate
            return np.concatenate([fr.to_ndarray().reshape(-1) for fr in f.decode(audio=0)]), rate


def test_an_encoding_without_pyav_is_said(torch_tts, tmp_path, monkeypatch):
    """Without PyAV no MP3, Opus, AAC or FLAC is written: the error says so and what to install, before any
    synthesis, and no file is left."""
    import sys

    monkeypatch.setitem(sys.modules, "av", None)
    with pytest.raises(UserError, match=r"encoding mp3, opus, aac or flac needs PyAV \(pip install av"):
        torch_tts.synthesize_to_file("Hello.", tmp_path / "a.mp3")
    assert not (tmp_path / "a.mp3").exists()


def correlation_after_delay(audio: np.ndarray, ref: np.ndarray, max_delay: int = 4096) -> float:
    """The normalized correlation of `audio` with `ref` at the codec delay (<= max_delay samples) that fits best."""
    n = min(len(audio), len(ref)) - max_delay
    assert n > len(ref) // 2, (len(audio), len(ref))
    best = max(range(max_delay), key=lambda d: float(np.dot(audio[d : d + n], ref[:n])))
    return float(np.corrcoef(audio[best : best + n], ref[:n])[0, 1])


def test_incremental_text_is_spoken_before_it_ends(torch_tts):
    consumed = []
    tokens = (
        "The first sentence is complete here. Then comes a second one, which keeps on going "
        "for quite a while before it ends."
    ).split(" ")

    def llm():
        for i, t in enumerate(tokens):
            consumed.append(i)
            yield t + " "

    gen = torch_tts.synthesize_stream(llm())
    next(gen)
    assert len(consumed) < len(tokens)  # audio of sentence one while sentence two is still "being generated"
    rest = list(gen)
    assert len(consumed) == len(tokens) and rest


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(rate=0), "rate must be in"),
        (dict(noise_scale=-1.0), "noise_scale must be in"),
        (dict(length_scale=0.0), "length_scale must be in"),
        (dict(speaker=3), "single speaker"),
        (dict(speaker="alice"), "unknown speaker"),
        (dict(sample_rate=1000), "sample rate must be in"),
        (dict(format="mp3"), "unknown audio format"),
        (dict(sample_rate=0), "sample rate must be in"),  # (was taken as the voice's rate)
        (dict(pitch=2), "unknown synthesis option.*pitch; valid: rate, speaker, length_scale"),
    ],
)
def test_bad_controls(torch_tts, kw, match):
    with pytest.raises(UserError, match=match):
        list(torch_tts.synthesize("Hello.", **kw))


def test_bad_options_dataclass():
    with pytest.raises(UserError, match="first_chunk_frames"):
        SynthesisOptions(first_chunk_frames=0)
    with pytest.raises(UserError, match="crossfade"):
        SynthesisOptions(crossfade=-1)


def test_bad_backend_and_voice():
    with pytest.raises(UserError, match="valid backends: .*onnxruntime"):
        load_tts(backend="nope")
    with pytest.raises(UserError, match="registered tts models: piper-en_US-joe-medium"):
        load_tts("no-such-voice")


def test_stopping_early_cancels_queued_windows(torch_tts):
    gen = torch_tts.synthesize(LONG)
    first = next(gen)
    gen.close()  # a listener barged in
    assert len(first) == 16 * 256
    assert len(torch_tts.synthesize_array("Still works afterwards.")) > 22050 * 0.5
