"""`speechrt bench lm`: language-model time to first token and decode speed, ours vs llama.cpp vs transformers.

All engines run in this one process, on the same GGUF, the same token ids (chat prompts rendered by the
model's own template), the same thread count, greedy decoding of a fixed number of tokens (stop tokens
ignored so every engine does the same work). Batch B runs B different prompts together:

- ours: `models.generate.stream` (the real generation loop: B prefills into B cache slots, then one
  batched decode step per token, detokenizing as it goes);
- llama.cpp (`llama-cpp-python`): one `llama_decode` with all B prompts as B sequences, then one
  `llama_decode` per step with B tokens; greedy argmax over its logits;
- transformers (`AutoModelForCausalLM.from_pretrained(dir, gguf_file=...)`, float32 as it dequantizes):
  `generate()` on the left-padded batch; TTFT is a 1-token generate, decode rate is the rest.

TTFT is from token ids to the first sampled token of every sequence of the batch; decode tok/s counts
every sequence's tokens after the first (aggregate over the batch). Each measurement is repeated and
the best run is kept (the machine may be shared); engines take turns within each repeat.
"""
from __future__ import annotations

import os
import statistics
import sys
import time
from dataclasses import dataclass

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain photosynthesis in one sentence.",
    "List three uses of copper.",
    "Who wrote Pride and Prejudice?",
    "Give me a tip for learning to cook.",
    "What is 12 times 7?",
    "Describe a cat to someone who has never seen one.",
]


def add_arguments(p):
    p.add_argument("--model", default=None, help="registry name or .gguf path (default: smollm2-135m-instruct)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads for every engine (default: all cores)")
    p.add_argument("--tokens", type=int, default=64, help="tokens generated per sequence (default 64)")
    p.add_argument("--batch", default="1,8", help="comma-separated batch sizes (default 1,8; at most 8)")
    p.add_argument("--repeats", type=int, default=3, help="runs per measurement; the best is kept (default 3)")
    p.add_argument("--dtype", default=None, help="our weight format: int8, bfloat16, float32 (default: int8 on CPU)")
    p.add_argument("--device", default="cpu", help="our device (default cpu; peers run on the CPU)")
    p.add_argument("--peers", default="llama.cpp,transformers",
                   help="peers to run if installed, comma-separated from: llama.cpp, transformers; '' for none")
    p.add_argument("--llama-extra-bufts", action="store_true",
                   help="let llama.cpp use its extra (AMX/repacked) weight buffers; off by default because the "
                        "prebuilt wheel's AMX path dies with SIGILL on CPUs/VMs that do not enable AMX tiles")


@dataclass
class Row:
    engine: str
    batch: int
    ttft: float  # seconds
    decode_tps: float  # tokens/s over the whole batch
    note: str = ""


class Ours:
    name = "speechrt"

    def __init__(self, model, device, dtype, threads):
        import torch

        from speechrt.lm import load_lm

        torch.set_num_threads(threads)
        self.lm = load_lm(model, device=device, dtype=dtype)
        self.note = f"torch {torch.__version__}, {self.lm.runner.weight_format} on {self.lm.runner.device}"

    def run(self, prompts, n):
        from speechrt.models.generate import GenerationOptions, stream

        o = GenerationOptions(max_tokens=n, stop_token_ids=())
        B = len(prompts)
        cache = self.lm.runner.new_cache(B, max(len(p) for p in prompts) + n)
        got, t_first = 0, None
        t0 = time.perf_counter()
        for ev in stream(self.lm.runner, self.lm.tokenizer, prompts, o, cache=cache):
            got += 1
            if got == B:
                t_first = time.perf_counter()
        t1 = time.perf_counter()
        assert got == B * n, (got, B, n)
        return t_first - t0, B * (n - 1) / (t1 - t_first)


class LlamaCpp:
    name = "llama.cpp"

    def __init__(self, path, threads, max_batch, n_ctx, extra_bufts):
        import llama_cpp as L
        import llama_cpp.llama as LL
        import numpy as np

        self.L, self.np = L, np
        mp0, cp0 = LL.llama_cpp.llama_model_default_params, LL.llama_cpp.llama_context_default_params

        def mp():
            p = mp0()
            p.use_extra_bufts = extra_bufts
            return p

        def cp():
            p = cp0()
            p.n_seq_max = max_batch
            p.kv_unified = True  # the n_ctx cells are shared by all sequences
            return p
        LL.llama_cpp.llama_model_default_params, LL.llama_cpp.llama_context_default_params = mp, cp
        try:
            self.llm = L.Llama(str(path), n_threads=threads, n_threads_batch=threads, n_ctx=n_ctx, n_batch=512,
                               n_ubatch=512, verbose=False)
        finally:
            LL.llama_cpp.llama_model_default_params, LL.llama_cpp.llama_context_default_params = mp0, cp0
        self.ctx = self.llm._ctx.ctx
        self.n_vocab = self.llm.n_vocab()
        self.batch = L.llama_batch_init(512, 0, max_batch)
        self.note = f"llama-cpp-python {L.__version__}, GGUF as stored" + ("" if extra_bufts else ", no extra bufts")

    def _decode(self, entries):
        b = self.batch
        b.n_tokens = len(entries)
        for i, (t, p, s, lg) in enumerate(entries):
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = t, p, 1, lg
            b.seq_id[i][0] = s
        rc = self.L.llama_decode(self.ctx, b)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")

    def _argmax(self, i):
        ptr = self.L.llama_get_logits_ith(self.ctx, i)
        return int(self.np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).argmax())

    def run(self, prompts, n):
        L = self.L
        L.llama_memory_clear(L.llama_get_memory(self.ctx), True)
        B = len(prompts)
        t0 = time.perf_counter()
        entries, outs = [], []
        for s, p in enumerate(prompts):  # all prompts in one batch: B sequences
            for j, t in enumerate(p):
                last = j == len(p) - 1
                if last:
                    outs.append(len(entries))
                entries.append((t, j, s, last))
        self._decode(entries)
        toks = [self._argmax(i) for i in outs]
        t1 = time.perf_counter()
        pos = [len(p) for p in prompts]
        for _ in range(n - 1):
            self._decode([(toks[s], pos[s], s, True) for s in range(B)])
            toks = [self._argmax(s) for s in range(B)]
            pos = [q + 1 for q in pos]
        t2 = time.perf_counter()
        return t1 - t0, B * (n - 1) / (t2 - t1)


class Transformers:
    name = "transformers"

    def __init__(self, path, threads):
        import torch
        import transformers
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(threads)
        self.torch = torch
        self.model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name).eval()
        self.note = f"transformers {transformers.__version__}, {self.model.dtype} (dequantized GGUF)"

    def _gen(self, ids, mask, n):
        return self.model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n,
                                   do_sample=False, pad_token_id=0)

    def run(self, prompts, n):
        torch = self.torch
        T = max(len(p) for p in prompts)
        ids = torch.tensor([[0] * (T - len(p)) + list(p) for p in prompts])  # left padding
        mask = torch.tensor([[0] * (T - len(p)) + [1] * len(p) for p in prompts])
        B = len(prompts)
        with torch.inference_mode():
            t0 = time.perf_counter()
            self._gen(ids, mask, 1)
            t1 = time.perf_counter()
            self._gen(ids, mask, n)
            t2 = time.perf_counter()
        ttft = t1 - t0
        return ttft, B * (n - 1) / max(t2 - t1 - ttft, 1e-9)


def run(args):
    from speechrt.errors import UserError
    from speechrt.models import registry

    threads = args.threads or os.cpu_count() or 1
    try:
        batches = [int(b) for b in args.batch.split(",") if b.strip()]
    except ValueError:
        raise UserError(f"--batch must be comma-separated integers, got {args.batch!r}") from None
    if not batches or any(b < 1 or b > len(PROMPTS) for b in batches):
        raise UserError(f"--batch sizes must be between 1 and {len(PROMPTS)}, got {args.batch!r}")
    if args.tokens < 2 or args.repeats < 1:
        raise UserError("--tokens must be >= 2 and --repeats >= 1")
    peers = [p.strip() for p in args.peers.split(",") if p.strip()]
    bad = [p for p in peers if p not in ("llama.cpp", "transformers")]
    if bad:
        raise UserError(f"unknown peer(s) {', '.join(bad)}; valid: llama.cpp, transformers")
    rm = registry.resolve(args.model, "slm")

    print(f"speechrt bench lm: {rm.name} ({rm.path})")
    print(f"threads {threads}, {args.tokens} tokens per sequence, greedy, best of {args.repeats}")
    ours = Ours(args.model, args.device, args.dtype, threads)
    prompts = [ours.lm.encode_chat(p) for p in PROMPTS]
    engines = [ours]
    notes = {}
    if "llama.cpp" in peers:
        if rm.format != "gguf":
            notes["llama.cpp"] = "skipped: needs a GGUF model"
        else:
            try:
                engines.append(LlamaCpp(rm.path, threads, max(batches),
                                        max(batches) * (max(len(p) for p in prompts) + args.tokens) + 64,
                                        args.llama_extra_bufts))
            except ImportError:
                notes["llama.cpp"] = "skipped: not installed (pip install llama-cpp-python)"
    if "transformers" in peers:
        if rm.format != "gguf":
            notes["transformers"] = "skipped: this bench loads the GGUF with gguf_file="
        else:
            try:
                engines.append(Transformers(rm.path, threads))
            except ImportError as e:
                notes["transformers"] = f"skipped: {e} (pip install transformers accelerate)"
    for e in engines:
        print(f"  {e.name:13} {e.note}")
    for k, v in notes.items():
        print(f"  {k:13} {v}")
    sys.stdout.flush()

    rows: list[Row] = []
    for B in batches:
        ps = prompts[:B]
        for e in engines:  # warm-up: first calls allocate and pick kernels
            e.run(ps, 4)
        res = {e.name: [] for e in engines}
        for _ in range(args.repeats):
            for e in engines:
                res[e.name].append(e.run(ps, args.tokens))
        for e in engines:
            r = res[e.name]
            rows.append(Row(e.name, B, min(x[0] for x in r), max(x[1] for x in r),
                            f"median {statistics.median(x[1] for x in r):.1f} tok/s"))
    print()
    print(f"{'engine':13} {'batch':>5} {'TTFT ms':>9} {'decode tok/s':>13} {'vs llama.cpp':>13} {'vs transformers':>16}")
    for B in batches:
        by = {r.engine: r for r in rows if r.batch == B}
        for r in by.values():
            rl = by.get("llama.cpp")
            rt = by.get("transformers")
            vl = f"{r.decode_tps / rl.decode_tps:.2f}x" if rl else "-"
            vt = f"{r.decode_tps / rt.decode_tps:.2f}x" if rt else "-"
            print(f"{r.engine:13} {B:5d} {r.ttft * 1e3:9.1f} {r.decode_tps:13.1f} {vl:>13} {vt:>16}   ({r.note})")
    print("\nratios are decode tok/s divided by the peer's; TTFT covers every sequence of the batch")
    return 0
