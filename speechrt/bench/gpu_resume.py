"""`bench gpu` after a check that lost the GPU context: the checks left run in a fresh process.

A kernel that reads or writes out of bounds on a GPU ends in a sticky error (CUDA's "illegal memory access"): the
process's context is unusable from then on, and every later check would fail with the same error, though nothing
is wrong with it. After a failed check, the run asks the device for one small computation; when that fails too,
the checks left run in a new `speechrt bench gpu` process (its own context) with what is left of the budget, writing
their own file beside the run's (so a session cut short keeps it), and their results join the run's.
"""

from __future__ import annotations

import subprocess
import sys
import traceback
from pathlib import Path

from speechrt.bench.record import Check, Results, load


def context_alive(dev) -> bool:
    """Whether `dev` still computes: always on the CPU; on a GPU one small kernel and a synchronize."""
    import torch

    if dev is None or dev.type != "cuda":
        return True
    try:
        x = torch.ones(8, device=dev) + 1
        torch.cuda.synchronize(dev)
        return float(x.sum()) == 16.0
    except Exception:  # the sticky error of an earlier kernel surfaces here
        return False


def failure(e: BaseException) -> str:
    """One line for a check that raised: the exception and where it was raised (the innermost frame); the whole
    traceback goes to stderr."""
    traceback.print_exception(type(e), e, e.__traceback__, file=sys.stderr)
    frames = traceback.extract_tb(e.__traceback__)
    where = f" (at {Path(frames[-1].filename).name}:{frames[-1].lineno} in {frames[-1].name})" if frames else ""
    return f"{type(e).__name__}: {e}{where}"


def child_argv(args, names: list[str], budget: float, json_path: Path) -> list[str]:
    """The `speechrt bench gpu` command line that runs `names` with the run's options, within `budget` seconds
    (at least 1: 0 would mean no limit)."""
    argv = [sys.executable, "-m", "speechrt", "bench", "gpu", "--checks", ",".join(names), "--json", str(json_path)]
    argv += ["--device", args.device, "--budget", f"{max(budget, 1.0) if args.budget else 0:g}"]
    argv += ["--server-levels", args.server_levels, "--server-budget", f"{args.server_budget:g}"]
    return argv + (["--quick"] if args.quick else [])


def resume(args, names: list[str], lost_in: str, budget_left: float, out: Results) -> None:
    """Run the checks `names` in a fresh process, after check `lost_in` left the GPU context unusable; their checks,
    records, skips and notes join `out`. A check the fresh process did not get to (it crashed) fails, saying how
    the process ended."""
    path = Path(args.json)
    child = path.with_name(f"{path.stem}-after-{lost_in}{path.suffix}")
    print(f"the GPU context is unusable after check {lost_in}: {', '.join(names)} run in a fresh process", flush=True)
    proc = subprocess.run(child_argv(args, names, budget_left, child))  # its output goes where the run's goes
    out.notes.append(
        f"check {lost_in} left the GPU context unusable (a small kernel failed after it): the checks after it ran in "
        f"a fresh process, results also in {child.name}"
    )
    got = load(child) if child.exists() else Results()
    out.extend(Results(records=got.records, skipped=got.skipped, checks=got.checks, notes=got.notes))
    ran = {c.name for c in got.checks}
    why = f"the fresh process ended with code {proc.returncode} before running it"
    out.checks += [Check(n, "fail", why) for n in names if n not in ran]
