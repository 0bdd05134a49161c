"""The continuous batcher on the embedded model: a request whose prompt fails (its prefill raises) fails
alone — the others' replies are those of a batch without it and its slot serves the next request — and a
reply caught in a loop ends ('repetition') instead of running to its token budget."""

from __future__ import annotations

import pytest

import speechrt
from speechrt.backends.base import LMRunner
from speechrt.pipelines.generation import GenerationOptions
from speechrt.pipelines.lm_batching import ContinuousBatcher, LMRequest, stream

BAD = 7  # prompts that start with this token make the faulty runner's prefill raise


class FaultyPrefill(LMRunner):
    """The real runner, with prefill failing for prompts that start with BAD (a fault injector)."""

    def __init__(self, runner):
        self.r = runner
        self.config, self.device, self.info = runner.config, runner.device, runner.info
        self.tokenizer, self.chat_template = runner.tokenizer, runner.chat_template

    def new_cache(self, max_batch, max_seq):
        return self.r.new_cache(max_batch, max_seq)

    def prefill(self, cache, slot, tokens, start=0):
        if int(tokens[0]) == BAD and start == 0:
            raise RuntimeError("injected prefill failure")
        return self.r.prefill(cache, slot, tokens, start)

    def decode_step(self, cache, slots, tokens):
        return self.r.decode_step(cache, slots, tokens)

    def release(self, cache, slot):
        self.r.release(cache, slot)

    def loop(self):
        return self.r.loop()


@pytest.fixture(scope="module")
def lm():
    return speechrt.load_lm(backend="torch")


def test_a_failing_prompt_fails_only_its_request(lm, one_cpu_thread):
    runner = FaultyPrefill(lm.runner)
    good = [lm.encode_chat("What is the capital of France?"), lm.encode_chat("Name a primary color.")]
    bad = [BAD] + good[0][1:]
    opts = GenerationOptions(max_tokens=12)
    out: dict[int, list] = {0: [], 1: [], 2: [], 3: []}
    b = ContinuousBatcher(runner, lm.tokenizer, max_batch=2, max_seq=256)
    for i, ids in enumerate([good[0], bad, good[1], good[0]]):
        b.submit(LMRequest(list(ids), opts, lambda piece, i=i: out[i].append(piece)))
    while b.has_work():
        b.step()
    assert len(out[1]) == 1 and isinstance(out[1][0], RuntimeError)  # told once, nothing else
    texts = {i: "".join(p.text for p in out[i]) for i in (0, 2, 3)}
    ref = ["".join(e.text for e in stream(lm.runner, lm.tokenizer, [g], opts)) for g in good]
    assert texts[0] == ref[0] and texts[3] == ref[0] and texts[2] == ref[1]
    assert all(out[i][-1].finish_reason in ("stop", "length") for i in (0, 2, 3))
    assert sorted(b.free) == [0, 1] and not b.active  # the failed request's slot came back


def test_a_looping_reply_ends_as_repetition(lm, one_cpu_thread):
    # a prompt the model loops on in every precision measured (float32, int4 on the AVX2 kernel)
    ids = lm.tokenizer.encode("I am a robot. I am a robot. I am a robot. I am a robot. I am")
    evs = list(stream(lm.runner, lm.tokenizer, [ids], GenerationOptions(max_tokens=80)))
    assert evs[-1].finish_reason == "repetition" and len(evs) < 60
    evs = list(stream(lm.runner, lm.tokenizer, [ids], GenerationOptions(max_tokens=80, stop_repeats=0)))
    assert evs[-1].finish_reason == "length" and len(evs) == 80
    with pytest.raises(Exception, match="stop_repeats"):
        GenerationOptions(stop_repeats=1)
