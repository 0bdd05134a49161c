"""`speechrt bench lm`: language-model time to first token and decode speed, ours vs llama.cpp vs transformers.

All engines run in this one process, on the same GGUF, the same token ids (chat prompts rendered by the
model's own template), the same thread count, greedy decoding of a fixed number of tokens (stop tokens
ignored so every engine does the same work). Batch B runs B different prompts together:

- ours: `pipelines.lm_batching.stream` (the real token loop: B prefills into B cache slots of a
  continuous batcher, then one batched decode step per token, detokenizing as it goes);
- llama.cpp (`llama-cpp-python`): one `llama_decode` with all B prompts as B sequences, then one
  `llama_decode` per step with B tokens; greedy argmax over its logits;
- transformers (`AutoModelForCausalLM.from_pretrained(dir, gguf_file=...)`, float32 as it dequantizes;
  with `--device cuda` on the GPU in bf16, eager with its dynamic cache, as `generate()` runs by default):
  `generate()` on the left-padded batch; TTFT is a 1-token generate, decode rate is the rest;
- torch-compile-static (static_llama.py, on --device, from the same file's float weights): gpt-fast's recipe, a
  static cache and the greedy decode step under `torch.compile(mode="max-autotune", fullgraph=True)`, prompts
  prefilled eagerly one by one; torch-static: the same step uncompiled.

TTFT is from token ids to the first sampled token of every sequence of the batch; decode tok/s counts
every sequence's tokens after the first (aggregate over the batch). Each measurement is repeated and
the best run is kept (the machine may be shared), the median is shown beside it. The engines are
lm_engines.py.

Each engine runs in its own worker process, within this one command, and the engines take turns (one
measurement each, round after round), so that they see the same background load. Not one process:
torch and llama.cpp both keep OpenMP thread pools whose idle threads spin, and in one process each
engine's pool steals cores from the other's (on 2 cores that halves either one's speed).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile

from speechrt.bench.fingerprint import usable_cores
from speechrt.bench.lm_engines import GRAMMAR_TAG, start_engine
from speechrt.cli_paths import output_file

PEERS = ("llama.cpp", "transformers", "onnxruntime-genai", "torch-compile-static", "torch-static")
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
    p.add_argument(
        "--dtype",
        default=None,
        help="our weight format: int4, int8, bfloat16, float32 (default on the CPU: "
        "int4 for files with 4-bit blocks, else int8)",
    )
    p.add_argument(
        "--device",
        default="cpu",
        help="our device (default cpu); transformers runs there too, llama.cpp and onnxruntime-genai on the CPU",
    )
    p.add_argument(
        "--backends",
        default="torch",
        help="our backends to time, comma-separated (e.g. torch,onnxruntime; "
        "auto: the one `--backend auto` picks here) (default: %(default)s)",
    )
    p.add_argument(
        "--json",
        default=None,
        type=output_file("--json", "results.json"),
        help="also write the results (speechrt.bench.record schema) to this file",
    )
    p.add_argument(
        "--peers",
        default="llama.cpp,transformers",
        help="peers to run if installed, comma-separated from: " + ", ".join(PEERS) + "; '' for none "
        "(torch-compile-static: gpt-fast's static cache and torch.compile max-autotune on --device, minutes of "
        "compiling on a CPU; torch-static: the same uncompiled) (default: %(default)s)",
    )
    p.add_argument(
        "--grammar",
        choices=("none", "json"),
        default="none",
        help="json: also time each of our backends with every sequence constrained by a JSON schema grammar "
        "(llguidance; its mask computed and applied at every token), beside the same backend without, and print "
        "the ratio (default: %(default)s)",
    )
    p.add_argument(
        "--eval",
        action="store_true",
        help="instead of speed: score every installed embedded language model (or --model) as the voice agent on "
        "the evaluation's questions and instructions, per sampling setting (lm_eval.py)",
    )
    p.add_argument("--eval-limit", type=int, default=None, help="with --eval: the first N items of each kind only")
    p.add_argument(
        "--eval-settings",
        default=None,
        help="with --eval: comma-separated sampling settings (default: all of greedy, greedy-norepstop, t0.3-p0.9, "
        "t0.3-p0.9-norepstop, t0.7-p0.9, t0.7-p0.9-norepstop)",
    )
    p.add_argument(
        "--eval-seeds",
        type=int,
        default=1,
        help="with --eval: a sampled setting's scores are the mean over seeds 0..N-1 (default 1: seed 0, as the "
        "server seeds a reply)",
    )
    p.add_argument("--eval-show", action="store_true", help="with --eval: print every question and answer")
    p.add_argument(
        "--llama-extra-bufts",
        action="store_true",
        help="let llama.cpp use its extra (AMX/repacked) weight buffers; off by default because the "
        "prebuilt wheel's AMX path dies with SIGILL on CPUs/VMs that do not enable AMX tiles",
    )


def _chat_prompts(model) -> list[list[int]]:
    """The benchmark prompts as token ids, rendered by the model's chat template (without loading weights)."""
    from speechrt.models import chat_templates, gguf_loader, registry
    from speechrt.models.lm_text import ChatTemplate, LMTokenizer

    rm = registry.resolve(model, "lm")
    if rm.format == "gguf":
        md = gguf_loader.open_reader(rm.path).metadata
        template = md.get("tokenizer.chat_template") or chat_templates.BY_GGUF_ARCH.get(md.get("general.architecture"))
        tok = LMTokenizer.from_gguf_metadata(md, rm.path)
    else:
        tok, template = LMTokenizer.from_hf_dir(rm.path)
    if not template:
        return [tok.encode(p) for p in PROMPTS]
    t = ChatTemplate(
        template,
        tok.id_to_token(tok.bos_id) if tok.bos_id is not None else "",
        tok.id_to_token(tok.eos_id) if tok.eos_id is not None else "",
    )
    return [tok.encode(t.render([{"role": "user", "content": p}]), add_bos=False) for p in PROMPTS]


def worker() -> None:
    """Worker process: a JSON spec line on stdin builds the engine and answers {note, meta}, {skip} or
    {error} (ours cannot run: a user error, in one line); then each
    {"batch", "tokens"} line runs one measurement and answers {"ttft", "tps"}. Waiting on stdin between
    turns leaves its thread pool idle while the other engines run."""
    from speechrt.errors import UserError

    spec = json.loads(sys.stdin.readline())
    try:
        engine, skip = start_engine(spec)
    except UserError as e:  # ours cannot run here (a backend without its device): said in one line
        print(json.dumps({"error": str(e)}), flush=True)
        return
    print(json.dumps({"skip": skip} if engine is None else {"note": engine.note, "meta": engine.meta}), flush=True)
    if engine is None:
        return
    for line in sys.stdin:
        cmd = json.loads(line)
        ttft, tps = engine.run(spec["prompts"][: cmd["batch"]], cmd["tokens"])
        print(json.dumps({"ttft": ttft, "tps": tps}), flush=True)


class _Worker:
    def __init__(self, spec, env):
        self.err = tempfile.TemporaryFile(mode="w+")  # (a pipe could fill up and stall the worker)
        self.p = subprocess.Popen(
            [sys.executable, "-m", "speechrt.bench.lm"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.err,
            text=True,
            env=env,
        )
        self.ask(spec)

    def ask(self, msg) -> dict:
        self.p.stdin.write(json.dumps(msg) + "\n")
        self.p.stdin.flush()
        line = self.p.stdout.readline()
        if not line:
            self.p.wait()
            self.err.seek(0)
            err = self.err.read().strip().splitlines()[-3:]
            raise RuntimeError(" | ".join(err) or f"worker exited with {self.p.wait()}")
        self.reply = json.loads(line)
        return self.reply

    def close(self):
        if self.p.poll() is None:
            self.p.stdin.close()
            self.p.wait()
        self.err.close()


def run(args):
    from speechrt.errors import UserError
    from speechrt.models import registry

    if args.eval:
        from speechrt.bench import lm_eval

        return lm_eval.run(args)
    threads = args.threads or usable_cores() or 1
    try:
        batches = [int(b) for b in args.batch.split(",") if b.strip()]
    except ValueError:
        raise UserError(f"--batch must be comma-separated integers, got {args.batch!r}") from None
    if not batches or any(b < 1 or b > len(PROMPTS) for b in batches):
        raise UserError(f"--batch sizes must be between 1 and {len(PROMPTS)}, got {args.batch!r}")
    if args.tokens < 2 or args.repeats < 1:
        raise UserError("--tokens must be >= 2 and --repeats >= 1")
    peers = [p.strip() for p in args.peers.split(",") if p.strip()]
    bad = [p for p in peers if p not in PEERS]
    if bad:
        raise UserError(f"unknown peer(s) {', '.join(bad)}; valid: {', '.join(PEERS)}")
    ours = [f"speechrt {b.strip()}" for b in args.backends.split(",") if b.strip()]
    if args.grammar == "json":  # the same backends, each sequence under a JSON schema grammar (lm_engines.SCHEMA)
        ours += [f"{n} {GRAMMAR_TAG}" for n in ours]
    rm = registry.resolve(args.model, "lm")
    from speechrt import backends

    for name in ours:
        backends.get(name.split()[1])  # an unknown backend fails here, naming the valid ones
    import torch

    from speechrt.backends.torch.lm import resolve_format

    resolve_format(args.dtype, torch.device("cpu"))  # a bad --dtype fails here, not in a worker

    print(f"speechrt bench lm: {rm.name} ({rm.path})")
    print(
        f"threads {threads}, {args.tokens} tokens per sequence, greedy, best of {args.repeats}; "
        "each engine in its own process, taking turns"
    )
    sys.stdout.flush()
    prompts = _chat_prompts(args.model)
    spec = {
        "model": args.model,
        "device": args.device,
        "dtype": args.dtype,
        "threads": threads,
        "batches": batches,
        "tokens": args.tokens,
        "repeats": args.repeats,
        "prompts": prompts,
        "extra_bufts": args.llama_extra_bufts,
        "n_ctx": max(batches) * (max(len(p) for p in prompts) + args.tokens) + 64,
    }
    env = dict(os.environ, TQDM_DISABLE="1", TRANSFORMERS_VERBOSITY="error", OMP_NUM_THREADS=str(threads))
    workers, notes, meta = {}, {}, {}
    try:
        for name in ours + peers:  # started one at a time, so loading does not overlap
            try:
                w = _Worker(dict(spec, engine=name), env)
            except RuntimeError as e:
                if name.startswith("speechrt"):
                    raise UserError(f"our benchmark worker failed: {e}") from None
                notes[name] = f"skipped: worker failed: {e}"
            else:
                if "error" in w.reply:
                    w.close()
                    raise UserError(w.reply["error"])
                if "skip" in w.reply:
                    notes[name] = "skipped: " + w.reply["skip"]
                    w.close()
                else:
                    notes[name], meta[name] = w.reply["note"], w.reply["meta"]
                    workers[name] = w
            print(f"  {name:22} {notes[name]}")
            sys.stdout.flush()
        results: dict[str, list[dict]] = {n: [] for n in workers}
        for B in batches:
            for w in workers.values():  # warm-up: first calls allocate, pick kernels, capture graphs
                w.ask({"batch": B, "tokens": args.tokens})
            runs: dict[str, list[dict]] = {n: [] for n in workers}
            for _ in range(args.repeats):  # engines take turns, so they see the same background load
                for n, w in workers.items():
                    runs[n].append(w.ask({"batch": B, "tokens": args.tokens}))
            for n, r in runs.items():
                results[n].append(
                    {
                        "batch": B,
                        "ttft": min(x["ttft"] for x in r),
                        "tps": max(x["tps"] for x in r),
                        "tps_median": statistics.median(x["tps"] for x in r),
                        "runs": r,
                    }
                )
    finally:
        for w in workers.values():
            w.close()
    results = {n: {"rows": rows} for n, rows in results.items()}

    print()
    print(
        f"{'engine':22} {'batch':>5} {'TTFT ms':>9} {'decode tok/s':>13} {'(median)':>9} {'vs llama.cpp':>13} "
        f"{'vs transformers':>16} {'vs genai':>9} {'vs compile':>11}"
    )
    for i, B in enumerate(batches):
        by = {n: r["rows"][i] for n, r in results.items() if "rows" in r}
        for n, row in by.items():
            vl = f"{row['tps'] / by['llama.cpp']['tps']:.2f}x" if "llama.cpp" in by else "-"
            vt = f"{row['tps'] / by['transformers']['tps']:.2f}x" if "transformers" in by else "-"
            vg = f"{row['tps'] / by['onnxruntime-genai']['tps']:.2f}x" if "onnxruntime-genai" in by else "-"
            vc = f"{row['tps'] / by['torch-compile-static']['tps']:.2f}x" if "torch-compile-static" in by else "-"
            print(
                f"{n:22} {B:5d} {row['ttft'] * 1e3:9.1f} {row['tps']:13.1f} {row['tps_median']:9.1f} {vl:>13} {vt:>16} "
                f"{vg:>9} {vc:>11}"
            )
    print("\nratios: decode tok/s (best run) over the peer's; TTFT covers every sequence of the batch")
    _grammar_ratios(results, batches)
    if args.json:
        from speechrt.bench.record import Results

        out = Results(_records(results, meta, rm.name, args.tokens, threads, args.device))
        for name, note in notes.items():
            if note.startswith("skipped: "):
                out.skip("lm", name, note.removeprefix("skipped: "))
        out.write(args.json)
    return 0


def _grammar_ratios(results, batches) -> None:
    """With --grammar json: each backend's decode tok/s under the grammar over its tok/s without, per batch."""
    for name in [n for n in results if n.endswith(GRAMMAR_TAG)]:
        free = name.removesuffix(" " + GRAMMAR_TAG)
        for i, B in enumerate(batches):
            g, f = results[name]["rows"][i], results[free]["rows"][i]
            print(
                f"grammar overhead, {free}, batch {B}: {g['tps']:.1f} vs {f['tps']:.1f} decode tok/s "
                f"(best runs; medians {g['tps_median']:.1f} vs {f['tps_median']:.1f}): "
                f"{g['tps'] / f['tps']:.3f}x, {100 * (f['tps'] / g['tps'] - 1):+.1f} % time per token"
            )


def _records(results, meta, model, tokens, threads, device="cpu"):
    """Per engine and batch size: time to first token (best run) and decode tok/s (best run), with the
    spread of the runs; ours compared with llama.cpp, else transformers, else onnxruntime-genai, else the static-cache
    peers (on a GPU the compiled static-cache peer first: llama.cpp and onnxruntime-genai run on the CPU)."""
    from speechrt.bench.record import Record, Repeats

    order = PEERS if device == "cpu" else ("torch-compile-static", "transformers", "torch-static")
    peer = next((n for n in order if n in results), None)
    out = []
    for name, r in results.items():
        m, ours = meta[name], name.startswith("speechrt")  # ours: 'speechrt <backend>' (the backend in meta)
        for row in r["rows"]:
            B = row["batch"]
            common = dict(
                family="lm",
                model=model,
                engine="speechrt" if ours else name,
                workload=f"batch {B}, {tokens} tokens" + (", json grammar" if name.endswith(GRAMMAR_TAG) else ""),
                peer=f"{peer} {meta[peer]['precision']}" if peer and ours else "",
                params={"batch": B, "tokens": tokens, "threads": threads, "grammar": name.endswith(GRAMMAR_TAG)},
                **m,
            )
            out.append(
                Record(
                    metric="ttft_s",
                    unit="s",
                    value=row["ttft"],
                    better="lower",
                    repeats=Repeats.of(x["ttft"] for x in row["runs"]),
                    **common,
                )
            )
            out.append(
                Record(
                    metric="decode_tok_s",
                    unit="tok/s",
                    value=row["tps"],
                    better="higher",
                    repeats=Repeats.of(x["tps"] for x in row["runs"]),
                    **common,
                )
            )
    return out


if __name__ == "__main__":  # worker mode (see worker())
    worker()
