"""The generation loop (pipelines/lm_batching.py) and the Python API (speechrt.load_lm) on the embedded model:
option checks, sampling (seeded, top-k/top-p, repetition penalty as transformers defines it), stop
tokens and strings, max tokens, streaming iterators (sync and async) and incremental text."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch

import speechrt
from speechrt.errors import UserError
from speechrt.pipelines.generation import GenerationError, GenerationOptions, Sampler
from speechrt.pipelines.lm_batching import stream

PROMPT = "What is the capital of France?"


@pytest.fixture(scope="module")
def lm():
    return speechrt.load_lm(backend="torch")  # the default model: smollm2-135m-instruct, int4 weights on the CPU


@pytest.mark.parametrize(
    "kw,match",
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"temperature": -0.5}, "temperature"),
        ({"top_k": -1}, "top_k"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"stop": ("",)}, "stop strings"),
        ({"seed": "x"}, "seed"),
        ({"stop": 5}, "stop must be a string or a list"),
        ({"stop_token_ids": ["a"]}, "stop_token_ids must be None or"),
        ({"logit_bias": {"x": 1}}, "logit_bias must map token ids"),
        ({"logit_bias": {5: 101}}, "logit_bias"),
        ({"logit_bias": [(-1, 2)]}, "logit_bias"),
        ({"logit_bias": 7}, "logit_bias"),
        ({"frequency_penalty": 2.5}, "frequency_penalty must be a number in"),
        ({"presence_penalty": "a"}, "presence_penalty"),
        ({"logprobs": 21}, "logprobs must be None"),
        ({"logprobs": True}, "logprobs must be None"),
    ],
)
def test_bad_options(kw, match):
    with pytest.raises(GenerationError, match=match):
        GenerationOptions(**kw)


def test_api_rejects_bad_input(lm):
    with pytest.raises(UserError, match="valid generation options: max_tokens"):
        lm.chat(PROMPT, max_toks=3)
    with pytest.raises(UserError, match="temperature"):
        lm.generate("hi", temperature=-1)
    with pytest.raises(UserError, match="valid roles"):
        list(lm.chat([{"role": "robot", "content": "hi"}]))
    with pytest.raises(GenerationError, match="empty"):
        list(stream(lm.runner, lm.tokenizer, [[]]))
    with pytest.raises(GenerationError, match="outside the vocabulary"):
        list(stream(lm.runner, lm.tokenizer, [[1, 10**6]]))


def test_stream_is_incremental_and_matches_whole_text(lm):
    pieces = list(lm.chat(PROMPT, max_tokens=24))
    assert len(pieces) > 3 and "Paris" in "".join(pieces)
    assert lm.generate_batch([PROMPT], chat=True, max_tokens=24) == ["".join(pieces)]


def test_async_stream_equals_sync(lm):
    async def collect():
        return [p async for p in lm.achat(PROMPT, max_tokens=12)]

    assert asyncio.run(collect()) == list(lm.chat(PROMPT, max_tokens=12))


def test_async_stream_can_stop_early(lm):
    async def first_two():
        out = []
        async for p in lm.agenerate("Once upon a time", max_tokens=50):
            out.append(p)
            if len(out) == 2:
                break
        return out

    assert len(asyncio.run(first_two())) == 2


def test_stop_token_max_tokens_and_stop_string(lm):
    ids = lm.encode_chat(PROMPT)
    evs = list(stream(lm.runner, lm.tokenizer, [ids], GenerationOptions(max_tokens=64)))
    assert evs[-1].finish_reason == "stop" and evs[-1].token in lm.tokenizer.stop_ids()  # <|im_end|>
    assert [e.finish_reason for e in evs[:-1]] == [None] * (len(evs) - 1)
    evs = list(stream(lm.runner, lm.tokenizer, [ids], GenerationOptions(max_tokens=3)))
    assert len(evs) == 3 and evs[-1].finish_reason == "length"
    full = "".join(lm.chat(PROMPT, max_tokens=64))
    cut = "".join(lm.chat(PROMPT, max_tokens=64, stop=["Paris"]))
    assert full.startswith(cut) and "Paris" not in cut and cut == full[: full.index("Paris")]


def test_seeded_sampling_is_reproducible_and_varies(lm):
    kw = dict(max_tokens=8, temperature=1.0, top_p=0.95)
    a = "".join(lm.generate("My favourite animal is", seed=1, **kw))
    assert a == "".join(lm.generate("My favourite animal is", seed=1, **kw))
    others = {"".join(lm.generate("My favourite animal is", seed=s, **kw)) for s in (2, 3)}
    assert len(others | {a}) > 1
    # top_k = 1 leaves only the most likely token: sampling equals greedy
    assert "".join(lm.chat(PROMPT, max_tokens=8, temperature=0.7, top_k=1, seed=5)) == "".join(
        lm.chat(PROMPT, max_tokens=8)
    )


def test_sampler_filters_match_transformers():
    tf = pytest.importorskip("transformers")
    from transformers.generation.logits_process import (
        RepetitionPenaltyLogitsProcessor,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 50, generator=g) * 3
    seen_ids = torch.tensor([[1, 2, 3], [4, 5, 5], [7, 8, 49]])
    seen = torch.zeros(3, 50, dtype=torch.bool).scatter_(1, seen_ids, True)
    o = GenerationOptions(temperature=0.7, top_k=10, top_p=0.8, repetition_penalty=1.3)
    s = Sampler(o, 50, torch.device("cpu"))
    ref = RepetitionPenaltyLogitsProcessor(1.3)(seen_ids, logits.clone())
    assert torch.allclose(s.penalize(logits, seen), ref)
    ref = TopPLogitsWarper(0.8)(seen_ids, TopKLogitsWarper(10)(seen_ids, TemperatureLogitsWarper(0.7)(seen_ids, ref)))
    allowed = torch.isfinite(ref)
    draws = torch.stack([s(logits, seen) for _ in range(200)])  # [200, 3]
    assert all(bool(allowed[r, draws[:, r]].all()) for r in range(3))
    assert tf is not None


def test_repetition_penalty_changes_output(lm):
    a = "".join(lm.generate("one, two, one, two, one,", max_tokens=8))
    b = "".join(lm.generate("one, two, one, two, one,", max_tokens=8, repetition_penalty=1.8))
    assert a != b


def test_logit_bias_and_openai_penalties_follow_openais_formula():
    """logits + bias - count * frequency_penalty - (count > 0) * presence_penalty, the counts those of the tokens
    sampled so far (OpenAI's definition), then transformers' repetition penalty; fresh random logits and counts."""
    g = torch.Generator().manual_seed(1)
    V = 97
    for _ in range(5):
        logits = torch.randn(1, V, generator=g) * 4
        bias = {
            int(t): float(b)
            for t, b in zip(torch.randint(0, V, (6,), generator=g), torch.empty(6).uniform_(-100, 100, generator=g))
        }
        fp, pp = (float(x) for x in torch.empty(2).uniform_(-2, 2, generator=g))
        o = GenerationOptions(
            logit_bias={str(k): v for k, v in bias.items()},
            frequency_penalty=fp,
            presence_penalty=pp,
            repetition_penalty=1.2,
        )
        s = Sampler(o, V, torch.device("cpu"))
        sampled = torch.randint(0, V, (12,), generator=g).tolist()
        for t in sampled:
            s.observe(t)
        counts = torch.bincount(torch.tensor(sampled), minlength=V).float()
        seen = torch.zeros(1, V, dtype=torch.bool)
        seen[0, :5] = True
        want = logits.clone()
        for t, b in bias.items():
            want[0, t] += b
        want = want - counts * fp - (counts > 0).float() * pp
        want = torch.where(seen, torch.where(want > 0, want / 1.2, want * 1.2), want)
        got = s.adjust(logits, seen)
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-4) and not got.isnan().any()
        assert not o.argmax and int(s(logits, seen)[0]) == int(want.argmax())
    with pytest.raises(GenerationError, match="outside the vocabulary"):
        Sampler(GenerationOptions(logit_bias={V: 1.0}), V, torch.device("cpu"))


def test_logit_bias_and_penalties_steer_the_model(lm):
    """On the real model: a -100 bias keeps a token out of the answer, +100 makes greedy pick it every step,
    and a frequency penalty breaks a counting loop (fewer repeats of its most frequent token)."""
    ids = lm.encode_chat(PROMPT)
    paris = lm.tokenizer.encode(" Paris", add_bos=False)
    assert len(paris) == 1 and "Paris" in "".join(lm.chat(PROMPT, max_tokens=24))
    banned = list(stream(lm.runner, lm.tokenizer, [ids], GenerationOptions(max_tokens=24, logit_bias={paris[0]: -100})))
    assert paris[0] not in [e.token for e in banned] and "".join(e.text for e in banned).strip()
    forced = [
        e.token
        for e in stream(
            lm.runner, lm.tokenizer, [ids], GenerationOptions(max_tokens=6, logit_bias={paris[0]: 100}, stop_repeats=0)
        )
    ]
    assert forced == paris * 6
    prompt = "one, two, one, two, one, two, one, two,"

    def top_count(text):
        toks = lm.tokenizer.encode(text, add_bos=False)
        return max(toks.count(t) for t in set(toks))

    plain = "".join(lm.generate(prompt, max_tokens=24, stop_repeats=0))
    penalized = "".join(lm.generate(prompt, max_tokens=24, stop_repeats=0, frequency_penalty=2.0))
    assert top_count(penalized) < top_count(plain), (plain, penalized)
    with pytest.raises(GenerationError, match="outside the vocabulary"):
        list(stream(lm.runner, lm.tokenizer, [ids], GenerationOptions(logit_bias={10**6: 1.0})))


def test_logprobs_are_the_models_distribution(lm):
    """Each token's log probability and the likeliest alternatives, from the model's logits before temperature and
    bias: a greedy token is the top one; the first position's list is the same whatever the sampling; the text
    is the tokens' bytes; the stop token has none."""
    ids = lm.encode_chat(PROMPT)

    def pieces(options):
        return list(stream(lm.runner, lm.tokenizer, [ids], options))

    g = pieces(GenerationOptions(max_tokens=16, logprobs=3))
    assert g[-1].finish_reason == "stop" and g[-1].token in lm.tokenizer.stop_ids() and g[-1].logprob is None
    words = g[:-1]
    assert [p.token for p in words] == [e.token for e in pieces(GenerationOptions(max_tokens=16))][:-1]
    for p in words:
        assert len(p.top) == 3 and p.top[0][0] == p.token and p.top[0][1] == pytest.approx(p.logprob, abs=1e-6)
        assert all(v <= 0 for _, v in p.top) and p.top[0][1] >= p.top[1][1] >= p.top[2][1]
        assert sum(np.exp(v) for _, v in p.top) <= 1 + 1e-5
    assert b"".join(lm.tokenizer.token_bytes(p.token) for p in words).decode() == "".join(p.text for p in g)
    hot = pieces(GenerationOptions(max_tokens=4, logprobs=3, temperature=1.5, seed=3, logit_bias={words[0].token: -5}))
    assert [t for t, _ in hot[0].top] == [t for t, _ in words[0].top]
    assert np.allclose([v for _, v in hot[0].top], [v for _, v in words[0].top], atol=1e-5)


def test_unknown_model_error():
    from speechrt.models.registry import ModelError

    with pytest.raises(ModelError, match="registered lm models: smollm2-135m-instruct"):
        speechrt.load_lm("gpt-5")


def test_encode_chat_within_leaves_out_older_turns_whole_and_never_cuts_a_message(lm):
    """Older turns are left out whole to fit; what must stay (the system message and the latest message;
    every message with drop_older=False) over the room is ContextLengthExceeded with the numbers."""
    from speechrt.errors import ContextLengthExceeded

    system = {"role": "system", "content": "Be brief."}
    turns = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"message number {i} " + "word " * 40}
        for i in range(9)
    ]
    whole = lm.encode_chat([system, *turns])
    assert lm.encode_chat_within([system, *turns], len(whole)) == whole
    room = len(whole) // 2
    ids = lm.encode_chat_within([system, *turns], room)
    assert 0 < len(ids) <= room
    kept = next(k for k in range(len(turns), 0, -1) if ids == lm.encode_chat([system, *turns[-k:]]))
    assert 1 <= kept < len(turns)  # the system message and the latest turns, whole
    assert len(lm.encode_chat([system, *turns[-kept - 1 :]])) > room  # one more turn would not fit
    with pytest.raises(ContextLengthExceeded, match=f"are {len(whole)} tokens, over the {room}") as e:
        lm.encode_chat_within([system, *turns], room, drop_older=False)
    assert (e.value.needed, e.value.room, e.value.code) == (len(whole), room, "context_length_exceeded")
    last_two = len(lm.encode_chat([system, turns[-1]]))
    with pytest.raises(ContextLengthExceeded, match=f"the system message and the latest message alone are {last_two}"):
        lm.encode_chat_within([system, *turns], last_two - 1)
    with pytest.raises(ContextLengthExceeded, match="the latest message alone is"):
        lm.encode_chat_within(turns[-1:], 5)
