"""`bench gpu`'s server check (server-ramp): the streaming server's load ramp on the GPU within a time budget —
`bench server` with its streams sent from several client processes, its records in the same result file.

Sized for a lent GPU's 15 minutes of device time, the whole `bench gpu` run together: the levels (1 for the WER of
the utterances alone, then 64, 128, 256, 512, 1024, 2048) speak two utterances a stream (~20 s a level), a stream
waits at most 10 s for a final before it counts as lost (an overloaded level ends in seconds, not minutes), the
ramp stops at the first level that misses p95 final <= 1 s, and no level starts past --server-budget (default 360 s
of levels; add the server's start, ~1-2 min with its warm-up of every batch size). `--device cpu` runs the same
check on the CPU (with small --server-levels): everything but CUDA and NVML, as CI cannot."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

LEVELS = "1,64,128,256,512,1024,2048"
BUDGET_S = 360.0
FINAL_WAIT_S = 10.0


def add_arguments(p) -> None:
    p.add_argument(
        "--server-levels",
        default=LEVELS,
        help="server-ramp: the stream levels, in order, stopping at the first that misses p95 final <= 1 s "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--server-budget",
        type=float,
        default=BUDGET_S,
        metavar="SECONDS",
        help="server-ramp: start no level past this many seconds of the ramp (default: %(default)s)",
    )


def server_args(args, json_path: Path) -> argparse.Namespace:
    """`bench server`'s options for the ramp on args.device."""
    from speechrt.bench import server

    p = argparse.ArgumentParser()
    server.add_arguments(p)
    return p.parse_args(
        [
            "--device",
            args.device,
            "--backend",
            "auto",
            "--peer",
            "none",
            "--streams",
            args.server_levels,
            "--utterances",
            "2",
            "--final-wait",
            str(FINAL_WAIT_S),
            "--time-budget",
            str(args.server_budget),
            "--json",
            str(json_path),
        ]
    )


def check_server_ramp(args, out) -> tuple[str, str]:
    """Run the ramp; its records, skips and notes go into `out` -> (status, what it found)."""
    from speechrt.bench import server
    from speechrt.bench.record import load

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "server.json"
        server.run(server_args(args, path))
        res = load(path)
    out.records += res.records
    out.skipped += res.skipped
    out.notes += res.notes
    if args.device.startswith("cuda"):
        import torch

        out.notes.append(f"server-ramp on {torch.cuda.get_device_name(torch.device(args.device))} ({args.device})")
    by = {(r.params.get("streams"), r.metric): r.value for r in res.records if "worker" not in r.params}
    ran = sorted({n for n, _ in by if n is not None})
    best = next((r.value for r in res.records if r.metric == "max_streams_p95_final_le_1s"), 0)
    meets = next((r.value for r in res.records if r.metric == "max_streams_meeting_targets"), 0)

    def load_at(n) -> str:
        gpu = by.get((n, "gpu_busy_fraction"))
        gpu = "none" if gpu is None else f"{gpu:.0%}"
        return (
            f"GPU busy {gpu}, engine busy {by.get((n, 'engine_busy_fraction'), 0):.0%}, "
            f"server {by.get((n, 'server_cpu_cores'), 0):.2f} cores, host {by.get((n, 'host_cpu_cores'), 0):.2f} "
            f"cores, busiest client process "
            f"{by.get((n, 'client_cpu_busiest_fraction'), 0):.0%} of a core"
        )

    detail = f"levels run {','.join(map(str, ran))}; p95 final <= 1 s to {best:g} streams"
    if best:
        detail += f" ({load_at(int(best))})"
    detail += f"; every target to {meets:g}"
    if ran and ran[-1] != best:
        detail += f"; at {ran[-1]}: {load_at(ran[-1])}"
    detail += "".join(f"; {s.what}: {s.reason}" for s in res.skipped)
    return "pass", detail
