"""The greedy pick of Whisper's decode loop in one Triton launch (kernels/triton_whisper_pick.py) against its torch
reference (kernels.reference_pick): fresh random logits over odd vocabulary sizes (one block, several, a ragged last
one), rows in every rule state (a closed pair, an open one, timestamps before, none yet, one token so far), rows
whose timestamps are boosted so the forced-timestamp rule decides, suppressed tokens, rows past the first block
boosted; with and without the timestamp rules. The same ids (rows whose two best candidates are closer than rounding
left out) and log-probabilities within float32 rounding."""

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
    return x, sup, torch.stack([last, penult, last_ts, count]), tb, eot


@pytest.mark.parametrize("V", [97, 2500, 51865])
@pytest.mark.parametrize("timestamps", [True, False])
def test_pick_kernel_equals_the_reference(V, timestamps):
    from speechrt.kernels.triton_whisper_pick import whisper_pick

    g = torch.Generator().manual_seed(torch.seed() % (1 << 31))  # fresh inputs every run
    n = 24 if V < 10000 else 10  # (the interpreter runs a program at a time)
    x, sup, st, tb, eot = _case(V, n, g)
    want_ids, want_lp = reference(x, sup, st, timestamps, tb, eot)
    dev = torch.device(DEVICE)
    got_ids, got_lp = (t.cpu() for t in whisper_pick(x.to(dev), sup.to(dev), st.to(dev), timestamps, tb, eot))
    assert torch.isfinite(want_lp).all() and torch.isfinite(got_lp).all()
    # a near tie between the two best allowed tokens (or the forced rule's two sides) may go either way
    top = torch.log_softmax(x.masked_fill(sup, float("-inf")), -1).topk(2).values
    clear = (top[:, 0] - top[:, 1]) > 1e-4
    assert clear.sum() >= n // 2
    assert torch.equal(got_ids[clear], want_ids[clear])
    torch.testing.assert_close(got_lp[clear], want_lp[clear], rtol=1e-5, atol=1e-5)
    if timestamps:
        assert (want_ids >= tb).any() and (want_ids < tb).any()  # both kinds picked: the rules decided
        assert not sup[want_ids].any()


def test_pick_kernel_on_a_strided_view_and_no_rows():
    from speechrt.kernels.triton_whisper_pick import whisper_pick

    g = torch.Generator().manual_seed(torch.seed() % (1 << 31))
    x, sup, st, tb, eot = _case(300, 6, g)
    wide = torch.randn(6, 400, generator=g)
    wide[:, :300] = x
    dev = torch.device(DEVICE)
    got = whisper_pick(wide.to(dev)[:, :300], sup.to(dev), st.to(dev), True, tb, eot)
    want = reference(x, sup, st, True, tb, eot)
    assert torch.equal(got[0].cpu(), want[0])
    ids, lp = whisper_pick(x[:0].to(dev), sup.to(dev), st[:, :0].to(dev), True, tb, eot)
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
