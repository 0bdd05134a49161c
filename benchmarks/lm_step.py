"""`python -m benchmarks.lm_step`: where one batch-1 decode step goes, our exported graph beside
onnxruntime-genai's graph of the same GGUF and the torch backend's int4 kernel on AVX2 CPUs — the nodes each
runs, the bytes of weights each step reads (by what reads them), and the time of bare steps: ONNX Runtime
with I/O binding, the caches bound in place (the kernel: one C call on its fp16 cache), no sampling and no
Python loop around them, each in turn for `--rounds` rounds (best and median kept).

A decode step at one row reads every weight once, so on a CPU it is bound by memory bandwidth and by the
cost of dispatching its nodes; the bytes say which graph can be faster at all. Our graph keeps the GGUF's
blocks exactly (Q4_1's minimum as a block-sum correction, a dense float matrix per linear; the Q8_0 head at
8 bits); genai's builder re-quantizes to symmetric 4-bit blocks and a 4-bit head.
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

EMBED_OPS = ("Gather", "GatherBlockQuantized")  # read one row per token


def step_bytes(model) -> dict[str, int]:
    """Bytes of `model`'s initializers that one decode step of one token reads, by reader: 'block weights'
    (MatMulNBits of the layers), 'head' (the MatMulNBits with the widest output), 'dense weights' (MatMul,
    Gemm), 'embedding row' (a Gather reads one row), 'other' (norm weights, rotary tables). An initializer
    read by several nodes (a tied head and embedding) counts once, for its first reader in that order."""
    from onnx import helper, numpy_helper

    inits = {t.name: t for t in model.graph.initializer}
    nbits = [n for n in model.graph.node if n.op_type == "MatMulNBits"]
    widest = max(
        nbits, key=lambda n: helper.get_attribute_value(next(a for a in n.attribute if a.name == "N")), default=None
    )

    def kind(node) -> str:
        if node is widest:
            return "head"
        if node.op_type == "MatMulNBits":
            return "block weights"
        if node.op_type in ("MatMul", "Gemm"):
            return "dense weights"
        if node.op_type in EMBED_OPS:
            return "embedding row"
        return "other"

    order = ("head", "block weights", "dense weights", "embedding row", "other")
    readers: dict[str, tuple[str, int]] = {}  # initializer -> (kind, input index of its reader)
    for n in model.graph.node:
        for i, name in enumerate(n.input):
            if name in inits:
                k = kind(n)
                if name not in readers or order.index(k) < order.index(readers[name][0]):
                    readers[name] = (k, i)
    out = dict.fromkeys(order, 0)
    for name, (k, i) in readers.items():
        a = numpy_helper.to_array(inits[name])
        size = a.nbytes
        if k == "embedding row" and i != 1 and a.ndim >= 1 and a.shape[0]:
            size //= a.shape[0]  # the table (and its blocks' scales, zero points): one row per token
        out[k] += size
    return out


def node_counts(model) -> collections.Counter:
    return collections.Counter(n.op_type for n in model.graph.node)


class BareStep:
    """A session over a decode graph, one token of one sequence after `past` positions, every input and
    cache bound once (the caches as both past and present, written in place). Knows our exports' names
    (export/llama_onnx.py: seqlens_k, past_key.i) and onnxruntime-genai's (attention_mask,
    past_key_values.i.key)."""

    def __init__(self, path: Path, threads: int | None, past: int, cache: int = 512):
        import onnxruntime as ort

        from speechrt.backends.onnxruntime.providers import session

        # as the runner's decode session: every graph optimization, the pool's threads spinning between steps
        self.session = s = session(str(path), ["CPUExecutionProvider"], threads, spin=True)
        ins = {i.name: i for i in s.get_inputs()}
        if "input_ids" not in ins or not ("seqlens_k" in ins or "attention_mask" in ins):
            raise ValueError(f"{path}: not a decode graph this knows (inputs: {', '.join(ins)})")
        self.io = io = s.io_binding()
        self.keep = []  # the arrays bound by address stay alive with the binding
        ids = np.array([[42]], np.int64)
        io.bind_cpu_input("input_ids", ids)
        self.keep.append(ids)
        if "seqlens_k" in ins:  # ours: caches [1, Hkv, cache + 1, D], GQA writes at seqlens_k
            pasts = sorted(n for n in ins if n.startswith("past_"))
            for name, arr in (
                ("seqlens_k", np.array([past], np.int32)),
                ("total_sequence_length", np.array(past + 1, np.int32)),
            ):
                io.bind_cpu_input(name, arr)
                self.keep.append(arr)
            present = {p: p.replace("past_", "present_") for p in pasts}
            length = cache + 1
        else:  # genai: past_present_share_buffer, caches [1, Hkv, cache, D]
            mask = np.ones((1, past + 1), np.int64)
            io.bind_cpu_input("attention_mask", mask)
            self.keep.append(mask)
            pasts = sorted(n for n in ins if n.startswith("past_key_values."))
            present = {p: p.replace("past_key_values.", "present.") for p in pasts}
            length = cache
            head_size = json.loads((Path(path).parent / "genai_config.json").read_text())["model"]["decoder"][
                "head_size"
            ]
        for p in pasts:
            shape = [d if isinstance(d, int) else 1 for d in ins[p].shape]
            shape[2] = length
            if not isinstance(ins[p].shape[3], int):
                shape[3] = head_size
            v = ort.OrtValue.ortvalue_from_numpy(np.zeros(shape, np.float32))
            io.bind_ortvalue_input(p, v)
            io.bind_ortvalue_output(present[p], v)
            self.keep.append(v)
        out = s.get_outputs()[0]
        logits = np.empty([1 if not isinstance(d, int) else d for d in out.shape], np.float32)
        io.bind_output(out.name, "cpu", 0, np.float32, logits.shape, logits.ctypes.data)
        self.keep.append(logits)
        self.logits = logits

    def run(self, steps: int) -> float:
        """Seconds per step over `steps` steps."""
        t = time.perf_counter()
        for _ in range(steps):
            self.session.run_with_iobinding(self.io)
        return (time.perf_counter() - t) / steps


class KernelStep:
    """The torch backend's int4 step on the CPU (kernels/cpu_decode, AVX2): one token of one sequence after
    `past` positions of its fp16 cache, one C call, no sampling; the bytes it reads by reader, as step_bytes."""

    def __init__(self, model: str, threads: int | None, past: int, cache: int = 512):
        import torch

        from speechrt import backends
        from speechrt.backends.torch.cpu_lm import CpuInt4LMRunner
        from speechrt.models import registry

        if threads:
            torch.set_num_threads(threads)
        self.lm = backends.get("torch").lm(registry.resolve(model, "lm"), dtype="int4")
        if not isinstance(self.lm, CpuInt4LMRunner):
            raise RuntimeError(f"the AVX2 int4 kernel does not run here ({self.lm.info})")
        self.cpu = self.lm.model
        self.k, self.v = self.cpu.new_cache(1, cache)
        self.past = past
        packs = [p.data.numel() for p in self.cpu.packs]
        cfg = self.cpu.cfg
        self.bytes = {
            "head": packs[-1],
            "block weights": sum(packs[:-1]),
            "dense weights": 0,
            "embedding row": cfg.dim * 4,
            "other": (2 * cfg.n_layers + 1) * cfg.dim * 4 + cfg.head_dim * 4,
        }

    def run(self, steps: int) -> float:
        t = time.perf_counter()
        for _ in range(steps):
            self.cpu(self.k, self.v, [0], [self.past], [42])
        return (time.perf_counter() - t) / steps


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m benchmarks.lm_step", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m-instruct", help="registry name or .gguf path")
    p.add_argument(
        "--graph",
        action="append",
        default=None,
        help="time this decode graph (.onnx) instead of ours and genai's (repeatable)",
    )
    p.add_argument("--threads", type=int, default=None, help="intra-op threads (default: all cores)")
    p.add_argument("--past", type=int, default=100, help="positions already in the cache")
    p.add_argument("--steps", type=int, default=100, help="steps per round")
    p.add_argument("--rounds", type=int, default=5, help="rounds per graph, the graphs taking turns")
    args = p.parse_args(argv)

    import onnx

    graphs = graph_names([Path(g) for g in args.graph]) if args.graph else default_graphs(args.model)
    print(
        f"batch-1 decode step, {args.past} positions of past, {args.threads or 'all'} threads; "
        f"{args.rounds} rounds of {args.steps} steps, the graphs taking turns",
        file=sys.stderr,
    )
    steps, rows = {}, {}
    for name, path in graphs.items():
        m = onnx.load(str(path))
        rows[name] = (step_bytes(m), node_counts(m))
        del m
        steps[name] = BareStep(path, args.threads, args.past)
        steps[name].run(10)  # warm-up: prepacking done, caches touched
    if not args.graph:
        try:
            k = KernelStep(args.model, args.threads, args.past)
        except (RuntimeError, ValueError) as e:
            print(f"(the AVX2 kernel's step left out: {e})", file=sys.stderr)
        else:
            name = "speechrt torch int4 AVX2"
            graphs[name], steps[name], rows[name] = None, k, (k.bytes, collections.Counter({"srt_forward (C)": 1}))
            k.run(10)
    times = collections.defaultdict(list)
    for _ in range(args.rounds):
        for name, s in steps.items():
            times[name].append(s.run(args.steps) * 1e3)
    first = next(iter(graphs))
    print(
        f"{'graph':28s} {'nodes':>5s} {'MiB/step':>8s}  {'ms/step best':>12s} {'median':>7s} {'GB/s':>5s}  "
        "bytes by reader (MiB)"
    )
    for name in graphs:
        b, counts = rows[name]
        n = sum(counts.values())
        best, med = min(times[name]), statistics.median(times[name])
        parts = ", ".join(f"{k} {v / 2**20:.1f}" for k, v in b.items() if v >= 2**16)
        ratio = "" if name == first else f"; {min(times[first]) / best:.2f}x the first row's speed"
        total = sum(b.values())
        print(
            f"{name[:28]:28s} {n:5d} {total / 2**20:8.1f}  {best:12.2f} {med:7.2f} {total / best / 1e6:5.1f}  "
            f"{parts}{ratio}"
        )
    for name in graphs:
        print(f"  {name[:28]}: " + ", ".join(f"{op} {c}" for op, c in rows[name][1].most_common()))


def graph_names(paths: list[Path]) -> dict[str, Path]:
    """Each graph by its file's stem, or its folder's name where stems repeat (exports are all model.onnx)."""
    stems = collections.Counter(p.stem for p in paths)
    return {(p.parent.name if stems[p.stem] > 1 else p.stem): p for p in paths}


def default_graphs(model: str) -> dict[str, Path]:
    """Our int4 export's decode graph and onnxruntime-genai's int4 graph of the same GGUF (each made on first
    use, as `bench lm` makes them)."""
    from speechrt.backends.onnxruntime.exports import export_dir
    from speechrt.export import cache_dir
    from speechrt.models import registry

    rm = registry.resolve(model, "lm")
    d, man = export_dir(rm, "lm", "int4", "int4")
    out = {"speechrt onnxruntime int4": d / man.graph("model").file}
    try:
        from speechrt.bench.genai_peer import build

        out["onnxruntime-genai int4"] = (
            build(rm.path, cache_dir(), log=lambda m: print(m, file=sys.stderr)) / "model.onnx"
        )
    except (ImportError, RuntimeError) as e:  # not installed (pip install 'speechrt[bench]'), or its builder failed
        print(f"(onnxruntime-genai's graph left out: {e})", file=sys.stderr)
    return out


if __name__ == "__main__":
    main()
