"""Whisper's greedy loop on the device (backends/whisper_loop.py: blocks of K steps, the logit rules and argmax as
tensor ops) against the host's loop (pipelines.whisper_search.greedy_from one step per call, LogitRules): the same
tokens, log-probabilities, ends and loops. A tiny random-weight Whisper whose vocabulary is one fifth timestamps
picks timestamps all the time, so every rule (pairs, monotonic, forced timestamps) decides tokens; rows enter with
known tokens that are not the greedy picks (fed, not picked), of different lengths, and run into the cache's end
(the last steps one per call)."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch

from speechrt.backends.asr_state import Encoded
from speechrt.backends.torch.asr import TorchASRRunner
from speechrt.backends.triton.asr import TritonASRRunner
from speechrt.kernels import select
from speechrt.models.whisper import Whisper, WhisperConfig
from speechrt.models.whisper_loaders import WhisperWeights
from speechrt.pipelines.transcribe_options import TranscribeOptions
from speechrt.pipelines.whisper_decoding import LogitRules
from speechrt.pipelines.whisper_search import greedy_drafted, greedy_from

CFG = WhisperConfig(
    n_mels=8,
    n_audio_ctx=12,
    n_audio_state=32,
    n_audio_head=2,
    n_audio_layer=1,
    n_vocab=97,
    n_text_ctx=48,
    n_text_state=32,
    n_text_head=2,
    n_text_layer=2,
)
# the ids a tokenizer of this vocabulary would give: text below 70, then end of text, ..., timestamps from 80
TOK = SimpleNamespace(
    eot=70, no_timestamps=79, timestamp_begin=80, encode=lambda s: [71], suppress_ids=lambda s: [3, 5]
)
PROMPT = [72, 73, 74]


def _options(timestamps: bool) -> TranscribeOptions:
    # the first token's rules bite: <|0.00|> to <|0.04|> only, never the blank (71)
    return TranscribeOptions(without_timestamps=not timestamps, max_initial_timestamp=0.04)


@pytest.fixture(scope="module")
def runners():
    seed = torch.seed() % (1 << 31)  # fresh weights every run
    g = torch.Generator().manual_seed(seed)
    ref = Whisper(CFG, select("torch", "cpu"))
    state = {k: torch.randn(v.shape, generator=g) * (0.5 if v.dim() > 1 else 0.1) for k, v in ref.state_dict().items()}
    w, cpu = WhisperWeights(CFG, state, None), torch.device("cpu")
    host = TorchASRRunner(w, cpu, torch.float32)
    dev = TritonASRRunner(w, cpu, torch.float32, capture=False, kernels="torch", block_steps=8)
    return host, dev, torch.randn(5, 9, CFG.n_text_state, generator=g), seed


@torch.inference_mode()
def _decode(runner, xa, seqs, timestamps: bool, sample_len: int):
    enc = Encoded(xa, torch.tensor([9, 4, 7, 9, 2]))
    state = runner.start(enc, 1, len(PROMPT) + sample_len)
    runner.decode_step(state, torch.tensor([PROMPT] * len(seqs)))
    rules = LogitRules(TOK, _options(timestamps), 3, "cpu")
    seqs, sum_lp, looped = [list(s) for s in seqs], [0.0] * len(seqs), set()
    greedy_from(runner, TOK.eot, state, rules, seqs, sum_lp, list(range(len(seqs))), 0, sample_len, None, 3, looped)
    return seqs, sum_lp, looped


@pytest.mark.parametrize("timestamps", [True, False])
def test_blocks_give_the_host_loops_tokens(runners, timestamps):
    host, dev, xa, seed = runners
    rng = random.Random(seed)
    for _ in range(3):
        # each row's first token (fed now) and 0-9 known tokens after it: text and increasing timestamps
        seqs = [[rng.randrange(70)] + sorted(rng.sample(range(69), rng.randrange(10))) for _ in range(5)]
        for s in seqs[::2]:
            s[1:] = [t + 80 if t < 17 else t for t in s[1:]]
        seqs[1] = [80 + rng.randrange(4)]  # a window's usual start: <|0.00|>, then text must follow
        want = _decode(host, xa, seqs, timestamps, 44)
        got = _decode(dev, xa, seqs, timestamps, 44)
        assert got[0] == want[0], f"seed {seed}"
        assert got[1] == pytest.approx(want[1], rel=1e-5, abs=1e-5)
        assert got[2] == want[2]
        picked = [t for s, k in zip(want[0], seqs) for t in s[len(k) :]]
        assert len(picked) >= 20 and not {3, 5} & set(picked)
        if timestamps:  # the timestamp rules decided tokens
            assert sum(t >= 80 for t in picked) >= 5 and TOK.no_timestamps not in picked
    assert 8 in {k for ks in dev.block_sizes.values() for k in ks}
    dev.warm_graphs()  # a server's warm-up: every block size on every slot, under the rules run so far
    assert dev.block_sizes and all(k == [2, 4, 8] for k in dev.block_sizes.values()), dev.block_sizes


@torch.inference_mode()
def _drafted(runner, xa, drafts, timestamps: bool, sample_len: int = 40):
    """decode_utterances' drafted path: the prompt and each row's draft in one pass, then greedy_drafted."""
    state = runner.start(Encoded(xa, torch.tensor([9, 4, 7, 9, 2])), 1, len(PROMPT) + sample_len)
    width = max(map(len, drafts))
    rows = [PROMPT + d + [TOK.eot] * (width - len(d)) for d in drafts]
    logits = runner.decode_step(state, torch.tensor(rows), last_only=False)
    rules = LogitRules(TOK, _options(timestamps), 3, "cpu")
    looped = set()
    seqs, sum_lp = greedy_drafted(
        runner, TOK.eot, state, logits[:, len(PROMPT) - 1 :], rules, drafts, sample_len, len(PROMPT), None, 3, looped
    )
    return seqs, sum_lp, looped


@pytest.mark.parametrize("timestamps", [True, False])
def test_drafts_checked_on_the_device_give_the_host_loops_tokens(runners, timestamps):
    """The drafted path with blocks: every row's draft picks in one batch of tensor ops, then blocks; drafts that
    are the greedy output, a prefix of it then junk, junk, nothing: the host's tokens, and greedy decoding's."""
    host, dev, xa, seed = runners
    rng = random.Random(seed)
    plain = _drafted(host, xa, [[]] * 5, timestamps)[0]
    # drafts are text (the server's transcripts), leaving room for one more token (as decode_utterances cuts them)
    text = [[t for t in s if t < TOK.eot][:39] for s in plain]
    junk = [rng.randrange(TOK.eot) for _ in range(6)]
    drafts = [text[0], text[1][:3] + junk, [], junk, text[4][:-1]]
    want = _drafted(host, xa, drafts, timestamps)
    got = _drafted(dev, xa, drafts, timestamps)
    assert got[0] == want[0], f"seed {seed}"
    assert got[1] == pytest.approx(want[1], rel=1e-5, abs=1e-5)
    assert got[2] == want[2]
    if not timestamps:  # text-only rows: the drafts were their own greedy output, so the result is greedy's
        assert want[0] == plain
