"""The triton ASR runner's graph path (backends/triton/asr.py): single-token steps on a slot's fixed buffers
(rows padded to a power of two, caches to the decoder's context, cross keys/values to a whole window, the rest
masked by length) give the plain runner's logits through everything a decode does to a state: prompts, steps,
rows dropped (into another slot, or in place), beams reordered, a rewind and a re-fed draft, and two states
taking turns on one slot. On the CPU the slot path runs uncaptured, in the Triton interpreter; with
SPEECHRT_TEST_DEVICE=cuda it runs captured as CUDA graphs."""

from __future__ import annotations

import os

import pytest
import torch

from speechrt.backends.asr_state import Encoded
from speechrt.backends.cuda_graphs import CapturedStep, rows_bucket
from speechrt.backends.torch.asr import TorchASRRunner
from speechrt.backends.triton.asr import TritonASRRunner
from speechrt.kernels import select
from speechrt.models.whisper import Whisper, WhisperConfig
from speechrt.models.whisper_loaders import WhisperWeights

pytestmark = pytest.mark.usefixtures("interpret")
DEVICE = os.environ.get("SPEECHRT_TEST_DEVICE", "cpu")  # tests/kernels/conftest.py

CFG = WhisperConfig(
    n_mels=8,
    n_audio_ctx=12,
    n_audio_state=32,
    n_audio_head=2,
    n_audio_layer=2,
    n_vocab=97,
    n_text_ctx=16,
    n_text_state=32,
    n_text_head=2,
    n_text_layer=2,
)


def _weights():
    g = torch.Generator().manual_seed(torch.seed() % (1 << 31))  # fresh weights every run
    ref = Whisper(CFG, select("torch", "cpu"))
    state = {k: torch.randn(v.shape, generator=g) * (0.3 if v.dim() > 1 else 0.1) for k, v in ref.state_dict().items()}
    return WhisperWeights(CFG, state, None), g


def _runners():
    w, g = _weights()
    dev = torch.device(DEVICE)
    plain = TorchASRRunner(w, dev, torch.float32)
    slots = TritonASRRunner(w, dev, torch.float32, capture=DEVICE != "cpu")
    assert slots.graphs_enabled and slots.fused_why is None  # the steps in the fused kernels (the default)
    return plain, slots, g


def _close(a, b):
    assert torch.isfinite(a).all() and torch.isfinite(b).all()
    torch.testing.assert_close(a, b, rtol=2e-4, atol=2e-4)


def test_rows_bucket():
    assert [rows_bucket(n) for n in (1, 2, 3, 4, 5, 8, 9, 31, 33)] == [1, 2, 4, 4, 8, 8, 16, 32, 64]


@torch.inference_mode()
def test_slot_path_gives_the_plain_runners_logits_through_a_decodes_life():
    plain, slots, g = _runners()
    dev = plain.device
    xa = torch.randn(4, 10, CFG.n_text_state, generator=g).to(dev)  # 10 of a window's 12 encoder positions
    lengths = torch.tensor([10, 7, 4, 9], device=dev)
    other = torch.randn(2, CFG.n_audio_ctx, CFG.n_text_state, generator=g).to(dev)  # a whole window, no lengths

    def tok(*rows):
        return torch.tensor(rows, device=dev)

    def run(r):
        out = []
        a = r.start(Encoded(xa, lengths), 1, 10)
        out.append(r.decode_step(a, tok([1, 4], [3, 3], [5, 60], [8, 2])))  # the prompt: eager
        out.append(r.decode_step(a, tok([11], [12], [13], [14])))  # a step: 4 rows, the slot of 4
        a = r.reorder(a, tok(0, 3, 2))  # a row done: 3 rows, in place in the same slot
        assert a.caches[0][0].shape[0] == a.cross[0][0].shape[0] == a.cross_lengths.shape[0] == 3
        out.append(r.decode_step(a, tok([50], [0], [96])))
        a = r.reorder(a, tok(0, 2))  # another: 2 rows, another slot
        out.append(r.decode_step(a, tok([7], [8])))
        a = r.reorder(a, tok(1, 0))  # beams swapped: in place
        out.append(r.decode_step(a, tok([9], [10])))
        b = r.start(Encoded(other, None), 1, 6)  # another state takes the slot of 2 while `a` lives
        out.append(r.decode_step(b, tok([2, 5], [6, 1])))
        out.append(r.decode_step(b, tok([14], [15])))
        out.append(r.decode_step(a, tok([16], [17])))  # `a` takes it back
        out.append(r.decode_step(b, tok([18], [19])))
        a = r.rewind(a, 5)  # a draft checked again: rewind, then several tokens at once
        out.append(r.decode_step(a, tok([20, 21], [22, 23]), last_only=False))
        out.append(r.decode_step(a, tok([24], [25])))
        a = r.reorder(a, tok(1))  # one row left: the slot of 1
        out.append(r.decode_step(a, tok([26])))
        return out

    want, got = run(plain), run(slots)
    assert len(want) == len(got) == 12
    for i, (w, o) in enumerate(zip(want, got)):
        assert w.shape == o.shape, i
        _close(o.float().cpu(), w.float().cpu())
    assert slots.slot_rows == [1, 2, 4]
    if DEVICE != "cpu":
        assert CapturedStep.failed == 0


@torch.inference_mode()
def test_unfused_steps_by_request_give_the_fused_steps_logits():
    """fused=False keeps the model's own step on the slots (the reference of the fused one), saying so; the kernel
    set 'torch' has no fused kernels. Same logits either way."""
    w, g = _weights()
    dev = torch.device(DEVICE)
    runners = [TritonASRRunner(w, dev, torch.float32, capture=DEVICE != "cpu", fused=f) for f in (True, False)]
    assert runners[1].fused_why == "off by request (fused=False)" and runners[1].fused_ops is None
    assert "not Triton" in TritonASRRunner(w, dev, torch.float32, capture=False, kernels="torch").fused_why
    xa = torch.randn(2, 9, CFG.n_text_state, generator=g).to(dev)
    out = []
    for r in runners:  # two single-token steps from the start (no prompt pass), rows of different encoder lengths
        a = r.start(Encoded(xa, torch.tensor([9, 5], device=dev)), 1, 6)
        out.append([r.decode_step(a, torch.tensor(t, device=dev)) for t in ([[7], [8]], [[10], [11]])])
    for f, u in zip(*out):
        torch.testing.assert_close(f, u, rtol=1e-4, atol=1e-4)


@torch.inference_mode()
def test_a_state_moved_off_its_slot_keeps_its_rows():
    """A state bound to a slot that another takes gets its own copies: the slot's later steps do not touch it."""
    _, slots, g = _runners()
    dev = slots.device
    xa = torch.randn(2, 8, CFG.n_text_state, generator=g).to(dev)
    a = slots.start(Encoded(xa, None), 1, 6)
    slots.decode_step(a, torch.tensor([[1, 2], [3, 4]], device=dev))
    slots.decode_step(a, torch.tensor([[5], [6]], device=dev))
    slot = a.bound
    assert slot is not None and slot.holds(a) and a.cross_lengths.tolist() == [8, 8]
    kept = [k.clone() for k, _ in a.caches]
    b = slots.start(Encoded(xa.flip(0), None), 1, 6)
    slots.decode_step(b, torch.tensor([[7, 8], [9, 10]], device=dev))
    slots.decode_step(b, torch.tensor([[11], [12]], device=dev))
    assert a.bound is None and slot.holds(b) and not slot.holds(a)
    for k, before in zip((k for k, _ in a.caches), kept):
        assert torch.equal(k, before)


@torch.inference_mode()
def test_prompt_passes_of_every_width_give_the_plain_runners_logits():
    """A prompt pass from position 0 runs on its slot with the tokens padded to a width bucket (8, 16 here: the
    decoder's context is 16): every position's logits, the last one's, and the steps after it equal the plain
    runner's, whatever padding the earlier, wider passes left in the buffers."""
    plain, slots, g = _runners()
    dev = plain.device
    xa = torch.randn(3, 9, CFG.n_text_state, generator=g).to(dev)
    lengths = torch.tensor([9, 5, 7], device=dev)
    for t in (13, 2, 16):  # widths 16, 8, 16: fresh buckets, then one reused with the whole context
        toks = torch.randint(0, CFG.n_vocab, (3, t), generator=g).to(dev)
        nxt = torch.randint(0, CFG.n_vocab, (3, 1), generator=g).to(dev)
        got = []
        for r in (plain, slots):
            m = 2 if t % 2 else 3  # on odd token counts 2 rows: another slot
            a, b = r.start(Encoded(xa, lengths), 1, 16), r.start(Encoded(xa[:m], lengths[:m]), 1, 16)
            every = r.decode_step(a, toks, last_only=False)
            step = r.decode_step(a, nxt) if t < 16 else None
            last = r.decode_step(b, toks[:m])
            got.append((every, step, last))
        (we, ws, wl), (oe, os_, ol) = got
        assert oe.shape == (3, t, CFG.n_vocab) and ol.shape == wl.shape
        _close(oe.cpu(), we.cpu())
        _close(ol.cpu(), wl.cpu())
        if t < 16:
            _close(os_.cpu(), ws.cpu())
    assert slots.prompt_widths == {2: [16], 4: [8, 16]}
    if DEVICE != "cpu":
        assert CapturedStep.failed == 0


@torch.inference_mode()
def test_warm_graphs_makes_every_width_and_keeps_a_bound_states_rows():
    plain, slots, g = _runners()
    dev = plain.device
    xa = torch.randn(2, 8, CFG.n_text_state, generator=g).to(dev)
    toks, nxt = torch.tensor([[1, 2, 3], [4, 5, 6]], device=dev), torch.tensor([[7], [8]], device=dev)
    states = [r.start(Encoded(xa, None), 1, 8) for r in (plain, slots)]
    for r, s in zip((plain, slots), states):
        r.decode_step(s, toks)
    assert states[1].bound is not None
    slots.warm_graphs()  # runs every width over the slot's buffers: the state bound to it gets its own copies
    assert slots.prompt_widths == {2: [8, 16]} and states[1].bound is None
    _close(slots.decode_step(states[1], nxt).cpu(), plain.decode_step(states[0], nxt).cpu())
