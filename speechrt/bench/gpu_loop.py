"""`bench gpu --checks lm-loop`: the language model's decode loop on the device (backends/decode_loop.py)
against one step per replay: greedy tokens per second at batch 1 and 8 with blocks of K = 1, 8 and 16 steps
(SmolLM2-135M bf16 from graphs on a GPU, 64 tokens: K = 16 halves the host's work per token against K = 8, the
default, ContinuousBatcher.block; float32 uncaptured with `--device cpu`, 16 tokens, K = 1 and 8), and the same ids;
and replies forced into loops end by the repetition stop at the same token in both (the stop on the device,
backends/token_repeats.py)."""

from __future__ import annotations

import statistics
import time
from functools import partial

from speechrt.backends.threads import cpu_threads
from speechrt.bench.record import Repeats, Results, gpu_record

CHATS = ["What is the capital of France?", "Count to ten.", "Name three colours.", "Say hello in Spanish."]


def _sync(dev) -> None:
    import torch

    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def generate(runner, tokenizer, prompts: list[list[int]], tokens: int, block: int, dev) -> tuple[list, float]:
    """Greedy replies of `tokens` tokens (no stop) to `prompts` at once, in blocks of `block` decode steps ->
    (the ids per prompt, seconds the decode steps took after the prompts' prefill)."""
    from speechrt.pipelines.generation import GenerationOptions
    from speechrt.pipelines.lm_batching import ContinuousBatcher, LMRequest

    o = GenerationOptions(max_tokens=tokens, stop_token_ids=(), stop_repeats=0)
    seq = max(map(len, prompts)) + tokens + 1
    b = ContinuousBatcher(runner, tokenizer, max_batch=len(prompts), max_seq=seq, block=block)
    ids = [[] for _ in prompts]
    for i, p in enumerate(prompts):
        b.submit(LMRequest(list(p), o, lambda piece, i=i: ids[i].append(piece.token)))
    b.admit(all_pending=True)
    _sync(dev)
    t = time.perf_counter()
    while b.has_work():
        b.decode()
    _sync(dev)
    return ids, time.perf_counter() - t


def looped(runner, tokenizer, prompts: list[list[int]], block: int) -> list[tuple[list[int], str]]:
    """Replies to `prompts` forced into loops (one token biased far above the rest; or three, the most used
    penalized, so that they cycle) with the repetition stop on, in blocks of `block` steps -> each reply's ids
    and finish reason."""
    from speechrt.pipelines.generation import GenerationOptions
    from speechrt.pipelines.lm_batching import ContinuousBatcher, LMRequest

    opts = [
        GenerationOptions(max_tokens=40, stop_token_ids=(), stop_repeats=2, logit_bias={40: 100.0}),
        GenerationOptions(
            max_tokens=40,
            stop_token_ids=(),
            stop_repeats=3,
            logit_bias={t: 100.0 for t in (40, 41, 42)},
            frequency_penalty=2.0,
        ),
    ]
    b = ContinuousBatcher(runner, tokenizer, max_batch=len(prompts), max_seq=max(map(len, prompts)) + 41, block=block)
    ids, reasons = [[] for _ in prompts], [""] * len(prompts)

    def emit(i, piece):
        ids[i].append(piece.token)
        reasons[i] = piece.finish_reason or ""

    for i, p in enumerate(prompts):
        b.submit(LMRequest(list(p), opts[i % len(opts)], partial(emit, i)))
    while b.has_work():
        b.step()
    return list(zip(ids, reasons))


def compare_blocks(
    runner, tokenizer, prompts, dev, out: Results, model: str, precision: str, tokens=64, repeats=3, blocks=(1, 8)
):
    """Tokens per second of K = each of `blocks` (the first 1) at batch 1 and len(prompts), records added to `out`
    -> (status, detail): fail where the ids differ."""
    lines, bad = [], []
    for batch in sorted({1, len(prompts)}):
        ps = [prompts[i % len(prompts)] for i in range(batch)]
        speed, ref = {}, None
        for k in blocks:
            generate(runner, tokenizer, ps, tokens, k, dev)  # captures the graphs
            runs = [generate(runner, tokenizer, ps, tokens, k, dev) for _ in range(repeats)]
            ids = runs[0][0]
            ref = ref or ids
            if ids != ref:
                bad.append(f"the greedy ids differ at batch {batch}, K={k}")
            rates = [batch * (tokens - 1) / s for _, s in runs]
            speed[k] = statistics.median(rates)
            out.records.append(
                gpu_record(
                    model=model,
                    precision=precision,
                    device=str(dev),
                    workload=f"LM greedy decode, batch {batch}, {tokens} tokens, {k} steps per replay",
                    metric="tokens_per_s",
                    unit="tok/s",
                    value=speed[k],
                    better="higher",
                    repeats=Repeats.of(rates),
                    peer="" if k == 1 else "1 step per replay",
                    params={"batch": batch, "steps_per_replay": k},
                )
            )
        more = ", ".join(f"K={k} {speed[k]:.3g} ({speed[k] / speed[1]:.2f}x)" for k in blocks[1:])
        lines.append(f"batch {batch}: K=1 {speed[1]:.3g} tok/s, {more}")
    loops = looped(runner, tokenizer, prompts, 1)
    if looped(runner, tokenizer, prompts, 8) != loops:
        bad.append("replies forced into loops end elsewhere (the repetition stop)")
    if "repetition" not in {r for _, r in loops}:
        bad.append("replies forced into loops: none ended by the repetition stop")
    if bad:
        return "fail", "blocks of K steps against one step per replay: " + "; ".join(bad)
    lines.append(f"{sum(r == 'repetition' for _, r in loops)} of {len(loops)} forced loops stopped alike")
    return "pass", f"blocks of K steps a replay, same greedy ids ({precision}): " + "; ".join(lines)


def check_lm_loop(dev, out: Results):
    from speechrt.models import registry
    from speechrt.pipelines.lm import load_lm

    size = dict(tokens=64, repeats=3, blocks=(1, 8, 16))
    if dev.type == "cuda":
        lm = load_lm(None, "triton", str(dev), "bfloat16")
        runner, precision = lm.runner, "bfloat16"
    else:  # the same path uncaptured, on the reference kernels (what the CPU tests check); shorter
        size = dict(tokens=16, repeats=1, blocks=(1, 8))
        from speechrt.backends.torch.lm import load_file
        from speechrt.backends.triton.lm import TritonLMRunner
        from speechrt.pipelines.lm import LMPipeline

        rm = registry.resolve(None, "lm")
        runner = TritonLMRunner(load_file(rm), dev, "float32", "torch", capture=False)
        lm, precision = LMPipeline(runner, rm.name), "float32"
    prompts = [lm.encode_chat(c) for c in CHATS] * 2  # batch 8
    # one CPU thread: two-thread OpenMP regions stall where other processes share the cores (backends/threads.py)
    with cpu_threads(1 if dev.type == "cpu" else None):
        return compare_blocks(runner, lm.tokenizer, prompts, dev, out, lm.info.model, precision, **size)
