"""`speechrt kernels report`: compile every Triton kernel ahead of time, at the models' shapes, for
NVIDIA (sm_80, sm_90) and AMD (gfx90a, gfx942) targets — no GPU needed — and print per kernel and
target whether it compiled, its registers, spills and shared memory, and whether the matmul-like
kernels use the matrix instructions (mma/wgmma in PTX, v_mfma in AMDGCN)."""

from __future__ import annotations

import json
from dataclasses import asdict

from speechrt.cli_paths import output_file


def add_arguments(p):
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    r = sub.add_parser("report", help="compile every kernel for GPU targets and report resources", description=__doc__)
    r.add_argument(
        "--targets",
        default="sm_80,sm_90,gfx90a,gfx942",
        help="comma list of targets: sm_NN (NVIDIA) or gfxNNN (AMD) (default: %(default)s)",
    )
    r.add_argument("--kernels", default=None, help="only kernels whose name contains one of these (comma list)")
    r.add_argument(
        "--json", default=None, type=output_file("--json", "kernels.json"), help="also write the rows to this JSON file"
    )


def run(args):
    import os

    from speechrt.errors import UserError

    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton 3.9 warns when unset; 1 is its default
    try:
        import triton  # noqa: F401
    except ImportError:
        raise UserError("the kernel report needs Triton: pip install 'speechrt[triton]'") from None
    from speechrt.kernels import aot

    targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    for t in targets:
        try:
            aot.gpu_target(t)
        except ValueError as e:
            raise UserError(str(e)) from None
    names = [k.strip() for k in args.kernels.split(",")] if args.kernels else None
    rows = aot.report(targets, names)
    if not rows:
        raise UserError(f"no kernel matches {args.kernels!r}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump([asdict(r) for r in rows], f, indent=1)
    print(aot.format_table(rows))
    bad = [(r, p) for r in rows for p in aot.problems(r)]
    variants = len({(r.kernel, r.variant) for r in rows})
    print(
        f"\n{len(rows)} compiles ({variants} kernel variants x {len(targets)} targets): "
        + (
            "all compiled, no spills, matrix instructions in every matmul-like kernel"
            if not bad
            else f"{len(bad)} problem(s): " + "; ".join(f"{r.kernel} [{r.variant}] {r.target}: {p}" for r, p in bad)
        )
    )
    return 1 if bad else 0
