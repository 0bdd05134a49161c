"""`speechrt bench kernels`: each Triton kernel at the models' shapes against torch eager and
torch.compile of its reference, on one GPU, in one process. Each case is first checked against the
reference on the device; times are medians of CUDA-event timings (triton.testing.do_bench). Results are
reported against the roofline measured in the same run: copy bandwidth (GB/s) for the memory-bound ops,
fp16 matmul throughput (TFLOP/s) for the matmul-like ones."""

from __future__ import annotations

import math

from speechrt.cli_paths import output_file


def add_arguments(p):
    p.add_argument("--ops", default=None, help="comma list of op names to run (default: all)")
    p.add_argument(
        "--device",
        default="cuda",
        help="cuda (default): the Triton kernels against torch eager and "
        "torch.compile; cpu: the torch reference kernels against the CPU's measured roofline",
    )
    p.add_argument(
        "--dtype",
        default=None,
        choices=["float16", "bfloat16", "float32"],
        help="default: float16 on GPUs, float32 on the CPU",
    )
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile column")
    p.add_argument("--threads", type=int, default=None, help="CPU threads (--device cpu; default: all cores)")
    p.add_argument(
        "--json",
        default=None,
        type=output_file("--json", "results.json"),
        help="also write the results (speechrt.bench.record schema) to this file",
    )


def cases(dtype, device):
    """(name, op, args, kwargs, bytes moved, flops) at Whisper tiny / SmolLM2-135M shapes."""
    import torch

    g = torch.Generator(device=device).manual_seed(0)

    def r(*s, dt=dtype):
        return torch.randn(*s, generator=g, device=device, dtype=torch.float32).to(dt)

    e = torch.tensor([], dtype=dtype).element_size()
    cases = []
    x, res, w, b = r(1500, 384), r(1500, 384), r(384), r(384)
    cases.append(
        ("layer_norm whisper 1500x384 +res", "layer_norm", (x, w, b, 1e-5), {"residual": res}, 4 * x.numel() * e, 0)
    )
    x, res, w = r(128, 576), r(128, 576), r(576)
    cases.append(("rms_norm smollm2 128x576 +res", "rms_norm", (x, w, 1e-6), {"residual": res}, 4 * x.numel() * e, 0))
    x, b = r(1500, 1536), r(1536)
    cases.append(("gelu whisper 1500x1536 +bias", "gelu", (x, b), {}, 2 * x.numel() * e, 0))
    gt, up = r(128, 1536), r(128, 1536)
    cases.append(("silu_mul smollm2 128x1536", "silu_mul", (gt, up), {}, 3 * gt.numel() * e, 0))
    q, k = r(1, 9, 128, 64), r(1, 3, 128, 64)
    ang = torch.rand(1, 1, 128, 32, device=device)
    cases.append(
        (
            "rotary smollm2 9/3 heads T=128",
            "rotary",
            (q, k, ang.cos(), ang.sin()),
            {},
            2 * (q.numel() + k.numel()) * e + 2 * ang.numel() * 4,
            0,
        )
    )
    for M, K, N, tag in ((1500, 384, 1536, "whisper enc"), (1, 576, 1536, "decode"), (1, 384, 51864, "whisper logits")):
        x, w, b = r(M, K), r(N, K), r(N)
        cases.append(
            (f"linear {tag} {M}x{K}->{N}", "linear", (x, w, b), {}, (M * K + N * K + M * N) * e, 2 * M * N * K)
        )
    for M, K, N in ((1, 576, 1536), (1, 1536, 576)):
        x = r(M, K)
        wq = torch.randint(-127, 128, (N, K), device=device, dtype=torch.int8)
        s = torch.rand(N, device=device, dtype=dtype) * 0.01
        cases.append(
            (
                f"linear_int8 decode {M}x{K}->{N}",
                "linear_int8",
                (x, wq, s),
                {},
                N * K + (M * K + M * N + N) * e,
                2 * M * N * K,
            )
        )
    for B, H, Hkv, T, D, causal, tag in (
        (1, 6, 6, 1500, 64, False, "whisper encoder"),
        (1, 9, 3, 512, 64, True, "smollm2 prefill"),
        (1, 16, 16, 2048, 128, True, "prefill d128"),
    ):
        q, k, v = r(B, H, T, D), r(B, Hkv, T, D), r(B, Hkv, T, D)
        flops = 4 * B * H * T * T * D * (0.5 if causal else 1.0)
        cases.append(
            (
                f"attention {tag} {H}/{Hkv}x{T} d{D}",
                "attention",
                (q, k, v),
                {"causal": causal},
                (2 * q.numel() + k.numel() + v.numel()) * e,
                flops,
            )
        )
    B, H, Hkv, Tmax, D = 8, 9, 3, 2048, 64
    q, kc, vc = r(B, H, 1, D), r(B, Hkv, Tmax, D), r(B, Hkv, Tmax, D)
    lengths = torch.randint(1, Tmax + 1, (B,), device=device, generator=g)
    used = int(lengths.sum()) * Hkv * D * 2 * e
    cases.append(
        (
            f"attention decode B={B} 9/3 cache {Tmax} d64",
            "attention",
            (q, kc, vc),
            {"causal": True, "lengths": lengths},
            used + 2 * q.numel() * e,
            4 * int(lengths.sum()) * H * D,
        )
    )
    return cases


def _measure(label, op, call_args, kw, impls, ref, timer, compile_):
    """One case: error of each non-reference kernel set against the reference, and every impl's run
    times (seconds); torch.compile of the reference too when asked."""
    import torch

    exp = getattr(ref, op)(*call_args, **kw)
    exp = exp[0] if isinstance(exp, tuple) else exp
    times, errs = {}, {}
    for name, ks in impls.items():
        f = getattr(ks, op)
        if ks is not ref:
            out = f(*call_args, **kw)
            out = out[0] if isinstance(out, tuple) else out
            err = (out.float() - exp.float()).abs().max().item()
            errs[name] = err if math.isfinite(err) else float("inf")
        times[name] = timer(lambda f=f: f(*call_args, **kw))
    if compile_:
        f = torch.compile(getattr(ref, op), dynamic=False)
        try:
            f(*call_args, **kw)
            times["torch.compile"] = timer(lambda: f(*call_args, **kw))
        except Exception as e:  # report, do not abort the table
            print(f"  (torch.compile failed for {label}: {type(e).__name__})")
    return times, errs


def run(args):
    import statistics

    import torch

    from speechrt.bench import roofline
    from speechrt.bench.record import Record, Repeats, Results
    from speechrt.errors import UserError

    device = torch.device(args.device)
    gpu = device.type == "cuda"
    if device.type not in ("cuda", "cpu"):
        raise UserError(f"--device must be cuda or cpu, got {args.device!r}")
    if gpu and not torch.cuda.is_available():
        raise UserError(
            "`speechrt bench kernels` times the Triton kernels on a CUDA or ROCm GPU, and none is "
            f"visible to PyTorch here (torch {torch.__version__}). Without a GPU, "
            "`speechrt kernels report` compiles them for sm_80/sm_90/gfx90a/gfx942 instead, and "
            "`speechrt bench kernels --device cpu` times the torch reference against the CPU's roofline."
        )
    if gpu:
        try:
            import triton  # noqa: F401
        except ImportError:
            raise UserError("`speechrt bench kernels` needs Triton: pip install 'speechrt[triton]'") from None
    from speechrt import kernels

    if not gpu and args.threads:
        torch.set_num_threads(args.threads)
    dtype_name = args.dtype or ("float16" if gpu else "float32")
    dtype = getattr(torch, dtype_name)
    ref = kernels.select("torch", device)
    # on the CPU only the reference runs: Triton kernels there are an interpreter (correctness, not speed),
    # and torch.compile would spend minutes compiling C++ per op
    impls = {"triton": kernels.select("triton", device), "torch": ref} if gpu else {"torch": ref}
    compile_ = gpu and not args.no_compile
    name = torch.cuda.get_device_name(device) if gpu else "CPU"
    print(
        f"device: {name}; torch {torch.__version__}; dtype {dtype_name}"
        + ("" if gpu else f"; threads {torch.get_num_threads()}")
    )
    peak = roofline.probe(device, dtype)
    ridge = peak.matmul_tflops * 1e12 / (peak.bandwidth_gbps * 1e9)  # FLOP/byte where the roofs meet
    print(
        f"measured roofline: copy {peak.bandwidth_gbps:.0f} GB/s, {dtype_name} matmul {peak.matmul_tflops:.2f} "
        f"TFLOP/s (ridge at {ridge:.0f} FLOP/byte)\n"
    )
    timer = roofline.timer(device)

    wanted = set(args.ops.split(",")) if args.ops else None
    out = Results()
    dev = str(device)
    probe = dict(
        family="kernels",
        model="-",
        engine="probe",
        backend="torch",
        precision=dtype_name,
        device=dev,
        workload="roofline probe",
        better="higher",
        params={"gpu": name},
    )
    out.records += [
        Record(metric="copy_GBps", unit="GB/s", value=peak.bandwidth_gbps, **probe),
        Record(metric="matmul_TFLOPs", unit="TFLOP/s", value=peak.matmul_tflops, **probe),
    ]
    print(f"{'case':44} {'impl':14} {'max err':>8} {'time us':>10} {'achieved':>16} {'of roof':>7}")
    for label, op, a_, kw, nbytes, flops in cases(dtype, device):
        if wanted and op not in wanted:
            continue
        times, errs = _measure(label, op, a_, kw, impls, ref, timer, compile_)
        roof = min(peak.matmul_tflops * 1e12, flops / max(nbytes, 1) * peak.bandwidth_gbps * 1e9) if flops else None
        for impl, ts in times.items():
            t = statistics.median(ts)
            if flops and flops / max(nbytes, 1) > ridge:
                ach, frac = f"{flops / t / 1e12:.2f} TFLOP/s", flops / t / roof
            else:
                ach, frac = f"{nbytes / t / 1e9:.1f} GB/s", nbytes / t / 1e9 / peak.bandwidth_gbps
            err = f"{errs[impl]:8.1e}" if impl in errs else f"{'-':>8}"
            print(f"{label:44} {impl:14} {err} {t * 1e6:10.1f} {ach:>16} {100 * frac:6.0f}%")
            engine, backend = ("torch.compile", "inductor") if impl == "torch.compile" else ("speechrt", impl)
            peer = (
                "torch.compile " + dtype_name
                if impl == "triton" and "torch.compile" in times
                else (f"speechrt torch {dtype_name}" if impl == "triton" else "")
            )
            common = dict(
                family="kernels",
                model=op,
                engine=engine,
                backend=backend,
                precision=dtype_name,
                device=dev,
                workload=label,
                peer=peer,
                params={"op": op, "bytes": nbytes, "flops": flops, "max_abs_err": errs.get(impl)},
            )
            out.records += [
                Record(
                    metric="time_us",
                    unit="us",
                    value=t * 1e6,
                    better="lower",
                    repeats=Repeats.of(x * 1e6 for x in ts),
                    **common,
                ),
                Record(metric="roof_fraction", unit="", value=frac, better="higher", **common),
            ]
    if args.json:
        out.write(args.json)
    return 0
