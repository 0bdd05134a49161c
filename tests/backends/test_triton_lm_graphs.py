"""The triton language-model runner's decode graphs (backends/triton/lm.py) on the embedded SmolLM2-135M: a
step over any set of slots runs over the rows 0..n-1 that cover them, and must give each stepped slot the
logits of the plain runner's step, leave the slots it does not step as they were, and fall back to eager
steps where a row it would write is full. On the CPU the graph path runs uncaptured on the reference kernels
(what differs from the plain runner is only the covering range); `bench gpu --checks lm-graphs` compares
captured steps with eager ones on a GPU, scattered slots included (that part has not run on a GPU yet).
"""

from __future__ import annotations

import random

import pytest
import torch

from speechrt.backends.torch import lm as torch_lm
from speechrt.backends.triton.lm import TritonLMRunner, range_rows
from speechrt.models import registry
from speechrt.pipelines.lm import LMPipeline

pytestmark = pytest.mark.usefixtures("one_cpu_thread")

CHATS = [
    "What is the capital of France?",
    "How many legs does a spider have?",
    "Give me one tip for sleeping.",
    "Name a colour of the sky.",
    "Count to three.",
]


@pytest.fixture(scope="module")
def runners():
    rm = registry.resolve("smollm2-135m-instruct", "lm")
    f = torch_lm.load_file(rm)
    cpu = torch.device("cpu")
    plain = torch_lm.TorchLMRunner(f, cpu, "float32")
    graphs = TritonLMRunner(f, cpu, "float32", "torch", capture=False)
    assert graphs.graphs_enabled and not graphs.capture
    return LMPipeline(plain, "smollm2"), graphs


def test_range_rows():
    assert [range_rows(t, 8) for t in range(1, 9)] == [1, 2, 4, 4, 8, 8, 8, 8]
    assert range_rows(5, 6) == 6 and range_rows(1, 1) == 1


def test_steps_over_scattered_slots_match_the_plain_runner(runners):
    lm, g = runners
    p = lm.runner
    rng = random.Random()  # fresh prompts and slot sets every run
    prompts = {s: torch.tensor(lm.encode_chat(rng.choice(CHATS))[: rng.randint(8, 30)]) for s in (1, 3, 4, 6)}
    ours, ref = g.new_cache(8, 96), p.new_cache(8, 96)
    for s, ids in prompts.items():
        a, b = g.prefill(ours, s, ids), p.prefill(ref, s, ids)
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    idle = 3  # holds a conversation's prefix, never stepped below
    kept = ours.k[:, idle, :, : ours.lengths[idle]].clone(), ours.v[:, idle, :, : ours.lengths[idle]].clone()
    for slots in ([1, 6], [4], [6, 1, 4], [1], [4, 6]):
        tokens = torch.tensor([rng.randrange(lm.runner.config.vocab_size) for _ in slots])
        got, want = g.decode_step(ours, slots, tokens), p.decode_step(ref, slots, tokens)
        assert got.shape == want.shape and torch.isfinite(got).all()
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4 * want.abs().max().item())
        assert ours.lengths == ref.lengths
    assert torch.equal(ours.k[:, idle, :, : ours.lengths[idle]], kept[0])
    assert torch.equal(ours.v[:, idle, :, : ours.lengths[idle]], kept[1])
    # steps over slots below 1, 2 and 8: one graph per row count, whatever the slots
    assert sorted(k[2] for k in g.graphs.items if k[0] == ours.k.data_ptr()) == [2, 8]


def test_a_full_row_in_the_range_makes_the_step_eager(runners):
    lm, g = runners
    p = lm.runner
    ours, ref = g.new_cache(4, 40), p.new_cache(4, 40)
    ids = torch.tensor(lm.encode_chat(CHATS[0])[:12])
    full = torch.tensor((lm.encode_chat(CHATS[1]) * 4)[:40])
    for c, r in ((ours, g), (ref, p)):
        r.prefill(c, 0, ids)
        r.prefill(c, 2, full)  # a retained prefix that fills its slot: no position past it to write
    kept = ours.k[:, 2].clone()
    tok = torch.tensor([7])
    torch.testing.assert_close(g.decode_step(ours, [0], tok), p.decode_step(ref, [0], tok), rtol=1e-4, atol=1e-3)
    got = g.decode_step(ours, [1], tok)  # rows 0..1: no full one, the graph path (row 1 empty)
    torch.testing.assert_close(got, p.decode_step(ref, [1], tok), rtol=1e-4, atol=1e-3)
    n_graphs = len(g.graphs)
    got = g.decode_step(ours, [3], tok)  # rows 0..3 would cover the full slot 2: eager
    torch.testing.assert_close(got, p.decode_step(ref, [3], tok), rtol=1e-4, atol=1e-3)
    assert len(g.graphs) == n_graphs and torch.equal(ours.k[:, 2], kept)
    assert ours.lengths == ref.lengths == [13, 1, 40, 1]


def test_prepare_makes_the_decode_graph_of_every_row_count_and_leaves_the_cache_empty(runners):
    _, g = runners
    cache = g.new_cache(6, 40)
    g.prepare(cache, 0)
    assert sorted(k[2] for k in g.graphs.items if k[0] == cache.k.data_ptr()) == [1, 2, 4, 6]
    assert cache.lengths == [0] * 6
