"""`speechrt bench compare base.json new.json --max-regression 10%`: a speed gate for CI and users.

Rows are matched by what was measured (family, model, engine/backend/precision, device, workload,
metric). Noise-aware: a row regressed when both its median repeat and its best repeat (the fastest time,
the highest throughput: the run least disturbed by other work) got worse by more than the threshold. A
few disturbed repeats move the median but not the best, one lucky repeat the best but not the median:
neither is a regression. A row measured once is judged on its value. Rows without a direction (word
error rates, counts) are never a regression.

--relative-to-peer compares each of our rows' ratio to the peer measured in the same run instead (medians
over medians, bests over bests), which cancels what load or a different machine does to both: for two
runs on different or shared machines. Not round by round, though bench tts keeps its rounds: a burst of
load falls on one engine's run of a round and not the other's, and the spread of the rounds' ratios came
out wider than the ratio of the bests (16 rounds on a 2-core AMD EPYC Zen 4 with one core loaded on and
off: the torch row's round ratios moved 16 % at the median and 40 % at the best between the even and the
odd rounds, the medians' and bests' ratios 1 % and 20 %).

Exit status: 0 when nothing regressed, 1 naming every row that did, 2 on a usage error.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from speechrt.bench.record import Record, Repeats, Results, load


def add_arguments(p):
    p.add_argument("base", help="result file of the baseline run (speechrt bench ... --json)")
    p.add_argument("new", help="result file of the run to judge")
    p.add_argument("--max-regression", default="10%", help="how much worse a row may get: 10%% or 0.1 (default 10%%)")
    p.add_argument("--families", default=None, help="only these families (comma list)")
    p.add_argument(
        "--relative-to-peer",
        action="store_true",
        help="compare our rows' ratios to their peers (measured in the same run) instead of raw values",
    )
    p.add_argument(
        "--fail-on-missing", action="store_true", help="also fail when a base row is missing from the new run"
    )


def parse_threshold(text: str) -> float:
    """'10%' -> 0.10; '0.1' -> 0.10; '10' (no %, >= 1) -> 0.10."""
    from speechrt.errors import UserError

    t = str(text).strip()
    try:
        v = float(t.rstrip("%"))
    except ValueError:
        raise UserError(f"--max-regression must be a percentage (10%) or a fraction (0.1), got {text!r}") from None
    v = v / 100 if t.endswith("%") or v >= 1 else v
    if not 0 <= v < 10:
        raise UserError(f"--max-regression must be between 0% and 1000%, got {text!r}")
    return v


def worsening(base: float, new: float, better: str) -> float:
    """How much worse `new` is than `base`, as a fraction (0.2: 20 % slower); negative when better."""
    if better == "lower":
        return new / base - 1 if base > 0 else 0.0
    return base / new - 1 if new > 0 else float("inf")


def typical_and_best(r: Record) -> tuple[float, float]:
    """(median, best) of a row's repeats; its value twice when it was measured once."""
    if r.repeats is None or r.repeats.n < 2:
        return r.value, r.value
    return r.repeats.median, r.repeats.min if r.better == "lower" else r.repeats.max


@dataclass(frozen=True)
class Change:
    base: Record
    new: Record
    worse_by: float  # of the medians, as a fraction; negative when better
    best_worse_by: float  # of the best repeats
    regression: bool

    def describe(self) -> str:
        b, n = self.base, self.new

        def spread(r: Record) -> str:
            return f" [{r.repeats.min:.4g}..{r.repeats.max:.4g}]" if r.repeats else ""

        word = "worse" if self.worse_by > 0 else "better"
        return (
            f"{b.family} | {b.label} on {b.device} | {b.workload} | {b.metric}: {b.value:.4g}{spread(b)} -> "
            f"{n.value:.4g}{spread(n)} {b.unit} (median {abs(self.worse_by) * 100:.1f}% {word}, best "
            f"{self.best_worse_by * 100:+.1f}%)"
        )


def relative(results: Results) -> Results:
    """Our rows as ratios to their peers: value ours/peer, spread ours' range over the peer's."""
    out = Results(machine=results.machine, source=results.source)
    for r in results.records:
        p = results.peer_of(r)
        if p is None or p.value == 0:
            continue
        rep = None
        if r.repeats and p.repeats and r.repeats.n > 1 and p.repeats.n > 1 and p.repeats.min > 0:
            med = r.repeats.median / p.repeats.median
            # the ratio of the bests: mins over mins for times (a), maxes over maxes for throughputs (b)
            a, b = r.repeats.min / p.repeats.min, r.repeats.max / p.repeats.max
            n = min(r.repeats.n, p.repeats.n)
            rep = Repeats(n, a, med, max(a, med, b)) if r.better == "lower" else Repeats(n, min(a, med, b), med, b)
        out.records.append(
            dataclasses.replace(r, metric=f"{r.metric} / {r.peer}", unit="x", value=r.value / p.value, repeats=rep)
        )
    return out


def compare(base: Results, new: Results, threshold: float, families=None) -> tuple[list[Change], list[Record]]:
    """-> (changes of the rows in both runs that have a direction, base rows missing from the new run)"""
    new_by = {r.key: r for r in new.records}
    changes, missing = [], []
    for b in base.records:
        if b.better == "" or (families and b.family not in families):
            continue
        n = new_by.get(b.key)
        if n is None:
            missing.append(b)
            continue
        (bm, bb), (nm, nb) = typical_and_best(b), typical_and_best(n)
        w, wb = worsening(bm, nm, b.better), worsening(bb, nb, b.better)
        changes.append(Change(b, n, w, wb, w > threshold and wb > threshold))
    return changes, missing


def run(args):
    threshold = parse_threshold(args.max_regression)
    base, new = load(args.base), load(args.new)
    if args.relative_to_peer:
        base, new = relative(base), relative(new)
    families = {f.strip() for f in args.families.split(",")} if args.families else None
    bl, nl = base.machine.get("label"), new.machine.get("label")
    print(
        f"base: {args.base} ({bl}); new: {args.new} ({nl}); threshold {threshold * 100:.1f}%"
        + (", ratios to the peers of each run" if args.relative_to_peer else "")
    )
    if bl != nl and not args.relative_to_peer:
        print(f"note: different machines ({bl} vs {nl}); --relative-to-peer compares ratios to each run's peers")
    changes, missing = compare(base, new, threshold, families)
    regressions = [c for c in changes if c.regression]
    noisy = [c for c in changes if not c.regression and c.worse_by > threshold]
    print(
        f"{len(changes)} rows compared: {len(regressions)} regressed, {len(noisy)} with a median worse beyond the "
        f"threshold but not the best repeat (noise), {len(missing)} missing from the new run"
    )
    for c in noisy:
        print(f"  noise: {c.describe()}")
    for r in missing:
        print(f"  missing: {r.family} | {r.label} on {r.device} | {r.workload} | {r.metric}")
    for c in sorted(regressions, key=lambda c: -c.worse_by):
        print(f"  REGRESSION: {c.describe()}")
    if regressions or (args.fail_on_missing and missing):
        return 1
    print("no regression beyond the threshold")
    return 0
