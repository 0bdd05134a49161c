"""A final transcript's extras for the sessions that ask for them: its tokens' logprobs and its word times, aligned
on the engine's worker (after those of the parts a long turn committed)."""

from __future__ import annotations

import asyncio
import dataclasses

import numpy as np

from speechrt.pipelines.asr import MAX_UTTERANCE_SAMPLES, segment_windows
from speechrt.pipelines.asr import SAMPLE_RATE as RATE

from .turn import Turn


async def final_extras(
    session, engine, r, audio: np.ndarray, turn: Turn | None = None
) -> tuple[list | None, list | None]:
    """A final transcript's token logprobs and word times, for a session that asked for them (None
    otherwise): one more encoder and decoder pass on the engine's worker (one per 30 s of its segments where
    the rest of the turn was transcribed long-form), after those of the parts its `turn` committed (aligned as
    commit_stable commits them), word times counted from the turn's start; a failure is reported and gives
    None for both."""
    cfg = session.cfg
    if not (cfg.logprobs or cfg.word_timestamps):
        return None, None
    parts = [(off, await task) for off, task in (turn.extras if turn else [])]
    rest_at = turn.committed_s if turn else 0.0  # where `audio`, the turn's audio not committed, begins
    # the rest: one span, or spans of at most 30 s of its segments where it was transcribed long-form
    for a, b, tokens in segment_windows(r.segments, len(audio)) if r.segments else [(0, len(audio), r.tokens)]:
        parts.append((rest_at + a / RATE, await aligned(session, engine, audio[a:b], tokens)))
    if any(got is None for _, got in parts):  # the transcript still goes out, without the extras
        return None, None
    words = [
        dataclasses.replace(w, start=round(w.start + off, 2), end=round(w.end + off, 2))
        for off, (ws, _) in parts
        for w in ws
    ]
    logprobs = [lp for _, (_, lps) in parts for lp in lps]
    return (
        [{"token": b.decode("utf-8", "replace"), "logprob": round(lp, 6), "bytes": list(b)} for _, b, lp in logprobs]
        if cfg.logprobs
        else None,
        [w.to_dict() for w in words] if cfg.word_timestamps else None,
    )


async def aligned(
    session, engine, audio: np.ndarray, tokens: list[int], trim_margin: float | None = None
) -> tuple[list, list] | None:
    """(words, token logprobs) of `tokens`, a transcript of `audio`, from ASRPipeline.align on the engine's
    worker (`trim_margin`: its encoder over the audio and that much padding); empty for no tokens or audio over
    30 s; None where it failed (the session is told). Cancelled (its round stopped), it stops on the worker too."""
    if not tokens or len(audio) > MAX_UTTERANCE_SAMPLES:
        return [], []
    asr, lang = engine.asr, session.cfg.language

    def align():  # two engine steps (ASRPipeline.align_steps): a final may run between them
        yield (yield from asr.align_steps(audio, tokens, lang, trim_margin=trim_margin))

    task, q = engine.stream(align(), "asr")
    try:
        while (got := await q.get()) is None:  # (the encoder's step)
            pass
    except asyncio.CancelledError:  # nobody waits for it (a turn's commit round, stopped as the turn ended)
        task.cancelled = True  # its steps not begun are not run: a final may be waiting behind them
        raise
    if isinstance(got, BaseException):
        await session.error(f"word timing failed: {type(got).__name__}: {got}", "server_error", type="server_error")
        return None
    return got
