"""The one-launch merges' memory-ordering trials, shared by `bench gpu`'s checks of decode attention
(gpu_attention), the fused ops' K splits (gpu_fused) and Whisper's split pick (gpu_pick): the merge in its launch
against its second launch on partial buffers poisoned beforehand, and the merge counters read back."""

from __future__ import annotations

from collections.abc import Sequence


def merge_trials(one, two, same, device, trials: int, poison: Sequence[int]) -> int:
    """How many of `trials` calls of `one` (a merge in its launch) disagree with `two` (its second launch, called
    once) by `same(got, want)`, each call right after NaN-filled blocks of `poison`'s sizes (floats) were freed (the
    caching allocator usually hands them to the next partial buffers: a merge that reads a split's partials before
    they are written gives NaN or a wrong value)."""
    import torch

    want, wrong = two(), 0
    for _ in range(trials):
        blocks = [torch.full((n,), float("nan"), device=device) for n in poison]
        del blocks
        wrong += not same(one(), want)
    return wrong


def counters_left(device) -> int:
    """The largest merge counter left on `device` (0 after merges that worked), the counters then put back to 0 (a
    broken merge's leftovers would stall the merges of the checks after it)."""
    import torch

    from speechrt.kernels.triton_decode_attention import counters

    cnt = counters(torch.device(device), 1)
    left = int(cnt.abs().max().item())
    cnt.zero_()
    return left


def problems(label: str, wrong: int, trials: int, left: int) -> list[str]:
    """The lines a check reports for `wrong` of `trials` calls that differed and counters `left` above 0."""
    out = [f"{label}: the one-launch merge differs from the second launch in {wrong} of {trials} calls"] * (wrong > 0)
    return out + ([f"{label}: merge counters left at {left}, not 0"] if left else [])
