"""`python -m benchmarks.grammar_engines`: the per-token cost of constrained decoding's grammar engines at the
embedded model's vocabulary (SmolLM2, 49152 tokens) on this CPU: llguidance (speechrt's), xgrammar and outlines-core
(those two if installed: pip install xgrammar outlines-core).

Each engine compiles one JSON schema of a few fields, then walks the tokens of a valid answer: at each token its
mask of the allowed next tokens (the engine's own call, into a 32-bit bitmask), then the mask applied to a row of
logits as speechrt applies it (pipelines/grammar.py: unpacked, times -1e30, added), then the token accepted. Times
per token: the median and the best of `--rounds` walks, the mask alone and with its application; the compile time
of the schema (the first, cold) beside them. One thread.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
import torch

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "city": {"type": "string", "enum": ["Paris", "London", "Berlin"]},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["name", "age", "city", "tags"],
    "additionalProperties": False,
}
ANSWER = {
    "name": "Ada Lovelace the first programmer",
    "age": 36,
    "city": "London",
    "tags": ["math", "engines", "poetry"],
}


def apply(logits: torch.Tensor, words: np.ndarray, vocab: int) -> None:
    """speechrt's application of a bitmask to a row of logits (grammar.Constraint.penalty + mask_rows)."""
    banned = np.unpackbits(~words.view(np.uint8), bitorder="little")[:vocab]
    logits.add_(torch.from_numpy(banned).float().mul_(-1e30))


def walk(make, mask, take, ids, rounds: int, vocab: int, words: np.ndarray):
    """-> (compile s, cold compile s, mask us median, best, mask+apply us median, best) per token."""
    compile_s, alone, applied = [], [], []
    for r in range(rounds):
        t0 = time.perf_counter()
        m = make()
        compile_s.append(time.perf_counter() - t0)
        logits = torch.randn(vocab)
        with_apply = r % 2 == 1
        t0 = time.perf_counter()
        for t in ids:
            w = mask(m)
            if with_apply:
                apply(logits, w if w is not None else words, vocab)
            take(m, t)
        (applied if with_apply else alone).append((time.perf_counter() - t0) / len(ids) * 1e6)
    return (
        min(compile_s[1:]),
        compile_s[0],
        statistics.median(alone),
        min(alone),
        statistics.median(applied),
        min(applied),
    )


def engines(tok, vocab: int, stops: list[int]):
    """(name, version, make(), mask(matcher) -> words or None, take(matcher, token)) of each installed engine."""
    import llguidance as llg

    from speechrt.pipelines.grammar import JSON_STYLE

    words = np.full((vocab + 31) // 32, -1, dtype=np.int32)
    schema = json.dumps({**SCHEMA, "x-guidance": JSON_STYLE})
    lt = llg.LLTokenizer(tok.to_json(), n_vocab=vocab, eos_token=stops)
    g = llg.LLMatcher.grammar_from_json_schema(schema)

    def llg_mask(m):
        m.unsafe_compute_mask_ptr(words.ctypes.data, words.nbytes)
        return words

    yield "llguidance", _version("llguidance"), lambda: llg.LLMatcher(lt, g), llg_mask, lambda m, t: m.consume_token(t)
    try:
        import xgrammar as xgr
    except ImportError:
        print("xgrammar: not installed (pip install xgrammar)")
    else:
        raw = [tok.token_bytes(i) for i in range(vocab)]
        info = xgr.TokenizerInfo(raw, xgr.VocabType.RAW, vocab_size=vocab, stop_token_ids=stops)
        compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        bm = xgr.allocate_token_bitmask(1, vocab)

        def xg_make():
            return xgr.GrammarMatcher(compiler.compile_json_schema(json.dumps(SCHEMA), any_whitespace=False))

        def xg_mask(m):
            m.fill_next_token_bitmask(bm)
            return bm[0].numpy()

        yield "xgrammar", _version("xgrammar"), xg_make, xg_mask, lambda m, t: m.accept_token(t)
    try:
        from outlines_core import Guide, Index, Vocabulary
        from outlines_core.json_schema import build_regex_from_schema
    except ImportError:
        print("outlines-core: not installed (pip install outlines-core)")
    else:
        ow = np.zeros_like(words)
        by_bytes: dict[bytes, list[int]] = {}
        for i in range(vocab):
            b = tok.token_bytes(i)
            if b and i not in stops:
                by_bytes.setdefault(b, []).append(i)
        voc = Vocabulary(stops[0], by_bytes)
        rx = build_regex_from_schema(json.dumps(SCHEMA), r"[ ]?")

        def oc_mask(m):
            m.write_mask_into(ow.ctypes.data, ow.size, 4)
            return ow

        # (its Index is the compiled schema: made per walk, as the others compile theirs)
        yield (
            "outlines-core",
            _version("outlines-core"),
            lambda: Guide(Index(rx, voc)),
            oc_mask,
            lambda m, t: m.advance(t),
        )


def batcher_path(lm, ids, rounds: int) -> tuple[float, float]:
    """speechrt's own per-token path (lm_batching._take for a row with a grammar: grammar.mask_rows, the argmax, the
    token taken) and the argmax alone, over the tokens of `ids` -> (us per token with, without), medians."""
    from speechrt.pipelines.grammar import Grammar, mask_rows

    g, vocab = Grammar.json_schema(SCHEMA), lm.config.vocab_size
    logits = torch.randn(1, vocab)
    with_g, without = [], []
    for _ in range(rounds):
        c = g.constraint(lm.tokenizer, vocab)
        t0 = time.perf_counter()
        for t in ids:
            mask_rows(logits, [c]).argmax(-1).tolist()
            c.take(t)
        t1 = time.perf_counter()
        for _t in ids:
            logits.argmax(-1).tolist()
        t2 = time.perf_counter()
        with_g.append((t1 - t0) / len(ids) * 1e6)
        without.append((t2 - t1) / len(ids) * 1e6)
    return statistics.median(with_g), statistics.median(without)


def _version(dist: str) -> str:
    from importlib.metadata import version

    return version(dist)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=21, help="walks per engine (odd ones apply the mask) (default 21)")
    args = p.parse_args(argv)
    import subprocess

    import speechrt

    torch.set_num_threads(1)
    lm = speechrt.load_lm(backend="torch")
    tok, vocab = lm.tokenizer, lm.config.vocab_size
    text = json.dumps(ANSWER)  # (json.dumps writes the ', ' and ': ' that speechrt's JSON style asks for)
    ids = tok.encode(text, add_bos=False)
    cpu = next(
        (
            ln.split(":", 1)[1].strip()
            for ln in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines()
            if ln.startswith("Model name")
        ),
        "?",
    )
    print(f"{cpu}; vocabulary {vocab}; an answer of {len(ids)} tokens; {args.rounds} walks; 1 thread")
    print(
        f"{'engine':22} {'compile ms':>10} {'(cold)':>8} {'mask us/token':>14} {'(best)':>7} "
        f"{'+ apply':>8} {'(best)':>7}"
    )
    words = np.full((vocab + 31) // 32, -1, dtype=np.int32)
    for name, ver, make, mask, take in engines(tok, vocab, list(tok.stop_ids())):
        c, cold, mm, mb, am, ab = walk(make, mask, take, ids, args.rounds, vocab, words)
        print(f"{name + ' ' + ver:22} {c * 1e3:10.2f} {cold * 1e3:8.1f} {mm:14.1f} {mb:7.1f} {am:8.1f} {ab:7.1f}")
    w, wo = batcher_path(lm, ids, args.rounds)
    print(f"speechrt's path (mask_rows, argmax, token taken): {w:.0f} us per token; the argmax alone {wo:.0f} us")


if __name__ == "__main__":
    main()
