"""Decode loops that stay on the device (backends/decode_loop.py, backends/sampling.py) on a tiny random Llama:
blocks of K steps from the triton runner (uncaptured on the CPU: the ops a graph replays) give the tokens,
finish reasons and cache contents of the one-step path, whatever K, the batch beside a request and its slot;
seeded sampling is reproducible alone or in a batch, and draws from the right distribution."""

from __future__ import annotations

import os
from functools import partial

import pytest
import torch

pytest.importorskip("transformers", reason="builds the tiny model: pip install 'speechrt[peers]'")
pytest.importorskip("gguf")

from lm_archs import byte_bpe, written  # noqa: E402 - tests/lm_archs.py

from speechrt.backends import sampling  # noqa: E402
from speechrt.backends.sampling import SamplingRows  # noqa: E402
from speechrt.backends.torch import lm as torch_lm  # noqa: E402
from speechrt.backends.triton.lm import TritonLMRunner  # noqa: E402
from speechrt.bench.gpu_loop import compare_blocks  # noqa: E402
from speechrt.bench.record import Results  # noqa: E402
from speechrt.models import registry  # noqa: E402
from speechrt.pipelines.generation import GenerationOptions  # noqa: E402
from speechrt.pipelines.lm_batching import ContinuousBatcher, LMRequest  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_cpu_thread")
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def runner(tmp_path_factory):
    _, d = written("llama3", tmp_path_factory, byte_bpe())
    r = TritonLMRunner(torch_lm.load_file(registry.resolve(str(d), "lm")), CPU, "float32", "torch", capture=False)
    assert r.graphs_enabled and not r.capture
    return r


def prompt(i: int, n: int = 9) -> list[int]:
    return torch.randint(3, 500, (n + i % 4,), generator=torch.Generator().manual_seed(100 + i)).tolist()


def run(runner, jobs, block: int, max_batch: int = 6, max_seq: int = 64):
    """Each job (prompt, options) submitted with a key; stepped to the end -> (tokens and finish reason per
    job, {key: (ids the slot retains, its K and V over them)}, the batcher)."""
    b = ContinuousBatcher(runner, runner.tokenizer, max_batch=max_batch, max_seq=max_seq, block=block)
    out = {i: [] for i in range(len(jobs))}
    for i, (ids, o) in enumerate(jobs):
        b.submit(LMRequest(list(ids), o, lambda p, i=i: out[i].append(p), key=i))
    while b.has_work():
        b.step()
    got = {i: ([p.token for p in ps], ps[-1].finish_reason, "".join(p.text for p in ps)) for i, ps in out.items()}
    kept = {}
    for slot, (key, ids) in b.retained.items():
        assert b.cache.lengths[slot] == len(ids)  # the slot's length is what it fed, however the block ended
        n = len(ids)
        kept[key] = (ids, b.cache.k[:, slot, :, :n].clone(), b.cache.v[:, slot, :, :n].clone())
    return got, kept, b


def same(a, b):
    (ga, ka, _), (gb, kb, _) = a, b
    assert ga == gb
    assert ka.keys() == kb.keys()
    for key in ka:
        assert ka[key][0] == kb[key][0]
        torch.testing.assert_close(ka[key][1], kb[key][1], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(ka[key][2], kb[key][2], rtol=1e-5, atol=1e-5)


def test_greedy_blocks_equal_one_step(runner):
    """Six requests (more than the slots they start in: later ones join freed, scattered slots) with different
    budgets, stop ids met mid-block and a stop string the host finds: the same tokens, finish reasons, retained
    ids and K/V per request for K = 2, 4, 8 as one step at a time."""
    base = [(prompt(i), GenerationOptions(max_tokens=5 + 3 * i, stop_repeats=0, stop_token_ids=())) for i in range(6)]
    ref, _, _ = run(runner, base, block=1, max_batch=4)
    # stop ids each request meets at a different step; a stop string in one reply's text
    jobs = []
    for i, (ids, o) in enumerate(base):
        toks = ref[i][0]
        stop = (toks[min(len(toks) - 1, 2 + i)],) if i % 2 else ()
        jobs.append((ids, GenerationOptions(max_tokens=o.max_tokens, stop_repeats=0, stop_token_ids=stop)))
    text = ref[4][2]
    jobs[4] = (jobs[4][0], GenerationOptions(max_tokens=17, stop_repeats=0, stop_token_ids=(), stop=(text[6:8],)))
    want = run(runner, jobs, block=1, max_batch=4)
    assert {r for _, r, _ in want[0].values()} >= {"stop", "length"}
    assert len(want[0][4][0]) < len(ref[4][0])  # the stop string ended it early
    for k in (2, 4, 8):
        runner.loops.items.clear()
        got = run(runner, jobs, block=k, max_batch=4)
        same(got, want)
        assert max(key[3] for key in runner.loops.items) == k  # blocks of k steps ran (and shorter ones)


def test_a_block_the_device_refuses_falls_back_to_one_step(runner, monkeypatch, caplog):
    """A decode block that fails (a capture a GPU refuses) is logged once, and the requests go on one step at a
    time with the one-step path's tokens; the runner offers no more blocks."""
    from speechrt.backends.triton import lm as triton_lm

    jobs = [(prompt(i), GenerationOptions(max_tokens=6, stop_repeats=0, stop_token_ids=())) for i in range(2)]
    want = run(runner, jobs, block=1)

    def refused(*a, **k):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(triton_lm, "DecodeLoop", refused)
    runner.loops.items.clear()
    try:
        got = run(runner, jobs, block=8)
        assert not runner.loops_enabled and "decoding one step at a time" in caplog.text
    finally:
        runner.loops_enabled = True
    same(got, want)


def test_block_ends_rows_exactly(runner):
    """The runner's block: a row that meets a stop id stops there (later entries repeat it, its length is what
    it fed), one whose budget is the block's runs all of it; the ids are the one-step path's."""
    cache = runner.new_cache(8, 48)
    slots, first = [5, 2], []
    for s, i in zip(slots, (0, 1)):
        first.append(int(runner.prefill(cache, s, torch.tensor(prompt(i))).argmax()))
    start = [cache.lengths[s] for s in slots]
    ref_cache = runner.new_cache(8, 48)
    for s, i in zip(slots, (0, 1)):
        runner.prefill(ref_cache, s, torch.tensor(prompt(i)))
    toks, ref = torch.tensor(first), []
    for _ in range(6):
        toks = runner.decode_step(ref_cache, slots, toks).argmax(-1)
        ref.append(toks.tolist())
    ref = list(map(list, zip(*ref)))  # per row
    rows = SamplingRows.stack([SamplingRows.one(runner.config.vocab_size, CPU)] * 2, [0, 0])
    ids, ran = runner.decode_loop(cache, slots, torch.tensor(first), rows, 6, [6, 6], [(ref[0][2],), ()])
    assert ran == [3, 6] and ids[1] == ref[1] and ids[0][:3] == ref[0][:3] and set(ids[0][3:]) == {ref[0][2]}
    assert [cache.lengths[s] for s in slots] == [start[0] + 3, start[1] + 6]
    # a budget past the cache, or a block longer than a row's budget: no block (the caller steps once)
    assert runner.decode_loop(cache, slots, torch.tensor(first), rows, 6, [6, 5], [(), ()]) is None


SAMPLED = GenerationOptions(
    max_tokens=12,
    temperature=0.9,
    top_k=40,
    top_p=0.9,
    seed=3,
    repetition_penalty=1.2,
    frequency_penalty=0.5,
    logit_bias={7: 3.0},
    stop_repeats=0,
    stop_token_ids=(),
)


def test_seeded_sampling_same_alone_or_beside_others(runner):
    """A seeded request draws the same tokens one step at a time alone, in blocks of 4 or 8, and beside other
    requests (greedy, other seeds) that put it in another slot; a different seed draws other tokens."""
    me = (prompt(9), SAMPLED)
    alone = run(runner, [me], block=1)[0][0][0]
    assert run(runner, [me], block=8)[0][0][0] == alone
    others = [(prompt(i), GenerationOptions(max_tokens=4 + i, temperature=0.7 * (i % 2), seed=i)) for i in range(3)]
    got, _, _ = run(runner, [*others, me], block=4)
    assert got[3][0] == alone
    got, _, _ = run(runner, [others[0], me, others[1]], block=1)
    assert got[1][0] == alone
    other_seed = GenerationOptions(**{**SAMPLED.__dict__, "seed": 4})
    assert run(runner, [(prompt(9), other_seed)], block=8)[0][0][0] != alone


def test_rows_stacked_from_host_values_equal_the_concatenated_rows():
    """SamplingRows.stack of rows built by one() sends their one-value options in one transfer per dtype, from the
    host values it keeps for a decode block to stage: the same tensors as concatenating the rows' own; stacked for a
    block (scalars=False) it sends none of them, and the block stages the same values from the host; a decode
    block refuses rows without host values, naming what to build them with."""
    from dataclasses import replace

    from speechrt.backends.decode_loop import INTS, DecodeLoop

    V = 50
    kws = [dict(), dict(temperature=0.7, top_k=5, top_p=0.9, seed=2**62 + 3), dict(temperature=1.3, top_k=80)]
    kws.append(dict(repetition=1.2, frequency=0.3, presence=0.5, bias=torch.zeros(V), counts=torch.zeros(V)))
    rows = [SamplingRows.one(V, CPU, **kw) for kw in kws]
    fast = SamplingRows.stack(rows, [0, 5, 7, 9])
    slow = SamplingRows.stack([replace(r, host=None) for r in rows], [0, 5, 7, 9])
    assert slow.host is None and len(fast.host) == 4 and fast.host[1][-2:] == (2**62 + 3, 5)
    assert fast.features == slow.features == (True, True, False, True, True)
    for f in sampling.SCALARS + sampling.BIG:
        a, b = getattr(fast, f), getattr(slow, f)
        assert (a is None) == (b is None) and (a is None or (a.dtype == b.dtype and torch.equal(a, b))), f
    lean = SamplingRows.stack(rows, [0, 5, 7, 9], scalars=False)
    assert lean.host == fast.host and lean.features == fast.features
    assert all(getattr(lean, f) is None for f in sampling.SCALARS)
    assert all(torch.equal(getattr(lean, f), getattr(fast, f)) for f in ("bias", "counts")) and lean.seen is None

    class Cache:
        k, max_seq = torch.zeros(1), 8

    loop = DecodeLoop(None, Cache(), 4, 2, fast.features, V, 4, False)
    with pytest.raises(ValueError, match="SamplingRows.one"):
        loop([0], [1], [1] * 4, slow, [2], [()])

    # what a block costs the host besides its replay: two copies of the staged values (plus, here, the bias and
    # counts rows: a fill and a copy each, and the slots' indices)
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            ops.append(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    out, ops, tokens = torch.zeros(4, 3, dtype=torch.long), [], torch.tensor([5, 6, 7, 8])
    loop.step = lambda: out
    loop([2, 0, 1, 3], tokens, [3] * 4, fast, [2] * 4, [(1,), (), (2, 3), ()])
    staged = loop.ints.clone(), loop.floats.clone()
    with Ops():
        got = loop([2, 0, 1, 3], tokens, [3] * 4, lean, [2] * 4, [(1,), (), (2, 3), ()])
    assert got == ([[0, 0]] * 4, [0] * 4)
    assert torch.equal(loop.ints, staged[0]) and torch.equal(loop.floats, staged[1])
    ops = [o for o in ops if o != "detach"]  # (numpy views of the staging buffers)
    assert ops == ["copy_", "copy_", "lift_fresh", *["fill_", "index_copy_"] * 2], ops
    i = {name: loop.ints[j].tolist() for j, name in enumerate(("tok", "pos", "live", "left"))}
    assert i == {"tok": [6, 7, 5, 8], "pos": [3] * 4, "live": [1] * 4, "left": [2] * 4}
    assert loop.ints[len(INTS) : len(INTS) + 4].T.tolist() == [
        [-1] * 4,
        [2, 3, -1, -1],
        [1, -1, -1, -1],
        [-1] * 4,
    ]  # sorted stop ids
    assert loop.floats[0].tolist() == pytest.approx([0.7, 1.3, 1.0, 1.0])  # temperatures (a greedy row: 1)
    for scalars, made in ((True, 3), (False, 0)):  # the one-value options: a tensor per dtype, or none
        ops = []
        with Ops():
            SamplingRows.stack(rows, [0, 5, 7, 9], scalars)
        assert ops.count("lift_fresh") == made and ops.count("cat") == 2, ops


def rows_of(n: int, vocab: int, **kw) -> SamplingRows:
    return SamplingRows.stack([SamplingRows.one(vocab, CPU, **kw)] * n, list(range(n)))


def test_sampling_distribution():
    """Gumbel-max over the counter noise: 6000 draws (one seed, counters 0..5999) of temperature 0.7 over 6
    tokens match softmax(logits / 0.7) (chi-square, 5 degrees of freedom, under its 0.1 % point 20.5); top-k 1
    and a tiny top-p are greedy; top-k 2 draws only the two likeliest."""
    logits = torch.tensor([1.0, 0.2, -0.5, 0.9, -2.0, 0.0])
    n, V = 6000, 6
    ids = sampling.pick(logits.expand(n, V), rows_of(n, V, temperature=0.7, seed=11))
    seen = torch.bincount(ids, minlength=V).float()
    expect = torch.softmax(logits / 0.7, -1) * n
    assert float(((seen - expect) ** 2 / expect).sum()) < 20.5
    for kw in (dict(top_k=1), dict(top_p=1e-3)):
        assert set(sampling.pick(logits.expand(200, V), rows_of(200, V, temperature=1.5, seed=1, **kw)).tolist()) == {0}
    assert set(sampling.pick(logits.expand(500, V), rows_of(500, V, temperature=2.0, seed=2, top_k=2)).tolist()) == {
        0,
        3,
    }
    u = sampling.uniform(torch.tensor([5, 5, 6]), torch.tensor([0, 1, 0]), 1000)
    assert 0 < float(u.min()) and float(u.max()) < 1 and abs(float(u.mean()) - 0.5) < 0.02
    assert not torch.equal(u[0], u[1]) and not torch.equal(u[0], u[2])  # counters and seeds give other noise


def test_the_noise_never_outbids_a_masked_token():
    """The extreme hashes give noise strictly inside (0, 1), so the Gumbel term is finite (with 24 bits the largest
    rounded to 1.0 in float32: G = +inf won the draw whatever the logit, and Gemma 3's grammar-masked tokens (-1e30)
    were drawn about once in 60 tokens over its 262,144-token vocabulary). Then draws over that vocabulary with all
    but three tokens masked take only those three, through every filter."""

    def fmix32(x: int) -> int:  # murmur3's finalizer in Python's exact integers
        x ^= x >> 16
        x = (x * 0x85EBCA6B) & 0xFFFFFFFF
        x ^= x >> 13
        x = (x * 0xC2B2AE35) & 0xFFFFFFFF
        return x ^ (x >> 16)

    xs = [0, 1, 12345, (1 << 31) + 7, (1 << 32) - 1] + torch.randint(0, 1 << 32, (1000,)).tolist()
    assert sampling.mix32(torch.tensor(xs)).tolist() == [fmix32(x) for x in xs]  # products past 2**63 wrap exactly
    u = sampling.unit(torch.tensor([0, 1, (1 << 31), (1 << 32) - 2, (1 << 32) - 1]))
    g = -torch.log(-torch.log(u))
    assert float(u.min()) > 0 and float(u.max()) < 1 and bool(torch.isfinite(g).all()), (u, g)
    V, gen = 262144, torch.Generator().manual_seed(0)
    for seed in range(8):
        allowed = torch.randperm(V, generator=gen)[:3]
        logits = torch.full((1, V), -1e30)
        logits[0, allowed] = torch.randn(3, generator=gen)
        for kw in (dict(), dict(top_k=64, top_p=0.95)):
            row = SamplingRows.one(V, CPU, temperature=1.0, seed=seed, **kw)
            assert int(sampling.pick(logits, row, torch.tensor([seed]))[0]) in allowed.tolist()


def test_lm_loop_bench_check_runs_on_the_cpu(runner):
    """`bench gpu --checks lm-loop`'s comparison (gpu_loop.compare_blocks) on the tiny model, uncaptured: it
    passes (the ids of K = 8 are K = 1's, replies forced into loops end by repetition alike) and records tokens
    per second of each K at batch 1 and 3."""
    out = Results()
    status, detail = compare_blocks(
        runner, runner.tokenizer, [prompt(i) for i in range(3)], CPU, out, "tiny", "float32", 12, 1
    )
    assert status == "pass" and "forced loops stopped alike" in detail, detail
    got = {(r.params["batch"], r.params["steps_per_replay"]) for r in out.records}
    assert got == {(1, 1), (1, 8), (3, 1), (3, 8)} and all(r.value > 0 for r in out.records)


def cancel_after_two(got: list, req, p) -> None:
    got.append((p.token, p.finish_reason))
    if req is not None and len(got) == 2:
        req.cancelled = True


def test_a_request_cancelled_mid_block_gets_no_more_tokens(runner):
    """A request cancelled by its own emit after its second token (as a barge-in does) gets what one-step
    decoding gives it: two tokens, then 'cancelled', its slot keeping what it fed; its neighbour runs on."""
    out = {}
    for block in (1, 8):
        b = ContinuousBatcher(runner, runner.tokenizer, max_batch=2, max_seq=64, block=block)
        got = {0: [], 1: []}
        o = GenerationOptions(max_tokens=12, stop_repeats=0, stop_token_ids=())
        reqs = [LMRequest(prompt(i), o, key=i) for i in range(2)]
        for i, r in enumerate(reqs):
            r.emit = partial(cancel_after_two, got[i], r if i == 0 else None)
        for r in reqs:
            b.submit(r)
        while b.has_work():
            b.step()
        kept = {key: (ids, b.cache.lengths[s]) for s, (key, ids) in b.retained.items()}
        out[block] = got, kept
    assert out[1] == out[8]
    got, kept = out[8]
    assert [r for _, r in got[0]] == [None, None, "cancelled"] and len(got[1]) == 12
    assert all(len(ids) == n for ids, n in kept.values())


def looping(stop_repeats: int, bias: tuple[int, ...], penalty: float = 2.0) -> GenerationOptions:
    """Greedy over a few tokens biased far above the rest, the most used one penalized: the tiny model cycles
    through them in loops of 2 to 10 tokens (one token biased: a run of it)."""
    return GenerationOptions(
        max_tokens=40,
        stop_repeats=stop_repeats,
        stop_token_ids=(),
        logit_bias={t: 100.0 for t in bias},
        frequency_penalty=penalty if len(bias) > 1 else 0.0,
    )


@pytest.mark.parametrize("kernel", ["torch", "triton"])
def test_a_looping_reply_ends_in_its_block(runner, monkeypatch, kernel):
    """Replies that fall into loops (different spans and stop_repeats in one batch, beside one with the stop off
    and one that never loops) end by 'repetition' at the same token with the same tokens and cache contents in
    blocks of 4 and 8 as one step at a time; and the device stopped each row there: the steps it computed per
    request are the tokens the host kept (none rewound). The repetition stop's step in torch ops or its Triton
    kernel (kernels/triton_repeats.py, interpreted on the CPU)."""
    if kernel == "triton":  # (blocks of 8 only: the interpreter is slow)
        pytest.importorskip("triton")
        if os.environ.get("SPEECHRT_TEST_DEVICE", "cpu") != "cpu":
            pytest.skip("the runner here is on the CPU: its kernel interpreted")
        from speechrt.kernels.triton_repeats import repeat_advance

        monkeypatch.setenv("TRITON_INTERPRET", "1")  # (tests/conftest.py imported the kernel interpreted)
        monkeypatch.setattr(runner, "repeat_advance", repeat_advance)
    jobs = [
        (prompt(0), looping(2, (40, 41, 42))),
        (prompt(1), looping(3, (40, 41))),
        (prompt(2), looping(4, (40, 41, 42, 43, 44))),
        (prompt(3), looping(2, (77,))),
        (prompt(4), looping(0, (77,))),
        (prompt(5), GenerationOptions(max_tokens=40, stop_token_ids=())),
    ]
    want = run(runner, jobs, block=1)
    reasons = [r for _, r, _ in want[0].values()]
    assert reasons.count("repetition") >= 3 and reasons[3:] == ["repetition", "length", "length"], reasons
    assert len(want[0][3][0]) == 8  # one token: 4 * 2 copies
    steps = {}
    real_loop, real_step = runner.decode_loop, runner.decode_step

    def loop(cache, slots, *a):
        res = real_loop(cache, slots, *a)
        for s, ran in zip(slots, res[1] if res is not None else ()):
            steps[s] = steps.get(s, 0) + ran
        return res

    def step(cache, slots, tokens):
        for s in slots:
            steps[s] = steps.get(s, 0) + 1
        return real_step(cache, slots, tokens)

    monkeypatch.setattr(runner, "decode_loop", loop)
    monkeypatch.setattr(runner, "decode_step", step)
    for k in (4, 8) if kernel == "torch" else (8,):
        steps.clear()
        runner.loops.items.clear()
        got = run(runner, jobs, block=k)
        same(got, want)
        assert max(key[3] for key in runner.loops.items) == k and 128 in {key[-1] for key in runner.loops.items}
        for slot, (key, ids) in got[2].retained.items():  # one slot per request: what its device steps fed
            assert steps[slot] == len(ids) - len(jobs[key][0]), (key, steps[slot], len(ids) - len(jobs[key][0]))
