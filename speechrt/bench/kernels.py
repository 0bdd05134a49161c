"""`speechrt bench kernels`: each Triton kernel at the models' shapes against torch eager and
torch.compile of its reference, on one GPU, in one process. Each case is first checked against the
reference on the device; times are medians of CUDA-event timings (triton.testing.do_bench). Results are
reported against the roofline measured in the same run: copy bandwidth (GB/s) for the memory-bound ops,
fp16 matmul throughput (TFLOP/s) for the matmul-like ones."""
from __future__ import annotations

import json
import math
from pathlib import Path


def add_arguments(p):
    p.add_argument("--ops", default=None, help="comma list of op names to run (default: all)")
    p.add_argument("--dtype", default="float16", choices=["float16", "bfloat16"])
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile column")
    p.add_argument("--json", default=None, help="also write the results (with the device name) to this file")


def _cases(dtype, device):
    """(name, op, args, kwargs, bytes moved, flops) at Whisper tiny / SmolLM2-135M shapes."""
    import torch

    g = torch.Generator(device=device).manual_seed(0)

    def r(*s, dt=dtype):
        return torch.randn(*s, generator=g, device=device, dtype=torch.float32).to(dt)

    e = torch.tensor([], dtype=dtype).element_size()
    cases = []
    x, res, w, b = r(1500, 384), r(1500, 384), r(384), r(384)
    cases.append(("layer_norm whisper 1500x384 +res", "layer_norm", (x, w, b, 1e-5), {"residual": res}, 4 * x.numel() * e, 0))
    x, res, w = r(128, 576), r(128, 576), r(576)
    cases.append(("rms_norm smollm2 128x576 +res", "rms_norm", (x, w, 1e-6), {"residual": res}, 4 * x.numel() * e, 0))
    x, b = r(1500, 1536), r(1536)
    cases.append(("gelu whisper 1500x1536 +bias", "gelu", (x, b), {}, 2 * x.numel() * e, 0))
    gt, up = r(128, 1536), r(128, 1536)
    cases.append(("silu_mul smollm2 128x1536", "silu_mul", (gt, up), {}, 3 * gt.numel() * e, 0))
    q, k = r(1, 9, 128, 64), r(1, 3, 128, 64)
    ang = torch.rand(1, 1, 128, 32, device=device)
    cases.append(("rotary smollm2 9/3 heads T=128", "rotary", (q, k, ang.cos(), ang.sin()), {},
                  2 * (q.numel() + k.numel()) * e + 2 * ang.numel() * 4, 0))
    for M, K, N, tag in ((1500, 384, 1536, "whisper enc"), (1, 576, 1536, "decode"), (1, 384, 51864, "whisper logits")):
        x, w, b = r(M, K), r(N, K), r(N)
        cases.append((f"linear {tag} {M}x{K}->{N}", "linear", (x, w, b), {}, (M * K + N * K + M * N) * e, 2 * M * N * K))
    for M, K, N in ((1, 576, 1536), (1, 1536, 576)):
        x = r(M, K)
        wq = torch.randint(-127, 128, (N, K), device=device, dtype=torch.int8)
        s = torch.rand(N, device=device, dtype=dtype) * 0.01
        cases.append((f"linear_int8 decode {M}x{K}->{N}", "linear_int8", (x, wq, s), {}, N * K + (M * K + M * N + N) * e, 2 * M * N * K))
    for B, H, Hkv, T, D, causal, tag in ((1, 6, 6, 1500, 64, False, "whisper encoder"),
                                         (1, 9, 3, 512, 64, True, "smollm2 prefill"),
                                         (1, 16, 16, 2048, 128, True, "prefill d128")):
        q, k, v = r(B, H, T, D), r(B, Hkv, T, D), r(B, Hkv, T, D)
        flops = 4 * B * H * T * T * D * (0.5 if causal else 1.0)
        cases.append((f"attention {tag} {H}/{Hkv}x{T} d{D}", "attention", (q, k, v), {"causal": causal},
                      (2 * q.numel() + k.numel() + v.numel()) * e, flops))
    B, H, Hkv, Tmax, D = 8, 9, 3, 2048, 64
    q, kc, vc = r(B, H, 1, D), r(B, Hkv, Tmax, D), r(B, Hkv, Tmax, D)
    lengths = torch.randint(1, Tmax + 1, (B,), device=device, generator=g)
    used = int(lengths.sum()) * Hkv * D * 2 * e
    cases.append((f"attention decode B={B} 9/3 cache {Tmax} d64", "attention", (q, kc, vc),
                  {"causal": True, "lengths": lengths}, used + 2 * q.numel() * e, 4 * int(lengths.sum()) * H * D))
    return cases


def run(args):
    import torch

    from speechrt.errors import UserError

    if not torch.cuda.is_available():
        raise UserError("`speechrt bench kernels` times the Triton kernels on a CUDA or ROCm GPU, and none is "
                        f"visible to PyTorch here (torch {torch.__version__}). Without a GPU, "
                        "`speechrt kernels report` compiles them for sm_80/sm_90/gfx90a/gfx942 instead.")
    try:
        from triton.testing import do_bench
    except ImportError:
        raise UserError("`speechrt bench kernels` needs Triton: pip install 'speechrt[triton]'") from None
    from speechrt import kernels

    device = torch.device("cuda")
    dtype = getattr(torch, args.dtype)
    tri, ref = kernels.select("triton", device), kernels.select("torch", device)
    name = torch.cuda.get_device_name(device)
    print(f"device: {name}; torch {torch.__version__}; dtype {args.dtype}")

    buf = torch.empty(1 << 28, dtype=torch.float32, device=device)  # 1 GiB
    dst = torch.empty_like(buf)
    t = do_bench(lambda: dst.copy_(buf)) * 1e-3
    bw = 2 * buf.numel() * 4 / t / 1e9
    a = torch.randn(8192, 8192, device=device, dtype=dtype)
    t = do_bench(lambda: a @ a) * 1e-3
    tflops = 2 * 8192 ** 3 / t / 1e12
    del buf, dst, a
    print(f"measured roofline: copy {bw:.0f} GB/s, {args.dtype} matmul {tflops:.0f} TFLOP/s\n")

    wanted = set(args.ops.split(",")) if args.ops else None
    rows = []
    head = f"{'case':44} {'max err':>8} {'triton us':>10} {'eager us':>9} {'compile us':>10} {'achieved':>16} {'of peak':>7}"
    print(head)
    for label, op, a_, kw, nbytes, flops in _cases(dtype, device):
        if wanted and op not in wanted:
            continue
        out, exp = getattr(tri, op)(*a_, **kw), getattr(ref, op)(*a_, **kw)
        out = out[0] if isinstance(out, tuple) else out
        exp = exp[0] if isinstance(exp, tuple) else exp
        err = (out.float() - exp.float()).abs().max().item()
        if not math.isfinite(err):
            err = float("inf")
        t_tri = do_bench(lambda: getattr(tri, op)(*a_, **kw)) * 1e3
        t_eager = do_bench(lambda: getattr(ref, op)(*a_, **kw)) * 1e3
        t_comp = None
        if not args.no_compile:
            f = torch.compile(getattr(ref, op), dynamic=False)
            try:
                f(*a_, **kw)
                t_comp = do_bench(lambda: f(*a_, **kw)) * 1e3
            except Exception as e:  # report, do not abort the table
                print(f"  (torch.compile failed for {label}: {type(e).__name__})")
        if flops and flops / max(nbytes, 1) > 50:  # compute-bound: compare with matmul throughput
            ach, frac = f"{flops / t_tri / 1e6:.1f} TFLOP/s", flops / t_tri / 1e6 / tflops
        else:
            ach, frac = f"{nbytes / t_tri / 1e3:.0f} GB/s", nbytes / t_tri / 1e3 / bw
        comp = f"{t_comp:10.1f}" if t_comp is not None else f"{'-':>10}"
        print(f"{label:44} {err:8.1e} {t_tri:10.1f} {t_eager:9.1f} {comp} {ach:>16} {100 * frac:6.0f}%")
        rows.append({"case": label, "op": op, "max_abs_err": err, "triton_us": t_tri, "eager_us": t_eager,
                     "compile_us": t_comp, "bytes": nbytes, "flops": flops, "achieved": ach, "of_peak": frac})
    if args.json:
        Path(args.json).write_text(json.dumps({"device": name, "torch": torch.__version__, "dtype": args.dtype,
                                               "copy_GBps": bw, "matmul_TFLOPs": tflops, "results": rows}, indent=2))
    return 0
