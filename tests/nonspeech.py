"""Non-speech signals with fixed seeds (float32 at 16 kHz) for the silence and noise tests of the
pipeline (tests/pipelines/test_silence.py) and the server (tests/streaming/test_silence_server.py)."""

from __future__ import annotations

import numpy as np

SR = 16000


def white(sec, seed=1, amp=0.1):
    return (np.random.default_rng(seed).uniform(-1, 1, SR * sec) * amp).astype(np.float32)


def pink(sec, seed=2, amp=0.1):
    """1/f noise: white noise shaped by 1/sqrt(f) in the frequency domain."""
    n = SR * sec
    f = np.fft.rfftfreq(n, 1 / SR)
    f[0] = f[1]
    x = np.fft.irfft(np.fft.rfft(np.random.default_rng(seed).standard_normal(n)) / np.sqrt(f), n)
    return (x / np.abs(x).max() * amp).astype(np.float32)


def tones(sec, seed=3, amp=0.1):
    """Music-like: a four-note chord on a random root every second, over a slow sweep (200 Hz up to
    1 kHz over the whole clip)."""
    rng, t = np.random.default_rng(seed), np.arange(SR) / SR
    chords = np.concatenate(
        [
            sum(np.sin(2 * np.pi * 110 * 2 ** (rng.integers(0, 24) / 12) * r * t) for r in (1, 1.26, 1.5, 2))
            for _ in range(sec)
        ]
    )
    tt = np.arange(len(chords)) / SR
    x = chords / 4 * 0.7 + 0.3 * np.sin(2 * np.pi * (200 * tt + 800 * tt**2 / (2 * sec)))
    return (x * amp / np.abs(x).max()).astype(np.float32)


def hum(sec, seed=5):
    """Mains hum (50 Hz and odd harmonics) over a faint hiss."""
    t = np.arange(SR * sec) / SR
    x = sum(a * np.sin(2 * np.pi * f * t) for a, f in ((0.05, 50), (0.03, 150), (0.02, 250)))
    return (x + white(sec, seed, 0.003)).astype(np.float32)


NON_SPEECH = {
    "silence": lambda s: np.zeros(SR * s, np.float32),
    "white": white,
    "pink": pink,
    "tones": tones,
    "hum": hum,
}
