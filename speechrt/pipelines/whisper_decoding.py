"""Whisper decoding loops, written once against the ASRRunner interface (backends/base.py), for every backend.

- `WindowDecoder`: one 30-second window — greedy, temperature sampling and beam search with Whisper's
  logit rules (suppress blank at the start, suppressed tokens, timestamp pairing and monotonicity, the
  max-initial-timestamp bound, forcing a timestamp when timestamps are jointly more likely than any text
  token), greedy decoding that checks a draft of its output in one pass, and temperature fallback on
  repetitive or low-confidence output;
- `decode_utterances`: short utterances of several streams in one batch (one encoder call, decode steps
  over all rows, drafts, cancellable between steps): what the streaming server runs;
- `long_form_steps`: any length, seeking window to window by the predicted timestamps (openai/whisper's
  `transcribe`), one window per step.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field, replace

import torch

from speechrt.models.audio import CHUNK_LENGTH, HOP_LENGTH, N_FRAMES, SAMPLE_RATE, pad_or_trim_frames, trimmed_frames

from .generation import cut_loop
from .speech_regions import compression_ratio, has_words, is_quiet, is_silence
from .transcribe_options import TranscribeOptions
from .whisper_timing import Word, add_word_timestamps, last_end, skip_hallucinations

NEG_INF = float("-inf")


def timed_segments(toks: list[int], tb: int, prec: float, to_the_end: bool = False) -> list[tuple]:
    """A window's tokens with timestamps (`tb` the first, `prec` s each) -> the segments two consecutive
    timestamps close, (start s, end s, tokens) from the window's start; `to_the_end`: and the tokens after
    the last pair (a window ending in text then one timestamp). [] when no pair closes one."""
    is_ts = [t >= tb for t in toks]
    cuts = [i + 1 for i in range(len(toks) - 1) if is_ts[i] and is_ts[i + 1]]
    if cuts and to_the_end:
        cuts.append(len(toks))
    out, last = [], 0
    for cur in cuts:
        part = toks[last:cur]
        out.append(((part[0] - tb) * prec, (part[-1] - tb) * prec, part))
        last = cur
    return out


class TranscriptionCancelled(Exception):
    """decode_utterances' `stop` asked to abandon the work."""


@dataclass
class WindowResult:
    tokens: list[int]  # sampled tokens, end-of-text excluded
    text: str
    avg_logprob: float
    no_speech_prob: float
    temperature: float
    compression_ratio: float
    segments: list | None = None  # a long-form transcript's timed segments (the server's long turns)


@dataclass
class Segment:
    id: int
    start: float
    end: float
    text: str
    tokens: list[int]
    avg_logprob: float
    no_speech_prob: float
    temperature: float
    compression_ratio: float
    words: list[Word] = field(default_factory=list)  # with word_timestamps


@dataclass
class Transcript:
    text: str
    segments: list[Segment] = field(default_factory=list)
    language: str = "en"
    duration: float = 0.0
    language_probability: float = 1.0  # of the detected language (1.0 when it was given, or English-only)

    def to_dict(self) -> dict:
        return {
            "text": self.text,
            "language": self.language,
            "language_probability": round(self.language_probability, 4),
            "duration": self.duration,
            "segments": [
                {
                    "id": s.id,
                    "start": round(s.start, 3),
                    "end": round(s.end, 3),
                    "text": s.text,
                    "avg_logprob": s.avg_logprob,
                    "no_speech_prob": s.no_speech_prob,
                    "temperature": s.temperature,
                    **({"words": [w.to_dict() for w in s.words]} if s.words else {}),
                }
                for s in self.segments
            ],
        }


class LogitRules:
    """Whisper's logit filters for one window, precomputed as index tensors."""

    def __init__(self, tok, opts: TranscribeOptions, sample_begin: int, device):
        self.tok = tok
        self.ts = not opts.without_timestamps
        self.tb = tok.timestamp_begin
        self.eot = tok.eot
        self.blank = torch.tensor(tok.encode(" ") + [tok.eot], device=device) if opts.suppress_blank else None
        self.suppress = torch.tensor(tok.suppress_ids(opts.suppress_tokens), device=device)
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
        beam = opts.beam_size if temperature == 0 else 1
        n = beam if temperature == 0 else (opts.best_of if opts.best_of > 1 else 1)
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
        if beam > 1:
            seqs, sum_lp = self.beam(state, logits, rules, beam, opts, sample_len)
        else:
            seqs, sum_lp = self.sample(state, logits, rules, n, temperature, sample_len, gen)

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

    def sample(
        self,
        state,
        logits,
        rules,
        n,
        temperature,
        sample_len,
        gen,
        stop=None,
        loops: int = 0,
        looped: set | None = None,
    ):
        """Greedy (temperature 0) or sampled decoding of n rows; finished rows leave the batch.
        `stop()` is asked before each step; True abandons the work (TranscriptionCancelled). `loops`: a
        row stops when it repeats itself that many times (see TranscribeOptions.stop_repeats); the rows
        cut so are added to `looped`."""
        seqs: list[list[int]] = [[] for _ in range(n)]
        sum_lp = [0.0] * n
        active = list(range(n))
        eot = self.tok.eot
        for _ in range(sample_len):
            rules.apply(logits, [seqs[i] for i in active])
            lp = torch.log_softmax(logits, dim=-1)
            if temperature == 0:
                nxt = logits.argmax(dim=-1)
            else:
                nxt = torch.multinomial(torch.softmax(logits / temperature, dim=-1), 1, generator=gen)[:, 0]
            picked = lp.gather(1, nxt[:, None])[:, 0].tolist()
            nxt_l = nxt.tolist()
            keep = []
            for j, i in enumerate(active):
                sum_lp[i] += picked[j]
                if nxt_l[j] == eot:
                    continue
                seqs[i].append(nxt_l[j])
                if not cut_loop(seqs[i], loops):
                    keep.append(j)
                elif looped is not None:
                    looped.add(i)
            if not keep:
                break
            if len(keep) < len(active):
                state = self.runner.reorder(state, torch.tensor(keep, device=logits.device))
                active = [active[j] for j in keep]
                nxt = nxt[keep]
            if stop is not None and stop():
                raise TranscriptionCancelled()
            logits = self.runner.decode_step(state, nxt[:, None])
        return seqs, sum_lp

    def greedy_drafted(
        self,
        state,
        checked,
        rules,
        drafts: list[list[int]],
        sample_len: int,
        prompt_len: int,
        stop=None,
        loops: int = 0,
        looped: set | None = None,
    ):
        """Greedy decoding of len(drafts) rows that checks a guess of each row's output first (speculative
        decoding with the guess as the draft). The caller has run the prompt and every draft through
        the decoder in one pass: checked [n, 1 + width, vocab] are the logits after the prompt and after
        each draft prefix (drafts padded to `width`). A row keeps its draft up to the first token greedy
        decoding would not have picked, then goes on one token per step. The result is greedy
        decoding's; the steps saved are the accepted draft tokens. The streaming server drafts a turn's
        transcript with its previous one, which usually agrees with all but the last words."""
        eot, n, dev = self.tok.eot, len(drafts), checked.device
        seqs: list[list[int]] = [[] for _ in range(n)]
        sum_lp = [0.0] * n
        done = [False] * n

        def pick(lg, i):  # lg [1, vocab] (changed in place) -> row i's greedy token; adds its logprob
            rules.apply(lg, [seqs[i]])
            tok = int(lg.argmax())
            sum_lp[i] += float(torch.log_softmax(lg[0], -1)[tok])
            return tok

        # checked[i, j]: the logits after the prompt and draft i's first j tokens
        valid = []  # per row: leading tokens of the sequence whose cache entries the draft pass wrote
        for i in range(n):
            for j in range(len(drafts[i]) + 1):
                tok = pick(checked[i, j][None].clone(), i)
                if tok == eot:
                    done[i] = True
                    break
                seqs[i].append(tok)
                if j == len(drafts[i]) or tok != drafts[i][j]:
                    break
            valid.append(len(seqs[i]) - (0 if done[i] else 1))
        active = [i for i in range(n) if not done[i] and len(seqs[i]) < sample_len]
        if not active:
            return seqs, sum_lp
        if len(active) < n:
            state = self.runner.reorder(state, torch.tensor(active, device=dev))
        # rows go on together from the shortest checked prefix; a row whose next tokens are already
        # known feeds them (their logits are not needed) until it reaches its first unknown token
        pos = min(valid[i] for i in active)
        state = self.runner.rewind(state, prompt_len + pos)
        while True:
            if stop is not None and stop():
                raise TranscriptionCancelled()
            feed = torch.tensor([[seqs[i][pos]] for i in active], device=dev)
            logits = self.runner.decode_step(state, feed)
            pos += 1
            keep = []
            for j, i in enumerate(active):
                if len(seqs[i]) == pos:  # this row's next token is new
                    tok = pick(logits[j : j + 1], i)
                    if tok == eot:
                        continue
                    seqs[i].append(tok)
                    if len(seqs[i]) >= sample_len:
                        continue
                    if cut_loop(seqs[i], loops):
                        if looped is not None:
                            looped.add(i)
                        continue
                keep.append(j)
            if not keep:
                return seqs, sum_lp
            if len(keep) < len(active):
                state = self.runner.reorder(state, torch.tensor(keep, device=dev))
                active = [active[j] for j in keep]

    def beam(self, state, logits, rules, beam, opts, sample_len):
        """Beam search as openai/whisper: keep `beam` live hypotheses, collect finished ones until
        round(beam * patience) have ended."""
        eot = self.tok.eot
        max_candidates = max(1, round(beam * opts.patience))
        seqs: list[list[int]] = [[] for _ in range(beam)]
        sum_lp = [0.0] * beam
        finished: dict[tuple, float] = {}
        for _ in range(sample_len):
            rules.apply(logits, seqs)
            lp = torch.log_softmax(logits, dim=-1)
            top_lp, top_id = lp.topk(beam + 1, dim=-1)
            top_lp, top_id = top_lp.tolist(), top_id.tolist()
            scores: dict[tuple, float] = {}
            sources: dict[tuple, int] = {}
            for r in range(len(seqs)):
                for l, t in zip(top_lp[r], top_id[r]):
                    s = tuple(seqs[r]) + (t,)
                    scores[s], sources[s] = sum_lp[r] + l, r
            new_seqs, new_lp, src = [], [], []
            for s in sorted(scores, key=scores.get, reverse=True):
                if s[-1] == eot:
                    if len(finished) < max_candidates:
                        finished.setdefault(s[:-1], scores[s])
                else:
                    new_seqs.append(list(s))
                    new_lp.append(scores[s])
                    src.append(sources[s])
                    if len(new_seqs) == beam:
                        break
            if len(finished) >= max_candidates or not new_seqs:
                break
            state = self.runner.reorder(state, torch.tensor(src, device=logits.device))
            seqs, sum_lp = new_seqs, new_lp
            logits = self.runner.decode_step(state, torch.tensor([[s[-1]] for s in seqs], device=logits.device))
        if len(finished) < beam:  # unfinished hypotheses fill up the candidates
            for s, l in sorted(zip(seqs, sum_lp), key=lambda x: -x[1]):
                finished.setdefault(tuple(s), l)
                if len(finished) >= beam:
                    break
        keys = list(finished)
        return [list(k) for k in keys], [finished[k] for k in keys]

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


def long_form_steps(
    decoder: WindowDecoder, mel: torch.Tensor, duration: float, opts: TranscribeOptions, on_segment=None, levels=None
):
    """Long-form transcription, one window at a time: a generator that decodes one 30-s window per next()
    (yielding the seconds of audio done so far) and returns the Transcript. A scheduler interleaves these
    steps with other work, so one long recording does not hold the device for all of its windows at once.

    mel [n_mels, frames + N_FRAMES]: the log-mel of audio of any length followed by a window's worth of
    zero padding. Windows of 30 s (trim_context: the last is cut to its audio); each next window starts
    where the last complete segment of the previous one ended; its text conditions the next window's
    decoding. `levels`: the audio's level per mel frame (dBFS, speech_regions.hop_levels_db) for the
    silence gate; None: no gate."""
    runner, tok, cfg = decoder.runner, decoder.tok, decoder.cfg
    content_frames = mel.shape[-1] - N_FRAMES
    gen = torch.Generator(device=runner.device).manual_seed(opts.seed)
    tb, prec = tok.timestamp_begin, CHUNK_LENGTH / cfg.n_audio_ctx  # 0.02 s per token
    input_stride = N_FRAMES // cfg.n_audio_ctx  # mel frames per output position (2)
    language, language_prob = opts.language or ("en" if not tok.multilingual else None), 1.0
    all_tokens = initial_prompt_tokens(tok, opts.initial_prompt)
    prompt_reset = 0  # the text the next window is conditioned on starts here (the initial prompt first)
    segments: list[Segment] = []
    seek = 0
    last_speech = 0.0  # the end of the last word (word_timestamps)
    while seek < content_frames:
        time_offset, window_seek = seek * HOP_LENGTH / SAMPLE_RATE, seek
        seg_frames = min(N_FRAMES, content_frames - seek)
        if is_quiet(None if levels is None else levels[seek : seek + seg_frames], opts):
            seek += seg_frames  # the silence gate: nothing to decode
            yield min(duration, seek * HOP_LENGTH / SAMPLE_RATE)
            continue
        # trim_context: a window of less than 30 s of audio (the last) is encoded over its audio only; by
        # default (None) not a recording's first window (a short recording is encoded as Whisper was trained)
        trim = runner.trims and (opts.trim_context or (opts.trim_context is None and seek > 0))
        valid, length = trimmed_frames([seg_frames], opts.trim_margin) if trim else (None, N_FRAMES)
        encoded = runner.encode(
            pad_or_trim_frames(mel[:, seek : seek + seg_frames], length)[None],
            None,
            valid if length < N_FRAMES else None,
        )
        if language is None:  # from the first window, as openai-whisper and faster-whisper do
            ((language, language_prob),) = decoder.language_probabilities(encoded, 1, 1)[0]
        res = decoder.decode_with_fallback(encoded, all_tokens[prompt_reset:], opts, language, gen)
        if is_silence(res, opts):
            seek += seg_frames  # silence: skip the window
            yield min(duration, seek * HOP_LENGTH / SAMPLE_RATE)
            continue
        toks = res.tokens
        single_ending = len(toks) >= 2 and toks[-2] < tb <= toks[-1]
        parts = timed_segments(toks, tb, prec, single_ending)
        new = [(time_offset + a, time_offset + b, part) for a, b, part in parts]
        if parts:
            seek += seg_frames if single_ending else (parts[-1][2][-1] - tb) * input_stride
        else:
            dur = seg_frames * HOP_LENGTH / SAMPLE_RATE
            stamps = [t for t in toks if t >= tb]
            if stamps and stamps[-1] != tb:
                dur = (stamps[-1] - tb) * prec
            new.append((time_offset, time_offset + dur, toks))
            seek += seg_frames
        found = [{"start": start, "end": end, "tokens": part, "words": []} for start, end, part in new]
        if opts.word_timestamps and found:
            speech_before = last_speech
            last_speech = add_word_timestamps(
                runner,
                tok,
                encoded,
                found,
                time_offset,
                seg_frames,
                tok.sot_sequence(language, opts.task),
                language,
                last_speech,
            )
            if not single_ending:  # the next window starts after the last word (faster-whisper)
                end = last_end(found)
                if end is not None and end > time_offset:
                    seek = round(end * SAMPLE_RATE / HOP_LENGTH)
            if opts.hallucination_silence_threshold is not None:
                skip, drop = skip_hallucinations(
                    found, opts.hallucination_silence_threshold, window_seek, seg_frames, content_frames, speech_before
                )
                seek = seek if skip is None else skip
                if drop:
                    yield min(duration, seek * HOP_LENGTH / SAMPLE_RATE)
                    continue
            last_speech = last_end(found) if found else speech_before
        for f in found:
            part, text = f["tokens"], tok.decode(f["tokens"])
            if not text.strip() or f["start"] == f["end"] or f["start"] >= duration:
                continue  # instantaneous, empty or after the audio's end: dropped, from the prompt too
            seg = Segment(
                len(segments),
                f["start"],
                f["end"],
                text,
                [t for t in part if t < tok.eot],
                res.avg_logprob,
                res.no_speech_prob,
                res.temperature,
                res.compression_ratio,
                f["words"],
            )
            segments.append(seg)
            all_tokens.extend(part)
            if on_segment:
                on_segment(seg)
        if not opts.condition_on_previous_text or res.temperature > 0.5:
            prompt_reset = len(all_tokens)
        yield min(duration, seek * HOP_LENGTH / SAMPLE_RATE)
    text = "".join(seg.text for seg in segments).strip()
    return Transcript(text, segments, language or "en", duration, language_prob)


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
        seqs, sum_lp = decoder.greedy_drafted(
            state, logits[:, prompt_len - 1 :], rules, drafts, sample_len, prompt_len, stop, opts.stop_repeats, looped
        )
    else:
        seqs, sum_lp = decoder.sample(
            state, logits[:, -1], rules, n, 0.0, sample_len, None, stop, opts.stop_repeats, looped
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
