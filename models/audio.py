"""Audio front end: decoding files, resampling, and Whisper's log-mel spectrogram.

The mel filterbank is the Slaney-normalized one librosa builds (and openai-whisper ships precomputed);
it is computed here in numpy so no librosa is needed.
"""

from __future__ import annotations

import functools
import io
from pathlib import Path

import numpy as np
import torch

from speechrt.errors import UserError

SAMPLE_RATE = 16000
N_FFT = 400
HOP_LENGTH = 160
CHUNK_LENGTH = 30
N_SAMPLES = CHUNK_LENGTH * SAMPLE_RATE  # 480000 samples in a 30-second window
N_FRAMES = N_SAMPLES // HOP_LENGTH  # 3000 frames in a mel window
TRIM_STEP = 32  # trimmed windows are a multiple of this many mel frames (fewer shapes for kernels and allocator)


class AudioError(UserError, ValueError):
    """An audio input that cannot be used; the message says what is accepted."""


def resample(audio: np.ndarray, orig_sr: int, target_sr: int) -> np.ndarray:
    """Band-limited resampling with libsoxr (HQ). audio [n] or [n, channels] float32."""
    if orig_sr == target_sr:
        return np.ascontiguousarray(audio, dtype=np.float32)
    if orig_sr <= 0:
        raise AudioError(f"invalid sample rate {orig_sr}")
    import soxr

    return soxr.resample(np.ascontiguousarray(audio, dtype=np.float32), orig_sr, target_sr, quality="HQ")


class StreamResampler:
    """Mono float32 audio at `in_rate` -> at `out_rate`, chunk by chunk, seamless across chunk borders (libsoxr's
    stream, HQ, as `resample`); `last=True` with the stream's last chunk (or an empty one) lets out the samples it
    holds back. The same rate passes the audio through."""

    def __init__(self, in_rate: int, out_rate: int):
        self.in_rate, self.out_rate, self._rs = in_rate, out_rate, None
        if in_rate != out_rate:
            import soxr

            self._rs = soxr.ResampleStream(in_rate, out_rate, 1, dtype="float32", quality="HQ")

    def __call__(self, x: np.ndarray, last: bool = False) -> np.ndarray:
        x = np.asarray(x, dtype=np.float32).reshape(-1)
        return x if self._rs is None else self._rs.resample_chunk(x, last=last)


def load_audio(source, sample_rate: int = SAMPLE_RATE, source_rate: int | None = None) -> np.ndarray:
    """Mono float32 audio at `sample_rate` from a file path (WAV, FLAC, OGG/Vorbis/Opus, MP3 — whatever
    libsndfile reads, any rate, any channel count), from such a file's bytes or a binary file object
    (io.BytesIO, open(path, "rb")), or from an array ([n] or [n, channels], with `source_rate`; int16 arrays
    are scaled to [-1, 1])."""
    if isinstance(source, (str, Path)):
        p = Path(source)
        if not p.exists():
            raise AudioError(f"{p}: no such file")
        if p.stat().st_size == 0:
            raise AudioError(f"{p}: the file is empty")
        data, sr = read_audio_file(str(p), str(p))
        if data.shape[0] == 0:
            raise AudioError(f"{p}: the audio file contains no samples")
    elif is_encoded_audio(source):
        name = _file_object_name(source)
        if isinstance(source, (bytes, bytearray, memoryview)):
            if len(source) == 0:
                raise AudioError(f"{name} are empty")
            source = io.BytesIO(source)
        data, sr = read_audio_file(source, name)
        if data.shape[0] == 0:
            raise AudioError(f"{name}: the audio file contains no samples")
    else:
        if source_rate is None:
            raise AudioError("an audio array needs its sample rate (source_rate=...)")
        if (
            isinstance(source_rate, bool)
            or not isinstance(source_rate, (int, float, np.integer, np.floating))
            or not source_rate >= 1
        ):
            raise AudioError(f"invalid sample rate {source_rate!r}: give the array's samples per second (e.g. 16000)")
        data, sr = np.asarray(source), source_rate
        if data.dtype == np.int16:
            data = data.astype(np.float32) / 32768.0
        elif data.dtype.kind != "f":
            raise AudioError(f"audio arrays must be float (in [-1, 1]) or int16, got {data.dtype}")
        if data.ndim == 2 and data.shape[0] < data.shape[1] and data.shape[0] <= 8:
            data = data.T  # [channels, n] -> [n, channels]
        if data.ndim not in (1, 2) or data.size == 0:
            raise AudioError(f"audio array must be non-empty with shape [n] or [n, channels], got {data.shape}")
    if data.ndim == 2:
        data = data.mean(axis=1)
    data = data.astype(np.float32, copy=False)
    if not np.isfinite(data).all():
        raise AudioError("audio contains NaN or infinite samples")
    return resample(data, int(sr), sample_rate)


READABLE_FORMATS = "WAV, FLAC, OGG (Vorbis/Opus), MP3, AIFF; AAC, M4A, MP4, WebM with PyAV"


def is_encoded_audio(source) -> bool:
    """Whether `source` is an audio file's bytes or a binary file object (not a path, not samples)."""
    return isinstance(source, (bytes, bytearray, memoryview)) or hasattr(source, "read")


def read_audio_file(file, name: str) -> tuple[np.ndarray, int]:
    """(float32 samples [n, channels], sample rate) of an encoded audio file (a path or a binary file object):
    what libsndfile reads, else what PyAV's ffmpeg reads (AAC, M4A, MP4, WebM); an AudioError naming it as `name`
    (a path, 'the uploaded file') if neither can. The reason is libsndfile's own words, without soundfile's
    'Error opening <_io.BytesIO object at 0x...>'."""
    import soundfile as sf

    try:
        return sf.read(file, dtype="float32", always_2d=True)
    except Exception as e:  # noqa: BLE001 - soundfile raises LibsndfileError / RuntimeError for unknown formats
        reason = getattr(e, "error_string", None) or str(e)
    if hasattr(file, "seek"):
        file.seek(0)
    pcm, rate = _av_read(file)
    if pcm is None:
        raise AudioError(f"{name}: not a readable audio file ({reason}); readable formats: {READABLE_FORMATS}")
    return pcm, rate


def _av_read(file) -> tuple[np.ndarray | None, int]:
    """The first audio stream of `file` through PyAV as float32 [n, 1] and its rate; (None, 0) if it holds none
    PyAV reads (or PyAV is missing)."""
    try:
        import av

        with av.open(file if hasattr(file, "read") else str(file)) as f:
            stream = f.streams.audio[0]
            rs = av.AudioResampler(format="flt", layout="mono", rate=stream.rate)
            parts = [a.to_ndarray().reshape(-1) for fr in f.decode(stream) for a in rs.resample(fr)]
            parts += [a.to_ndarray().reshape(-1) for a in rs.resample(None)]
            return np.concatenate(parts)[:, None] if parts else np.zeros((0, 1), np.float32), stream.rate
    except Exception:  # noqa: BLE001 - not audio to ffmpeg either (or PyAV is missing): the caller says so
        return None, 0


def _file_object_name(source) -> str:
    name = getattr(source, "name", None)  # open(path, "rb") has its path; io.BytesIO and bytes have none
    return name if isinstance(name, str) and name else "the audio bytes"


def _hz_to_mel(f):
    f = np.asarray(f, dtype=np.float64)
    f_sp, min_log_hz, logstep = 200.0 / 3, 1000.0, np.log(6.4) / 27.0
    min_log_mel = min_log_hz / f_sp
    return np.where(f >= min_log_hz, min_log_mel + np.log(np.maximum(f, 1e-10) / min_log_hz) / logstep, f / f_sp)


def _mel_to_hz(m):
    m = np.asarray(m, dtype=np.float64)
    f_sp, min_log_hz, logstep = 200.0 / 3, 1000.0, np.log(6.4) / 27.0
    min_log_mel = min_log_hz / f_sp
    return np.where(m >= min_log_mel, min_log_hz * np.exp(logstep * (m - min_log_mel)), f_sp * m)


@functools.cache
def mel_filters_np(n_mels: int, sr: int = SAMPLE_RATE, n_fft: int = N_FFT) -> np.ndarray:
    """Slaney mel filterbank [n_mels, n_fft // 2 + 1] (librosa.filters.mel(sr, n_fft, n_mels))."""
    fftfreqs = np.linspace(0, sr / 2, 1 + n_fft // 2)
    mel_f = _mel_to_hz(np.linspace(_hz_to_mel(0.0), _hz_to_mel(sr / 2), n_mels + 2))
    fdiff = np.diff(mel_f)
    ramps = mel_f[:, None] - fftfreqs[None, :]
    lower = -ramps[:-2] / fdiff[:-1, None]
    upper = ramps[2:] / fdiff[1:, None]
    weights = np.maximum(0, np.minimum(lower, upper))
    weights *= (2.0 / (mel_f[2 : n_mels + 2] - mel_f[:n_mels]))[:, None]
    return weights.astype(np.float32)


@functools.cache
def _filters(n_mels: int, device: str) -> torch.Tensor:
    return torch.from_numpy(mel_filters_np(n_mels)).to(device)


@functools.cache
def _window(device: str) -> torch.Tensor:
    return torch.hann_window(N_FFT, device=device)


CPU_BLOCK_FRAMES = 256  # frames per STFT on the CPU: 2.6 s of audio, whose spectra stay in the core's cache


def _log_mel_frames(x: torch.Tensor, n_mels: int) -> torch.Tensor:
    """log10 of the mel power of every whole frame of `x` (no centering): [n_mels, (len(x) - N_FFT) // HOP + 1].
    On the CPU in blocks of CPU_BLOCK_FRAMES frames (each block's samples overlapping the next's by N_FFT - HOP):
    one STFT of a whole batch's audio spills its spectra out of the cache, 0.17 -> 0.3-0.5 ms per second of audio
    on one Xeon core; on a GPU in one pass."""
    dev = str(x.device)
    win, filters = _window(dev), _filters(n_mels, dev)
    frames = (len(x) - N_FFT) // HOP_LENGTH + 1
    step = frames if x.device.type != "cpu" else CPU_BLOCK_FRAMES
    parts = []
    for k in range(0, frames, step):
        piece = x[k * HOP_LENGTH : (min(k + step, frames) - 1) * HOP_LENGTH + N_FFT]
        spec = torch.view_as_real(torch.stft(piece, N_FFT, HOP_LENGTH, window=win, center=False, return_complex=True))
        power = spec[..., 0] * spec[..., 0] + spec[..., 1] * spec[..., 1]  # |z|^2 (abs() ** 2: 3x the time)
        parts.append(torch.clamp(filters @ power, min=1e-10).log10())
    return parts[0] if len(parts) == 1 else torch.cat(parts, 1)


def log_mel_spectrogram(audio, n_mels: int = 80, padding: int = 0, device: str | torch.device = "cpu") -> torch.Tensor:
    """Whisper's log-mel: |STFT|^2 (n_fft 400, hop 160, Hann, centered) -> Slaney mel -> log10,
    floored at max - 8, scaled by (x + 4) / 4. audio [n] at 16 kHz (`padding` zeros appended first,
    as Whisper appends 30 s so the last window is full) -> [n_mels, n // 160]."""
    a = torch.as_tensor(audio, dtype=torch.float32, device=device)
    if padding:
        a = torch.nn.functional.pad(a, (0, padding))
    half = N_FFT // 2  # centered as torch.stft(center=True) does: 200 mirrored samples each side
    log_spec = _log_mel_frames(torch.nn.functional.pad(a[None], (half, half), mode="reflect")[0], n_mels)[:, :-1]
    log_spec = torch.maximum(log_spec, log_spec.max() - 8.0)
    return (log_spec + 4.0) / 4.0


def utterance_mel(audio, n_mels: int = 80, device: str | torch.device = "cpu") -> torch.Tensor:
    """The log-mel window of an utterance of at most 30 s: [n_mels, 3000], the content frames of
    log_mel_spectrogram(audio, padding=30 s) followed by zeros, as Whisper's transcribe builds it: the one row of
    utterance_mels (only N_FFT zeros appended before the STFT: every content frame, and the maximum that sets the
    floor, come out the same, for a tenth of the work on short turns)."""
    return utterance_mels([audio], n_mels, device)[0]


def utterance_mels(
    audios, n_mels: int = 80, device: str | torch.device = "cpu", length: int = N_FRAMES
) -> torch.Tensor:
    """utterance_mel of several utterances (each at most 30 s, any lengths) in one pass on `device`:
    [len(audios), n_mels, length], each row its utterance's first `length` frames (its content frames, then
    zeros), floored at its own maximum - 8. The rows' signals, each as torch.stft(center=True) pads it (its
    first samples mirrored, the audio, zeros), lie end to end on hop borders in one array: one host-to-device
    copy, one STFT, one filterbank product and one log over the frames of all of them (no padding to the
    longest), then each row's maximum (scatter_reduce) and its frames gathered."""
    dev = torch.device(device)
    lens = np.array([len(a) for a in audios], dtype=np.int64)
    if not len(lens):
        return torch.zeros(0, n_mels, length, device=dev)
    half = N_FFT // 2
    # a row's padded signal: 200 mirrored samples, its audio, >= 600 zeros (N_FFT appended, and stft's 200 mirrored
    # zeros), in hops; the frames whose maximum sets its floor, as utterance_mel: the first (n + N_FFT) // HOP_LENGTH
    hops = -(-(lens + 2 * half + N_FFT) // HOP_LENGTH)
    starts = np.concatenate([[0], np.cumsum(hops)[:-1]])
    sig = np.zeros(int(hops.sum()) * HOP_LENGTH, dtype=np.float32)
    for a, o, n in zip(audios, starts * HOP_LENGTH, lens):
        a = np.asarray(a, dtype=np.float32).reshape(-1)
        head = a[1 : half + 1]
        sig[o + half - len(head) : o + half] = head[::-1]  # (a short row: its mirror starts with zeros)
        sig[o + half : o + half + n] = a
    log_spec = _log_mel_frames(torch.from_numpy(sig).to(dev, non_blocking=True), n_mels)  # [n_mels, frames]
    frames, rows = log_spec.shape[1], len(lens)
    if rows == 1:  # one utterance (utterance_mel): one floor, no scatter
        floor = log_spec[:, : int(lens[0] + N_FFT) // HOP_LENGTH].max() - 8.0
        log_spec = torch.maximum(log_spec, floor).add_(4.0).div_(4.0)
    else:
        owner = np.full(frames, rows, dtype=np.int64)  # the frames that set each row's floor; the rest: row `rows`
        for i, (s, n) in enumerate(zip(starts, (lens + N_FFT) // HOP_LENGTH)):
            owner[s : s + n] = i
        owner = torch.from_numpy(owner).to(dev, non_blocking=True)
        top = torch.full((rows + 1,), -torch.inf, device=dev).scatter_reduce(0, owner, log_spec.amax(0), "amax")
        log_spec = torch.maximum(log_spec, (top - 8.0)[owner]).add_(4.0).div_(4.0)  # each frame floored by its row
    content = np.minimum(lens // HOP_LENGTH, length)
    return (_rows_copied if dev.type == "cpu" else _rows_gathered)(log_spec, starts, content, length)


def _rows_copied(log_spec: torch.Tensor, starts, content, length: int) -> torch.Tensor:
    """[rows, n_mels, length]: row i's `content[i]` frames of `log_spec` from frame `starts[i]` on, then zeros; a
    copy per row (on the CPU: one gather of them all took 3x the time)."""
    out = torch.zeros(len(starts), log_spec.shape[0], length, device=log_spec.device)
    for i, (s, n) in enumerate(zip(starts, content)):
        out[i, :, :n] = log_spec[:, s : s + n]
    return out


def _rows_gathered(log_spec: torch.Tensor, starts, content, length: int) -> torch.Tensor:
    """_rows_copied in one gather (one kernel on a GPU, not a copy per row). Overwrites log_spec's last frame,
    which must be no row's content, with zeros: the frames after each row's content are read from it."""
    dev, (n_mels, frames), rows = log_spec.device, log_spec.shape, len(starts)
    log_spec[:, -1] = 0.0
    width = int(content.max())
    at = np.arange(width)
    idx = np.where(at < content[:, None], starts[:, None] + at, frames - 1).reshape(-1)
    picked = log_spec.index_select(1, torch.from_numpy(idx).to(dev, non_blocking=True)).view(n_mels, rows, width)
    if width == length:
        return picked.transpose(0, 1).contiguous()
    out = torch.zeros(rows, n_mels, length, device=dev)
    out[:, :, :width] = picked.transpose(0, 1)
    return out


def pad_or_trim_frames(mel: torch.Tensor, length: int = N_FRAMES) -> torch.Tensor:
    """[n_mels, n] -> [n_mels, length], zero-padded or cut at the end."""
    n = mel.shape[-1]
    if n > length:
        return mel[..., :length]
    if n < length:
        return torch.nn.functional.pad(mel, (0, length - n))
    return mel


def trimmed_frames(content: list[int], margin_s: float) -> tuple[list[int], int]:
    """A trimmed window (the encoder's work in proportion to the audio) for rows holding `content` mel frames
    of audio each -> (the frames each row's encoder attends to: its audio and `margin_s` seconds of the
    padding after it, at most a window; the window's length, the longest of those rounded up to TRIM_STEP)."""
    margin = round(margin_s * SAMPLE_RATE / HOP_LENGTH)
    valid = [min(N_FRAMES, n + margin) for n in content]
    return valid, min(N_FRAMES, -(-max(valid) // TRIM_STEP) * TRIM_STEP)
