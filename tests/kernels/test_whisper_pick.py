"""The greedy pick of Whisper's decode loop in one Triton launch (kernels/triton_whisper_pick.py) against its torch
reference (kernels.reference_pick): fresh random logits over odd vocabulary sizes (one block, several, a ragged last
one), rows in every rule state (a closed pair, an open one, timestamps before, none yet, one token so far), rows
whose timestamps are boosted so the forced-timestamp rule decides, suppressed tokens, rows past the first block
boosted; with and without the timestamp rules. The same ids (rows whose two best candidates are closer than rounding
left out) and log-probabilities within float32 rounding. The split launch (few rows: each row's columns over several
programs, then a merge) the same ids as the one-program launch, over forced chunk counts that cut small vocabularies
into chunks of several blocks, with ties on chunk boundaries."""

from __future__ import annotations

import os

import pytest
import torch

from speechrt.kernels.reference_pick import whisper_pick as reference

pytestmark = pytest.mark.usefixtures("interpret")
DEVICE = os.environ.get("SPEECHRT_TEST_DEVICE", "cpu")


def _case(V: int, n: int, g):
    tb, eot = V - V // 5, V - V // 5 - 10
    x = torch.randn(n, V, generator=g) * 3
    x[::3, tb:] += 5  # timestamps jointly likely: the forced rule decides these rows
    x[1::4, -7] += 12  # a winner in the last (ragged) block
    sup = torch.zeros(V, dtype=torch.bool)
    sup[torch.randint(0, V, (V // 50,), generator=g)] = True
    sup[tb - 1] = True  # <|notimestamps|>
    count = torch.randint(1, 6, (n,), generator=g)
    last = torch.where(torch.rand(n, generator=g) < 0.5, torch.randint(tb, V, (n,), generator=g), 7)
    penult = torch.where(count >= 2, torch.where(torch.rand(n, generator=g) < 0.5, tb + 2, 9), -1)
    last_ts = torch.where(last >= tb, last, torch.where(torch.rand(n, generator=g) < 0.5, tb + 3, -1))
    # whatever the random logits, row 0 picks a timestamp (its pair is open: text is suppressed, the last timestamp
    # far ahead) and row 1 does not (its pair has just closed: timestamps are suppressed, its boosted one included)
    x[0, V - 1] += 30
    sup[V - 1] = False
    last[0], penult[0], last_ts[0], count[0] = tb + 4, 9, tb + 4, 3
    last[1], penult[1], last_ts[1], count[1] = tb + 2, tb + 2, tb + 2, 3
    return x, sup, torch.stack([last, penult, last_ts, count]), tb, eot


@pytest.mark.parametrize("V", [97, 2500, 51865])
@pytest.mark.parametrize("timestamps", [True, False])
def test_pick_kernel_equals_the_reference(V, timestamps):
    from speechrt.kernels.triton_whisper_pick import whisper_pick

    g = torch.Generator().manual_seed(torch.seed() % (1 << 31))  # fresh inputs every run
    n = 24 if V < 10000 else 10  # (the interpreter runs a program at a time)
    x, sup, st, tb, eot = _case(V, n, g)
    dev = torch.device(DEVICE)
    got = whisper_pick(x.to(dev), sup.to(dev), st.to(dev), timestamps, tb, eot, chunks=1)  # one program a row
    _assert_as_reference(got, x, sup, st, timestamps, tb, eot)


def _assert_as_reference(got, x, sup, st, timestamps, tb, eot):
    n = x.shape[0]
    want_ids, want_lp = reference(x, sup, st, timestamps, tb, eot)
    got_ids, got_lp = (t.cpu() for t in got)
    assert torch.isfinite(want_lp).all() and torch.isfinite(got_lp).all()
    # a near tie between the two best allowed tokens (or the forced rule's two sides) may go either way
    top = torch.log_softmax(x.masked_fill(sup, float("-inf")), -1).topk(2).values
    clear = (top[:, 0] - top[:, 1]) > 1e-4
    assert clear.sum() >= n // 2
    assert torch.equal(got_ids[clear], want_ids[clear])
    torch.testing.assert_close(got_lp[clear], want_lp[clear], rtol=1e-5, atol=1e-5)
    if timestamps:
        assert want_ids[0] >= tb and want_ids[1] < tb  # both kinds picked: the rules decided (_case's rows 0, 1)
        assert not sup[want_ids].any()


def test_pick_kernel_on_a_strided_view_and_no_rows():
    from speechrt.kernels.triton_whisper_pick import whisper_pick

    g = torch.Generator().manual_seed(torch.seed() % (1 << 31))
    x, sup, st, tb, eot = _case(300, 6, g)
    wide = torch.randn(6, 400, generator=g)
    wide[:, :300] = x
    dev = torch.device(DEVICE)
    want = reference(x, sup, st, True, tb, eot)
    for split in ({"chunks": 1}, {"chunks": 3, "block": 32}):  # one program a row; three chunks a row
        got = whisper_pick(wide.to(dev)[:, :300], sup.to(dev), st.to(dev), True, tb, eot, **split)
        assert torch.equal(got[0].cpu(), want[0])
        torch.testing.assert_close(got[1].cpu(), want[1], rtol=1e-5, atol=1e-5)
        ids, lp = whisper_pick(x[:0].to(dev), sup.to(dev), st[:, :0].to(dev), True, tb, eot, **split)
        assert ids.shape == (0,) and lp.shape == (0,)


def test_pick_kernel_breaks_ties_to_the_first_index_as_torch():
    """Two equal maxima in different blocks of the row (and in one block): the first index, as torch's argmax."""
    from speechrt.kernels.triton_whisper_pick import whisper_pick

    x = torch.randn(2, 6000, generator=torch.Generator().manual_seed(torch.seed() % (1 << 31)))
    x[0, [5, 4500]] = 50.0  # blocks 0 and 2 (of 2048)
    x[1, [4100, 4101]] = 50.0
    sup, st = torch.zeros(6000, dtype=torch.bool), torch.tensor([[7, 7], [-1, -1], [-1, -1], [1, 1]])
    want = reference(x, sup, st, False, 5000, 4990)[0]
    dev = torch.device(DEVICE)
    got = whisper_pick(x.to(dev), sup.to(dev), st.to(dev), False, 5000, 4990)[0].cpu()
    assert want.tolist() == [5, 4100] and torch.equal(got, want)


# (vocabulary, rows, chunks asked for, columns a program loads at once, the timestamp rules): chunks of 3, 3 and 7
# blocks, ragged last ones (without the timestamp rules only the small vocabulary: the interpreter is slow)
SPLITS = [(97, 12, 3, 16, True), (97, 12, 3, 16, False), (2500, 8, 7, 128, True), (51865, 5, 4, 2048, True)]


@pytest.mark.parametrize(("V", "n", "chunks", "block", "timestamps"), SPLITS)
def test_split_pick_equals_the_one_program_kernel_and_the_reference(V, n, chunks, block, timestamps):
    from speechrt.kernels.triton_whisper_pick import split_config, whisper_pick

    sc = split_config(n, V, 128, chunks, block)
    assert sc["CHUNKS"] == chunks and sc["CHUNK"] >= 3 * block and sc["CHUNK"] % block == 0
    assert (chunks - 1) * sc["CHUNK"] < V < chunks * sc["CHUNK"]  # the last chunk ragged
    g = torch.Generator().manual_seed(torch.seed() % (1 << 31))
    x, sup, st, tb, eot = _case(V, n, g)
    dev = torch.device(DEVICE)
    args = (x.to(dev), sup.to(dev), st.to(dev), timestamps, tb, eot)
    split = whisper_pick(*args, chunks=chunks, block=block)
    _assert_as_reference(split, x, sup, st, timestamps, tb, eot)
    one = whisper_pick(*args, chunks=1)
    # the same maxima and first indices; the sums in another order (a forced-rule tie within rounding: ~1e-6 a row)
    assert torch.equal(split[0].cpu(), one[0].cpu())
    torch.testing.assert_close(split[1].cpu(), one[1].cpu(), rtol=1e-5, atol=1e-5)


def test_split_pick_breaks_ties_across_chunks_to_the_first_index():
    """Equal maxima on both sides of a chunk boundary, in the first and last chunk, text against the one timestamp
    left (not forced: the strict comparison), with and without the timestamp rules; and batch 1 at a real vocabulary
    in the launcher's own split (one block a chunk), ties across its chunks."""
    from speechrt.kernels.triton_decode_attention import multiprocessors
    from speechrt.kernels.triton_whisper_pick import split_config, whisper_pick

    g = torch.Generator().manual_seed(torch.seed() % (1 << 31))
    dev = torch.device(DEVICE)
    x = torch.randn(4, 97, generator=g)
    x[0, [47, 48]] = x[1, [95, 96]] = x[2, [47, 96]] = x[3, [5, 96]] = 50.0  # chunks [0, 48) [48, 96) [96, 97)
    sup = torch.zeros(97, dtype=torch.bool)
    # rows 0, 1, 3: text so far; row 2: timestamps up to 95 ruled out by the last one (only 96 left)
    st = torch.tensor([[7, 7, 7, 7], [-1, -1, -1, -1], [-1, -1, 95, -1], [1, 1, 1, 1]])
    for timestamps, picks in ((True, [47, 95, 47, 5]), (False, [47, 95, 47, 5])):
        want = reference(x, sup, st, timestamps, 80, 70)[0]
        assert want.tolist() == picks
        for chunks in (1, 3):
            got = whisper_pick(x.to(dev), sup.to(dev), st.to(dev), timestamps, 80, 70, chunks=chunks, block=16)
            assert torch.equal(got[0].cpu(), want), (timestamps, chunks)
    V, tb = 51865, 51865 - 1501
    sc = split_config(1, V, multiprocessors(dev))  # the launcher's split at batch 1
    c = sc["CHUNK"]
    assert sc["CHUNKS"] >= 8 and c < 1500
    x = torch.randn(1, V, generator=g)
    x[0, [c - 1, c, 5 * c + 3]] = 20.0  # text across a boundary and further on
    x[0, tb + 3] = 19.0  # the best timestamp, not forced
    sup, st = torch.zeros(V, dtype=torch.bool), torch.tensor([[7], [9], [-1], [2]])  # text so far
    want = reference(x, sup, st, True, tb, tb - 10)
    got = whisper_pick(x.to(dev), sup.to(dev), st.to(dev), True, tb, tb - 10)
    assert want[0].item() == c - 1 and got[0].item() == c - 1
    torch.testing.assert_close(got[1].cpu(), want[1], rtol=1e-5, atol=1e-5)


def _merged_equals_second_launch(pick_module, launched: list):
    """The split pick merged by the row's last chunk (one launch) against its second launch: the same ids and
    log-probabilities bit for bit (the same merge of the same partials), one launch against two, the counters back
    at 0."""
    from speechrt.kernels.triton_decode_attention import counters

    g = torch.Generator().manual_seed(torch.seed() % (1 << 31))
    x, sup, st, tb, eot = _case(97, 5, g)
    args = (x, sup, st, True, tb, eot)
    launched.clear()
    one = pick_module.whisper_pick(*args, chunks=3, block=16)
    assert launched == ["_whisper_pick_part_kernel"], launched
    assert counters(torch.device("cpu"), 1).abs().max() == 0
    two = pick_module.whisper_pick(*args, chunks=3, block=16, one_launch=False)
    assert launched[1:] == ["_whisper_pick_part_kernel", "_whisper_pick_combine_kernel"], launched
    assert torch.equal(one[0], two[0]) and torch.equal(one[1], two[1])


@pytest.mark.parametrize("last", [None, "chunks - 2", "chunks"])
def test_split_pick_merges_in_its_launch(monkeypatch, tmp_path, last):
    """The default (not ROCm) merges a row's chunks in the launch that computes them; a merge by the wrong program
    (the last-ticket test off by one: the next-to-last chunk merges before the last one stored its partials and the
    counter is left at 1; no chunk merges and the counter stays at 3) fails the same checks."""
    from kernel_checks import LaunchTrace, mutant_module  # tests/

    from speechrt.kernels import triton_decode_attention as dec
    from speechrt.kernels import triton_whisper_pick as pick

    if DEVICE != "cpu":
        pytest.skip("counts the interpreter's launches")
    launched = LaunchTrace(monkeypatch).launched
    assert dec.merges_in_launch()
    if last is None:
        return _merged_equals_second_launch(pick, launched)
    mutant = mutant_module(pick, "ticket == chunks - 1", f"ticket == {last}", 1, tmp_path)
    try:
        with pytest.raises(AssertionError):
            _merged_equals_second_launch(mutant, launched)
    finally:
        dec.counters(torch.device("cpu"), 1).zero_()
