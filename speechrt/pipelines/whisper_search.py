"""Token search in one Whisper window, against the ASRRunner interface: greedy or sampled rows, greedy rows
that check a draft of their output first, beam search; each row cut when it loops (whisper_loops.py)."""

from __future__ import annotations

import torch

from .whisper_loops import cut_loop


class TranscriptionCancelled(Exception):
    """decode_utterances' `stop` asked to abandon the work. `tokens`: each row's tokens decoded so far (empty
    before the first step): a draft for the same work begun again (it checks them in one pass)."""

    def __init__(self, tokens: list[list[int]] | None = None):
        super().__init__("transcription stopped")
        self.tokens = tokens or []


def sample(
    runner,
    eot: int,
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
            state = runner.reorder(state, torch.tensor(keep, device=logits.device))
            active = [active[j] for j in keep]
            nxt = nxt[keep]
        if stop is not None and stop():
            raise TranscriptionCancelled(seqs)
        logits = runner.decode_step(state, nxt[:, None])
    return seqs, sum_lp


def greedy_drafted(
    runner,
    eot: int,
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
    n, dev = len(drafts), checked.device
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
        state = runner.reorder(state, torch.tensor(active, device=dev))
    # rows go on together from the shortest checked prefix; a row whose next tokens are already
    # known feeds them (their logits are not needed) until it reaches its first unknown token
    pos = min(valid[i] for i in active)
    state = runner.rewind(state, prompt_len + pos)
    while True:
        if stop is not None and stop():
            raise TranscriptionCancelled(seqs)
        feed = torch.tensor([[seqs[i][pos]] for i in active], device=dev)
        logits = runner.decode_step(state, feed)
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
            state = runner.reorder(state, torch.tensor(keep, device=dev))
            active = [active[j] for j in keep]


def beam(runner, eot: int, state, logits, rules, beam, opts, sample_len):
    """Beam search as openai/whisper: keep `beam` live hypotheses, collect finished ones until
    round(beam * patience) have ended."""
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
        state = runner.reorder(state, torch.tensor(src, device=logits.device))
        seqs, sum_lp = new_seqs, new_lp
        logits = runner.decode_step(state, torch.tensor([[s[-1]] for s in seqs], device=logits.device))
    if len(finished) < beam:  # unfinished hypotheses fill up the candidates
        for s, l in sorted(zip(seqs, sum_lp), key=lambda x: -x[1]):
            finished.setdefault(tuple(s), l)
            if len(finished) >= beam:
                break
    keys = list(finished)
    return [list(k) for k in keys], [finished[k] for k in keys]
