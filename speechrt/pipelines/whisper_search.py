"""Token search in one Whisper window, against the ASRRunner interface: greedy or sampled rows, greedy rows
that check a draft of their output first, beam search; each row cut when it loops (whisper_loops.py)."""

from __future__ import annotations

import torch

from speechrt.backends.whisper_loop import block_rows, rule_state

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
    """Greedy (temperature 0) or sampled decoding of n rows; finished rows leave the batch. Greedy rows go on in
    blocks of steps on the device (greedy_from) where the runner has them.
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
        pos = len(seqs[active[0]]) - 1  # every row has as many tokens
        if (
            temperature == 0
            and getattr(runner, "block_room", None) is not None
            and runner.block_room(state, sample_len - 1 - pos)
        ):
            greedy_from(runner, eot, state, rules, seqs, sum_lp, active, pos, sample_len, stop, loops, looped)
            break
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

    # checked[i, j]: the logits after the prompt and draft i's first j tokens
    pick = _draft_picks(runner, rules, checked, drafts, seqs)
    valid = []  # per row: leading tokens of the sequence whose cache entries the draft pass wrote
    for i in range(n):
        for j in range(len(drafts[i]) + 1):
            tok, lp = pick(i, j)
            sum_lp[i] += lp
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
    greedy_from(runner, eot, state, rules, seqs, sum_lp, active, pos, sample_len, stop, loops, looped)
    return seqs, sum_lp


def _draft_picks(runner, rules, checked, drafts, seqs):
    """-> pick(i, j): the greedy token after the prompt and draft i's first j tokens (seqs[i] then holds them), and
    its log-probability. Where the runner decodes in blocks on the device, every row's every position in one batch of
    tensor ops and one read by the host (the picks a row needs only up to its first miss: the rest are wasted there,
    and cost no sync); elsewhere one at a time, as the scan asks."""
    if not getattr(runner, "block_steps", 0):
        return lambda i, j: _pick(rules, checked[i, j][None].clone(), seqs[i])
    n, dev = len(drafts), checked.device
    first = checked[:, 0].clone()
    rules.apply(first, [[] for _ in range(n)])  # the first token's rules, every row at once
    ids, lps = [first.argmax(dim=-1)], []
    lps.append(torch.log_softmax(first, dim=-1).gather(1, ids[0][:, None])[:, 0])
    pairs = [(i, j) for i, d in enumerate(drafts) for j in range(1, len(d) + 1)]
    if pairs:
        state = torch.tensor(rule_state([drafts[i][:j] for i, j in pairs], rules.tb))
        ii, jj = (torch.tensor(c, device=dev) for c in zip(*pairs))
        t, lp = runner.pick(checked[ii, jj], rules.block, state)
        ids.append(t)
        lps.append(lp)
    flat = list(zip(torch.cat(ids).tolist(), torch.cat(lps).tolist()))
    table = [[p] for p in flat[:n]]
    for (i, _), p in zip(pairs, flat[n:]):
        table[i].append(p)
    return lambda i, j: table[i][j]


def _pick(rules, lg, seq: list[int]) -> tuple[int, float]:
    """lg [1, vocab] (changed in place) -> the greedy token after `seq` and its log-probability."""
    rules.apply(lg, [seq])
    tok = int(lg.argmax())
    return tok, float(torch.log_softmax(lg[0], -1)[tok])


def greedy_from(runner, eot, state, rules, seqs, sum_lp, active, pos, sample_len, stop=None, loops=0, looped=None):
    """Greedy decoding of rows `active` of `seqs` (their state's rows, in that order) on from each one's token
    `pos`, fed next at the state's offset; a row's tokens after it that it already has are fed in turn, not picked.
    Rows end at end of text, at `sample_len` tokens or at a loop (added to `looped`); picked tokens' log-probabilities
    are added to `sum_lp`. Steps run `runner.block_room(state)` at a time on the device where the runner has blocks
    (backends/whisper_loop.py: the same tokens), else one per call; `stop()` is asked before each call."""
    dev, room = runner.device, getattr(runner, "block_room", None)
    while active:
        if stop is not None and stop():
            raise TranscriptionCancelled(seqs)
        k = room(state, sample_len - 1 - pos) if room is not None else 0
        if k:
            rows = block_rows([seqs[i] for i in active], pos, k, rules.tb)
            ids, lps = runner.decode_block(state, k, rows, rules.block)
        else:
            k, ids, lps = 1, [], []
            logits = runner.decode_step(state, torch.tensor([[seqs[i][pos]] for i in active], device=dev))
            for j, i in enumerate(active):
                new = len(seqs[i]) == pos + 1  # this row's next token is not known yet
                tok, lp = _pick(rules, logits[j : j + 1], seqs[i]) if new else (seqs[i][pos + 1], 0.0)
                ids.append([tok])
                lps.append([lp])
        keep = [
            j
            for j, i in enumerate(active)
            if _take(seqs[i], i, ids[j], lps[j], pos, eot, sample_len, loops, looped, sum_lp)
        ]
        pos += k
        if len(keep) < len(active) and keep:
            state = runner.reorder(state, torch.tensor(keep, device=dev))
        active = [active[j] for j in keep]


def _take(seq, i, ids, lps, pos, eot, sample_len, loops, looped, sum_lp) -> bool:
    """Row i's next tokens `ids` after its token `pos` (with their log-probabilities `lps`) into `seq`, those it
    does not have yet; -> whether the row goes on."""
    for s, (tok, lp) in enumerate(zip(ids, lps)):
        if pos + 1 + s < len(seq):  # known: fed, not picked
            continue
        sum_lp[i] += lp
        if tok == eot:
            return False
        seq.append(tok)
        if len(seq) >= sample_len:
            return False
        if cut_loop(seq, loops):
            if looped is not None:
                looped.add(i)
            return False
    return True


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
