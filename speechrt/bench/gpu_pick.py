"""`bench gpu --checks asr-pick`: the timing of Whisper's greedy pick (the logit rules, argmax and log-probability after
each decode step, kernels/triton_whisper_pick.py) at batch 1 and 8 over Whisper's vocabulary: the split launch (each
row's vocabulary over several programs, merged by the row's last chunk: the launcher's choice for few rows), the same
with twice the chunks, the split merged by a second launch (as on ROCm), one program a row, and the torch reference
ops; each from a CUDA graph of REPS picks (a decode loop's setting: no launch cost from Python; a capture that fails
is a problem, as in the loop), with the same ids checked; and the one-launch merge's memory ordering (ORDER_TRIALS
calls right after NaN-filled blocks were freed, against the second launch). `run_picks()` runs wherever the kernels
run (the tests: the interpreter, uncaptured, a small vocabulary); `check_asr_pick()` on the device (with `--device
cpu` the torch ops only). Random logits: no model is loaded."""

from __future__ import annotations

import statistics

from speechrt.bench.record import Record, Repeats, Results

REPS = 16  # picks per graph replay
ROWS = (1, 8)
VOCAB = 51864  # Whisper tiny.en's (multilingual: 51865)
VARIANTS = ("split", "split-2x", "split-two-launch", "one-program", "torch")
ORDER_TRIALS = 20


def _inputs(n: int, V: int, device):
    """A pick's arguments: random logits [n, V] (half the rows' timestamps boosted: the forced rule decides),
    Whisper-like suppression, rows in every rule state (text so far, an open pair, a closed pair, one token)."""
    import torch

    g = torch.Generator().manual_seed(n)
    tb = V - 1501
    x = torch.randn(n, V, generator=g) * 3
    x[::2, tb:] += 4
    sup = torch.zeros(V, dtype=torch.bool)
    sup[torch.randint(0, tb, (90,), generator=g)] = True
    sup[tb - 1] = True  # <|notimestamps|>
    states = [[7, 9, tb + 40, 5], [tb + 50, 9, tb + 50, 6], [tb + 50, tb + 50, tb + 50, 7], [tb, -1, tb, 1]]
    st = torch.tensor([states[i % 4] for i in range(n)]).T.contiguous()
    return x.to(device), sup.to(device), st.to(device), True, tb, tb - 107  # the timestamp rules on


def picks(n: int, V: int, device, triton: bool = True) -> dict:
    """variant -> (pick(): (ids, log-probabilities), chunks a row) on fixed inputs; the Triton ones only with
    `triton`."""
    from speechrt.kernels.reference_pick import whisper_pick as reference

    args = _inputs(n, V, device)
    fns = {"torch": (lambda: reference(*args), 0)}
    if triton:
        from speechrt.kernels.triton_decode_attention import multiprocessors
        from speechrt.kernels.triton_whisper_pick import split_config, whisper_pick

        k = split_config(n, V, multiprocessors(device))["CHUNKS"]  # the launcher's choice
        fns["split"] = (lambda: whisper_pick(*args), k)
        fns["split-2x"] = (lambda: whisper_pick(*args, chunks=2 * k), split_config(n, V, 0, 2 * k)["CHUNKS"])
        fns["split-two-launch"] = (lambda: whisper_pick(*args, one_launch=False), k)
        fns["one-program"] = (lambda: whisper_pick(*args, chunks=1), 1)
    return fns


def _times(fn, timer, capture: bool) -> list[float]:
    """Seconds per call of fn: REPS calls replayed from one graph (`capture`), else one call at a time."""
    if not capture:
        return timer(fn)
    from speechrt.backends.cuda_graphs import CapturedStep

    def many():
        for _ in range(REPS - 1):
            fn()
        return fn()[0]

    step = CapturedStep(many)
    step()
    if step.graph is None:
        raise RuntimeError("the pick's CUDA graph capture failed")
    return [t / REPS for t in timer(step.graph.replay)]


def ordering(one, two, device, label: str, trials: int | None = None) -> list[str]:
    """The split pick merged in its launch (`one`) against the second launch (`two`), `trials` times on poisoned
    buffers (gpu_merge.merge_trials: a merge that reads a chunk's state before it is written picks another id or
    gives NaN) -> problems; the merge counters must be back at 0."""
    import torch

    from speechrt.bench.gpu_merge import counters_left, merge_trials, problems

    def same(got, want):  # the same ids; the log-probabilities summed by other warps (within rounding)
        return torch.equal(got[0], want[0]) and torch.allclose(got[1], want[1], rtol=1e-5, atol=1e-5)

    trials = trials or ORDER_TRIALS
    return problems(label, merge_trials(one, two, same, device, trials, (1 << 16,) * 8), trials, counters_left(device))


def run_picks(device, out: Results, timer, vocab=VOCAB, rows=ROWS, capture=True, triton=True) -> tuple[list, list]:
    """Every variant timed at each batch in `rows` (records in `out`) -> (a line a batch, problems: a Triton variant
    whose ids differ from the torch ops' or log-probabilities beyond 1e-4)."""
    import torch

    lines, bad = [], []
    for n in rows:
        fns = picks(n, vocab, device, triton)
        want_ids, want_lp = fns["torch"][0]()
        times = {}
        for v, (fn, _) in fns.items():
            ids, lp = fn()
            if not torch.equal(ids, want_ids) or not torch.allclose(lp, want_lp, rtol=1e-4, atol=1e-4):
                bad.append(f"pick batch {n} {v}: other ids or log-probabilities than the torch ops")
            times[v] = _times(fn, timer, capture)
        if triton:
            bad += ordering(fns["split"][0], fns["split-two-launch"][0], device, f"pick batch {n}")
        base = statistics.median(times["split" if triton else "torch"])
        for v, ts in times.items():
            t = statistics.median(ts)
            out.records.append(
                Record(
                    family="gpu",
                    model="whisper-pick",
                    engine="speechrt",
                    backend="torch" if v == "torch" else "triton",
                    precision="float32",
                    device=str(device),
                    workload=f"Whisper greedy pick (logit rules, argmax), batch {n}, vocabulary {vocab}, {v}",
                    metric="us_per_pick",
                    unit="us",
                    value=t * 1e6,
                    better="lower",
                    repeats=Repeats.of([x * 1e6 for x in ts]),
                    peer="" if v == "split" else "split",
                    params={"rows": n, "variant": v, "chunks": fns[v][1], "vs_split": t / base, "graph": capture},
                )
            )
        if triton:
            others = ", ".join(f"{v} {statistics.median(times[v]) / base:.2f}x" for v in VARIANTS[1:])
            lines.append(f"pick batch {n}: split ({fns['split'][1]} chunks) {base * 1e6:.1f} us, {others}")
        else:
            lines.append(f"pick batch {n}: torch ops {base * 1e6:.0f} us (the Triton launches: on a GPU)")
    return lines, bad


def check_asr_pick(dev, out: Results):
    """-> (status, detail): fail where a pick launch gives other ids than the torch ops, or its one-launch merge
    differs from the second launch."""
    import torch

    from speechrt.backends.threads import cpu_threads
    from speechrt.bench.roofline import timer

    gpu = dev.type == "cuda"
    with torch.inference_mode(), cpu_threads(1 if not gpu else None):
        lines, bad = run_picks(dev, out, timer(dev), capture=gpu, triton=gpu)
    if bad:
        return "fail", "; ".join(bad + lines)
    return "pass", "same ids (the pick launches and the torch ops): " + "; ".join(lines)
