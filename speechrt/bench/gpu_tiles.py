"""`bench gpu`'s gemv-tiles check: a recorded sweep of the fused decode-step ops' tiles, to set their defaults from.

At batch 1-8 the fused ops (kernels/triton_fused.py: norm_qkv_rope, linear_residual as the o and the down
projection, norm_gate_up) stream their weights once: a program's bandwidth is its bytes in flight over the memory
latency (Little's law), so the K tile, the pipeline's stages, the column tile and the warps decide how close a step
comes to the copy bandwidth. Each op at the SmolLM2-135M and Llama-3.2-1B shapes, one and eight rows, random bf16
weights, runs with each tile set of CONFIGS (triton_fused.TILES while it runs; the first is config()'s default) and
the K split the rule (kernels/triton_fused_split.py) gives for those tiles, i.e. what would be dispatched: its
output against the default's and the torch reference's (a wrong tile set fails the check), then its time per
launch, the fraction of the measured copy bandwidth its bytes take and its ratio to the default; a record each,
with the tiles and the split in its params. A tile set that does not compile on the GPU at hand (shared memory,
registers) or that spills is left out, saying so in a note. CONFIGS compile without spills for sm_80, sm_90, gfx90a
and gfx942 (AOT, unit K strides as the launches specialize them).

`plan()` is plain arithmetic and `run_cases()` runs anywhere the kernels run (the tests: tiny shapes on the CPU in
the Triton interpreter); only `check_gemv_tiles()` wants a GPU."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from speechrt.bench.gpu_fused import SHAPES
from speechrt.bench.record import Record, Repeats, Results

ROWS = (1, 8)
OPS = ("qkv", "o", "down", "gate_up")  # norm_qkv_rope, linear_residual (o, down), norm_gate_up
# (BLOCK_N, BLOCK_K, num_warps, num_stages), config()'s default first; Q/K/V's BLOCK_HALF is BLOCK_N / 2 (its
# column pairs). Deeper pipelines and wider K / column tiles: more bytes in flight per program
CONFIGS = ((32, 64, 4, 2), (32, 64, 8, 4), (32, 128, 4, 3), (64, 64, 4, 2), (32, 128, 8, 3))
TOL = {"float32": 1e-4, "float16": 5e-3, "bfloat16": 2e-2}  # relative (to the largest output) differences allowed


@dataclass(frozen=True)
class Case:
    shape: str
    op: str
    rows: int
    K: int  # the reduction: the input's width
    N: int  # the weight's rows (qkv: (H + 2 Hkv) x D; gate_up: gate and up)
    heads: tuple  # (H, Hkv, D): the attention's heads (Q/K/V's epilogue)
    bytes: int  # read and written by one launch: the weight, the input, the outputs (and the residual)


def op_bytes(op: str, M: int, K: int, N: int, elt: int = 2) -> int:
    out = {"qkv": M * N + K, "o": 2 * M * N, "down": 2 * M * N, "gate_up": M * N // 2 + K}[op]
    return elt * (N * K + M * K + out)


def plan(shapes=SHAPES, rows=ROWS) -> list[Case]:
    out = []
    for name, c in shapes.items():
        D = c.head_dim
        widths = {
            "qkv": (c.dim, (c.n_heads + 2 * c.n_kv_heads) * D),
            "o": (c.n_heads * D, c.dim),
            "down": (c.hidden_dim, c.dim),
            "gate_up": (c.dim, 2 * c.hidden_dim),
        }
        for op in OPS:
            K, N = widths[op]
            heads = (c.n_heads, c.n_kv_heads, D)
            out += [Case(name, op, M, K, N, heads, op_bytes(op, M, K, N)) for M in rows]
    return out


def tiles(config: tuple) -> dict:
    bn, bk, warps, stages = config
    return {"BLOCK_N": bn, "BLOCK_K": bk, "num_warps": warps, "num_stages": stages, "BLOCK_HALF": bn // 2}


def label(config: tuple) -> str:
    return "n{}k{}w{}s{}".format(*config)


def dispatched_splits(case: Case, device, dtype) -> int:
    """The K splits a launch of `case` takes with the tiles in force (triton_fused.TILES): the launchers' count."""
    import triton

    from speechrt.kernels import triton_fused as fu
    from speechrt.kernels import triton_fused_split as fs

    H, Hkv, D = case.heads
    c = fu.tiles(case.rows, dtype, D // 2 if case.op == "qkv" else None)
    rows = triton.cdiv(case.rows, c["BLOCK_M"])
    if case.op == "qkv":
        programs = rows * (H + 2 * Hkv) * triton.cdiv(D // 2, c["BLOCK_HALF"])
    else:
        programs = rows * triton.cdiv(case.N // 2 if case.op == "gate_up" else case.N, c["BLOCK_N"])
    return fs.k_splits(programs, case.K, c["BLOCK_K"], device, fs.SPLITS)[0]


def operands(case: Case, device, dtype, seed: int = 0):
    """(run(ops), read(result)) for one case on random inputs: run calls the op of `ops` (kernels.triton_fused or
    kernels.reference, by name), read flattens what it wrote (for Q/K/V: Q and the cache rows) to float32."""
    import torch

    g = torch.Generator(device=device).manual_seed(seed)
    M, K, N = case.rows, case.K, case.N

    def draw(*shape, scale=None):
        t = torch.randn(shape, generator=g, device=device, dtype=torch.float32)
        return (t * (scale if scale is not None else shape[-1] ** -0.5)).to(dtype)

    x, w = draw(M, K, scale=1.0), draw(N, K)
    if case.op in ("o", "down"):
        r = draw(M, N, scale=1.0)
        return (lambda ops: ops.linear_residual(x, w, r)), (lambda y: y.float().flatten())
    norm = (1 + 0.1 * draw(K, scale=1.0).float()).to(dtype)
    if case.op == "gate_up":
        return (lambda ops: ops.norm_gate_up(x, norm, 1e-5, w)), (lambda y: y.float().flatten())
    H, Hkv, D = case.heads
    pos = torch.arange(M, device=device) * 3 + 1
    ang = torch.arange(3 * M + 2, device=device)[:, None] * 1e4 ** -(torch.arange(D // 2, device=device) / (D // 2))
    cos, sin = ang.cos(), ang.sin()
    kc = torch.zeros((M, Hkv, 3 * M + 2, D), dtype=dtype, device=device)
    vc = torch.zeros_like(kc)
    rows = torch.arange(M, device=device)

    def run(ops):
        return ops.norm_qkv_rope(x, norm, 1e-5, w, H, cos, sin, pos, kc, vc)

    def read(q):
        return torch.cat([q.flatten(), kc[rows, :, pos].flatten(), vc[rows, :, pos].flatten()]).float()

    return run, read


KERNELS = {"qkv": "_norm_qkv_rope_kernel", "o": "_linear_residual_kernel", "down": "_linear_residual_kernel"}
KERNELS["gate_up"] = "_norm_gate_up_kernel"


def spilled() -> set:
    """(kernel name, tile set) of each fused float kernel compiled in this process whose binary spills registers (its
    tiles read back from its constants and metadata; none in the interpreter, which compiles nothing)."""
    from speechrt.kernels import triton_fused as fu

    found = set()
    for fn in (fu._norm_qkv_rope_kernel, fu._linear_residual_kernel, fu._norm_gate_up_kernel):
        for cache in getattr(fn, "device_caches", {}).values():
            for k in (k for k in cache[0].values() if getattr(k, "n_spills", 0)):
                c = {fn.arg_names[i[0]]: v for i, v in k.src.constants.items() if len(i) == 1}
                bn = c.get("BLOCK_N") or 2 * c.get("BLOCK_HALF", 0)
                found.add((fn.__name__, (bn, c.get("BLOCK_K"), k.metadata.num_warps, k.metadata.num_stages)))
    return found


def rel_err(got, want) -> float:
    return ((got - want).abs().amax() / want.abs().amax().clamp_min(1e-30)).item()


def run_cases(device, cases: list[Case], out: Results, timer, bandwidth_gbps: float, configs=CONFIGS, dtype=None):
    """Every config of every case (records in `out`, notes for the configs left out; `dtype` default bf16) ->
    problems: a config's output beyond the dtype's tolerance of the default config's, or the default's of the torch
    reference's."""
    import torch
    from triton.compiler.errors import CompilationError
    from triton.runtime.errors import OutOfResources

    from speechrt.kernels import reference
    from speechrt.kernels import triton_fused as fu

    dtype = dtype or torch.bfloat16
    name, bad = str(dtype).removeprefix("torch."), []
    tol = TOL[name]
    for case in cases:
        run, read = operands(case, device, dtype)
        want, base = read(run(reference)), None
        what = f"{case.shape} {case.op} M={case.rows}"
        for config in configs:
            with fu.using_tiles(tiles(config)):
                try:
                    got = read(run(fu))
                except (OutOfResources, CompilationError) as e:  # a tile set this GPU cannot run: pruned, not ranked
                    out.notes.append(f"gemv-tiles: {what} {label(config)} left out: {type(e).__name__}: {e}")
                    continue
                if base is not None and (KERNELS[case.op], config) in spilled():
                    out.notes.append(f"gemv-tiles: {what} {label(config)} left out: its kernel spills registers here")
                    continue
                base = got if base is None else base
                errs = rel_err(got, base), rel_err(got, want)
                if not (errs[0] <= tol and errs[1] <= tol):
                    bad.append(f"{what} {label(config)}: {errs[0]:.3g} from the default's, {errs[1]:.3g} from torch's")
                    continue
                splits = dispatched_splits(case, device, dtype)
                ts = timer(lambda run=run: run(fu))
            out.records.append(record(case, config, ts, splits, errs, bandwidth_gbps, str(device), name))
    return bad


def record(case: Case, config, ts, splits: int, errs, bandwidth_gbps: float, device: str, precision: str) -> Record:
    t = statistics.median(ts)
    default = config == CONFIGS[0]
    return Record(
        family="gpu",
        model=case.shape,
        engine="speechrt",
        backend=case.op,
        precision=precision,
        device=device,
        workload=f"{case.op} of a {case.rows}-row decode step, K {case.K} -> N {case.N}, random weights",
        metric="launch_us",
        unit="us",
        value=t * 1e6,
        better="lower",
        repeats=Repeats.of(x * 1e6 for x in ts),
        peer="" if default else label(CONFIGS[0]),
        params={
            "rows": case.rows,
            "K": case.K,
            "N": case.N,
            "config": label(config),
            "tiles": tiles(config),
            "default": default,
            "splits": splits,
            "bytes": case.bytes,
            "fraction_of_bandwidth": case.bytes / t / (bandwidth_gbps * 1e9) if bandwidth_gbps else 0.0,
            "vs_default_rel_err": errs[0],
            "vs_reference_rel_err": errs[1],
        },
    )


def summary(records: list[Record]) -> list[str]:
    """Per op, shape and rows: the default's time and bandwidth share, the best config (with its split) and its
    speed-up over the default; each record gets its speedup_vs_default (and best: True on the fastest)."""
    groups: dict = {}
    for r in records:
        groups.setdefault((r.model, r.backend, r.params["rows"]), []).append(r)
    parts = []
    for (shape, op, rows), rs in groups.items():
        default = next((r for r in rs if r.params["default"]), None)
        best = min(rs, key=lambda r: r.value)
        for r in rs:
            r.params["speedup_vs_default"] = default.value / r.value if default else 0.0
            r.params["best"] = r is best
        if default is None:
            parts.append(f"{shape} {op} M={rows}: the default did not run")
            continue
        parts.append(
            f"{shape} {op} M={rows}: default {default.value:.1f} us ({default.params['fraction_of_bandwidth']:.0%} of "
            f"bw), best {best.params['config']} (split {best.params['splits']}) "
            f"{best.params['speedup_vs_default']:.2f}x"
        )
    return parts


def check_gemv_tiles(dev, out: Results, cases=None, peak=None, clock=None, configs=CONFIGS, dtype=None):
    """`cases` (default plan()), `peak` (default measured here), `clock` (default roofline.timer, 5 + 25 ms a timing),
    `configs` and `dtype` (default bf16): what the tests change to run it on the CPU."""
    import torch

    from speechrt.bench.roofline import probe, timer

    peak = peak or probe(dev, torch.bfloat16)
    n0 = len(out.records)
    clock = clock or timer(dev, rep_ms=25, warmup_ms=5)
    bad = run_cases(dev, cases or plan(), out, clock, peak.bandwidth_gbps, configs, dtype or torch.bfloat16)
    parts = [f"copy {peak.bandwidth_gbps:.0f} GB/s"] + summary(out.records[n0:])
    return ("fail" if bad else "pass"), "; ".join(bad + parts)
