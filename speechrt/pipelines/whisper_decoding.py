"""Whisper decoding, written once against the ASRRunner interface (backends/base.py), for every backend.

- `WindowDecoder`: one 30-second window — greedy, temperature sampling and beam search (whisper_search.py)
  with Whisper's logit rules (suppress blank at the start, suppressed tokens, timestamp pairing and
  monotonicity, the max-initial-timestamp bound, forcing a timestamp when timestamps are jointly more likely
  than any text token), greedy decoding that checks a draft of its output in one pass, and temperature
  fallback on repetitive or low-confidence output;
- `decode_utterances`: short utterances of several streams in one batch (one encoder call, decode steps
  over all rows, drafts, cancellable between steps): what the streaming server runs;
- long-form transcription, any length window to window, is whisper_long_form.py.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace

import torch

from speechrt.backends.whisper_loop import BlockRules

from .speech_regions import compression_ratio, has_words, is_silence
from .transcribe_options import TranscribeOptions
from .whisper_search import TranscriptionCancelled, beam, greedy_drafted, sample

NEG_INF = float("-inf")


@dataclass
class WindowResult:
    tokens: list[int]  # sampled tokens, end-of-text excluded
    text: str
    avg_logprob: float
    no_speech_prob: float
    temperature: float
    compression_ratio: float
    segments: list | None = None  # a long-form transcript's timed segments (the server's long turns)


class LogitRules:
    """Whisper's logit filters for one window, precomputed as index tensors."""

    def __init__(self, tok, opts: TranscribeOptions, sample_begin: int, device):
        self.tok = tok
        self.ts = not opts.without_timestamps
        self.tb = tok.timestamp_begin
        self.eot = tok.eot
        self.blank = torch.tensor(tok.encode(" ") + [tok.eot], device=device) if opts.suppress_blank else None
        suppress = tok.suppress_ids(opts.suppress_tokens)
        self.suppress = torch.tensor(suppress, device=device)
        # the rules after a window's first token, for decode loops on the device (backends/whisper_loop.py)
        extra = [tok.no_timestamps] if self.ts else []
        self.block = BlockRules(self.ts, self.tb, self.eot, tuple(sorted(set(suppress) | set(extra))))
        # openai: precision = 30 s / 1500 positions = 0.02 s per timestamp token
        self.max_initial = round(opts.max_initial_timestamp / 0.02) if opts.max_initial_timestamp is not None else None

    def apply(self, logits: torch.Tensor, seqs: list[list[int]]):
        """logits [N, V] (modified in place); seqs[n] are row n's sampled tokens so far."""
        first = len(seqs[0]) == 0
        if first and self.blank is not None:
            logits[:, self.blank] = NEG_INF
        logits[:, self.suppress] = NEG_INF
        if not self.ts:
            return
        tb = self.tb
        logits[:, self.tok.no_timestamps] = NEG_INF
        for n, seq in enumerate(seqs):
            last_ts = len(seq) >= 1 and seq[-1] >= tb
            penult_ts = len(seq) < 2 or seq[-2] >= tb
            if last_ts:
                if penult_ts:  # a pair closed: text must follow
                    logits[n, tb:] = NEG_INF
                else:  # an open timestamp: another timestamp or end of text must follow
                    logits[n, : self.eot] = NEG_INF
            last = next((t for t in reversed(seq) if t >= tb), None)
            if last is not None:  # timestamps never decrease (and a new pair starts strictly later)
                upto = last if (last_ts and not penult_ts) else last + 1
                logits[n, tb:upto] = NEG_INF
        if first:
            logits[:, :tb] = NEG_INF
            if self.max_initial is not None:
                logits[:, tb + self.max_initial + 1 :] = NEG_INF
        lp = torch.log_softmax(logits, dim=-1)
        ts_lp = torch.logsumexp(lp[:, tb:], dim=-1)
        text_max = lp[:, :tb].max(dim=-1).values
        force = ts_lp > text_max
        if force.any():
            logits[force, :tb] = NEG_INF


class WindowDecoder:
    """Decodes 30-second windows through an ASRRunner (callers hold `runner.loop()` around the calls)."""

    def __init__(self, runner, tokenizer):
        self.runner, self.tok = runner, tokenizer
        self.cfg = runner.config

    def prompt(self, prev: list[int], opts: TranscribeOptions, language: str) -> tuple[list[int], int]:
        """The decoder prompt -> (tokens, index of <|startoftranscript|>): `prev` (earlier text, or the
        initial prompt) after <|startofprev|>, then the task's start sequence."""
        out = []
        if prev:
            out = [self.tok.sot_prev] + prev[-(self.cfg.n_text_ctx // 2 - 1) :]
        sot_index = len(out)
        out += self.tok.sot_sequence(language, opts.task)
        if opts.without_timestamps:
            out.append(self.tok.no_timestamps)
        return out, sot_index

    def detect_languages(self, encoded, n: int = 1) -> list[str]:
        """The most likely language of each of the `n` windows of `encoded`."""
        return [probs[0][0] for probs in self.language_probabilities(encoded, n, 1)]

    @torch.inference_mode()
    def language_probabilities(self, encoded, n: int = 1, k: int | None = None) -> list[list[tuple[str, float]]]:
        """Per window of `encoded`, its `k` most likely languages (all if None) with their probabilities,
        most likely first: one decoder step on <|startoftranscript|>, softmax over the language tokens (as
        openai-whisper and CTranslate2 compute it)."""
        state = self.runner.start(encoded, 1, 1)
        logits = self.runner.decode_step(state, torch.tensor([[self.tok.sot]] * n, device=self.runner.device))
        ids = torch.tensor(self.tok.language_ids, device=logits.device)
        probs = torch.softmax(logits[:, ids].float(), -1)
        top = probs.topk(min(k or len(ids), len(ids)), -1)
        return [
            [(self.tok.languages[i], p) for i, p in zip(ix, pr)]
            for ix, pr in zip(top.indices.tolist(), top.values.tolist())
        ]

    @torch.inference_mode()
    def decode_window(
        self, encoded, prev: list[int], opts: TranscribeOptions, temperature: float, language: str, gen: torch.Generator
    ) -> WindowResult:
        prompt, sot_index = self.prompt(prev, opts, language)
        sample_len = opts.sample_len or self.cfg.n_text_ctx // 2
        sample_len = min(sample_len, self.cfg.n_text_ctx - len(prompt))
        n_beam = opts.beam_size if temperature == 0 else 1
        n = n_beam if temperature == 0 else (opts.best_of if opts.best_of > 1 else 1)
        dev = self.runner.device
        state = self.runner.start(encoded, n, len(prompt) + sample_len)
        rules = LogitRules(self.tok, opts, len(prompt), dev)
        # First the prompt up to <|startoftranscript|>: its logits give the no-speech probability.
        logits = self.runner.decode_step(state, torch.tensor([prompt[: sot_index + 1]] * n, device=dev))
        no_speech = (
            float(torch.softmax(logits[0], -1)[self.tok.no_speech]) if self.tok.no_speech is not None else math.nan
        )
        if sot_index + 1 < len(prompt):
            logits = self.runner.decode_step(state, torch.tensor([prompt[sot_index + 1 :]] * n, device=dev))
        if n_beam > 1:
            seqs, sum_lp = beam(self.runner, self.tok.eot, state, logits, rules, n_beam, opts, sample_len)
        else:
            seqs, sum_lp = sample(self.runner, self.tok.eot, state, logits, rules, n, temperature, sample_len, gen)

        # rank candidates by length-normalized log probability (openai's MaximumLikelihoodRanker)
        def score(i):
            L = len(seqs[i])
            pen = L if opts.length_penalty is None else ((5 + L) / 6) ** opts.length_penalty
            return sum_lp[i] / max(pen, 1e-9)

        best = max(range(len(seqs)), key=score)
        toks = seqs[best]
        text = self.tok.decode(toks)
        return WindowResult(
            toks, text, sum_lp[best] / (len(toks) + 1), no_speech, temperature, compression_ratio(text.strip())
        )

    def decode_with_fallback(self, encoded, prev, opts, language, gen) -> WindowResult:
        """Decode at each temperature of the ladder until the result is neither too repetitive (compression
        ratio above its threshold) nor too unsure (average log probability below its threshold), or is
        silence (no-speech probability above its threshold and unsure). When every temperature fails: the
        most confident result among those not too repetitive (or among all), with the last temperature
        (faster-whisper's generate_with_fallback)."""
        results, below_cr = [], []
        for t in opts.temperatures:
            res = self.decode_window(encoded, prev, opts, t, language, gen)
            results.append(res)
            needs_fallback = False
            if opts.compression_ratio_threshold is not None:
                if res.compression_ratio > opts.compression_ratio_threshold:
                    needs_fallback = True
                else:
                    below_cr.append(res)
            if opts.logprob_threshold is not None and res.avg_logprob < opts.logprob_threshold:
                needs_fallback = True
            if is_silence(res, opts):
                needs_fallback = False  # silence: no need to retry
            if not needs_fallback:
                return res
        best = max(below_cr or results, key=lambda r: r.avg_logprob)
        return replace(best, temperature=opts.temperatures[-1])


def initial_prompt_tokens(tok, text: str | None) -> list[int]:
    """An initial prompt (earlier words, names, spellings) as the tokens that follow <|startofprev|>."""
    return tok.encode(" " + text.strip()) if text and text.strip() else []


def decode_utterances(
    decoder: WindowDecoder,
    mels: torch.Tensor,
    opts: TranscribeOptions,
    drafts: list[list[int] | None] | None = None,
    stop=None,
    frames: list[int] | None = None,
) -> list[WindowResult]:
    """Greedy transcription of several short utterances in one batch: mels [n, n_mels, T] (each
    utterance's log-mel, zero-padded to T frames: a whole window, or with `frames` — the frames of each
    row that hold its audio — only as much of one as the longest needs), one encoder call for all, then
    decode steps over all rows together, finished rows leaving the batch. Utterances judged silent
    (no-speech probability above the threshold and low confidence) come back empty.

    `drafts`: per utterance, a guess of its tokens (e.g. the transcript of an earlier, shorter part of
    the same speech) or None. The guesses go through the decoder with the prompt, in one pass, and
    only the tokens after the first wrong one are decoded step by step; the result is the same greedy
    transcript. `stop`: asked between steps; when it returns True the work is abandoned with
    TranscriptionCancelled."""
    runner, tok, cfg = decoder.runner, decoder.tok, decoder.cfg
    dev = runner.device
    n = mels.shape[0]
    if drafts is not None and len(drafts) != n:
        raise ValueError(f"{len(drafts)} drafts for {n} utterances")
    enc = runner.encode(mels, stop, frames)  # stopped between encoder blocks too
    if enc is None or (stop is not None and stop()):
        raise TranscriptionCancelled()
    # every row's prompt has the same length: languages differ in one token
    langs = [opts.language] * n if opts.language or not tok.multilingual else decoder.detect_languages(enc, n)
    prev = initial_prompt_tokens(tok, opts.initial_prompt)
    prompts = [decoder.prompt(prev, opts, lang or "en") for lang in langs]
    prompt_len, sot_index = len(prompts[0][0]), prompts[0][1]
    sample_len = min(opts.sample_len or cfg.n_text_ctx // 2, cfg.n_text_ctx - prompt_len)
    # text tokens only, and short enough that a draft leaves room for one more token
    drafts = [
        list(itertools.takewhile(lambda t: 0 <= t < tok.eot, d or []))[: sample_len - 1] for d in drafts or [None] * n
    ]
    width = max(len(d) for d in drafts)
    state = runner.start(enc, 1, prompt_len + sample_len)
    # the prompt and the drafts (padded with end-of-text) in one pass: logits at every position
    rows = [p + d + [tok.eot] * (width - len(d)) for (p, _), d in zip(prompts, drafts)]
    logits = runner.decode_step(state, torch.tensor(rows, device=dev), last_only=False)
    # <|startoftranscript|>'s logits give the no-speech probability
    no_speech = (
        torch.softmax(logits[:, sot_index], -1)[:, tok.no_speech].tolist()
        if tok.no_speech is not None
        else [math.nan] * n
    )
    rules = LogitRules(tok, opts, prompt_len, dev)
    looped: set[int] = set()
    if width:
        seqs, sum_lp = greedy_drafted(
            runner,
            tok.eot,
            state,
            logits[:, prompt_len - 1 :],
            rules,
            drafts,
            sample_len,
            prompt_len,
            stop,
            opts.stop_repeats,
            looped,
        )
    else:
        seqs, sum_lp = sample(
            runner, tok.eot, state, logits[:, -1], rules, n, 0.0, sample_len, None, stop, opts.stop_repeats, looped
        )
    out = []
    for i in range(n):
        text = tok.decode(seqs[i])
        res = WindowResult(
            seqs[i], text.strip(), sum_lp[i] / (len(seqs[i]) + 1), no_speech[i], 0.0, compression_ratio(text.strip())
        )
        # the long-form guard: no text. A row cut short by its own repetition is too repetitive (long-form
        # would fall back to sampling), so its confident average does not vouch for it ('. . . .' over tones)
        if is_silence(res, opts, unsure=i in looped) or not has_words(res.text):
            res.text, res.tokens = "", []
        out.append(res)
    return out
