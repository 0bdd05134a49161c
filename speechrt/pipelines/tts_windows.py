"""The TTS pipeline's throughput window plan: a sentence vocoded for throughput rather than first audio (see
pipelines.tts.relaxed) is cut into even windows, one per worker. The first-audio plan is the runner's
(TTSRunner.plan_windows, backends/tts_plan.py): its background flow follows those windows, so it lives below the
pipeline, where the runners can read it."""

from __future__ import annotations

from speechrt.backends.tts_plan import even_count


def throughput_windows(frames: int, parallel: int, largest: int, context: int) -> list[tuple[int, int]]:
    """Windows sized for throughput rather than first audio: even, one per worker (or a multiple of the workers,
    none over `largest`), none under 4 x `context` frames (each border costs 2 x context frames of vocoder work)."""
    n = even_count(frames, largest, max(1, parallel), 4 * context)
    bounds = [round(i * frames / n) for i in range(n + 1)]
    return list(zip(bounds[:-1], bounds[1:]))
